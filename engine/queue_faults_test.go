package engine_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestCommitFromDone: a done may call Commit, even while the notifier is
// far behind the writer (70 groups written meanwhile): the writer never
// waits for the notifier, so the Commit returns.
func TestCommitFromDone(t *testing.T) {
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}})
	ctx := context.Background()
	a := claimNew(t, e, "a")
	b := claimNew(t, e, "b")
	inDone, goOn := make(chan struct{}), make(chan struct{})
	result := make(chan error, 1)
	e.CommitAsync(ctx, a, func(err error) {
		close(inDone)
		<-goOn // the done is busy (acking a message, say) while others commit
		result <- e.Commit(ctx, b)
	})
	<-inDone
	// Other goroutines commit meanwhile: 70 synchronous commits, each its
	// own group.
	others := make(chan int, 1)
	go func() {
		n := 0
		defer func() { others <- n }()
		for i := range 70 {
			c := claimNew(t, e, fmt.Sprint("o", i))
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err := e.Commit(cctx, c)
			cancel()
			if err != nil {
				return
			}
			n++
		}
	}()
	time.Sleep(500 * time.Millisecond)
	close(goOn)
	select {
	case err := <-result:
		if err != nil {
			t.Fatalf("Commit inside done: %v", err)
		}
	case <-time.After(hangWait()):
		n := 0
		select {
		case n = <-others:
		default:
			n = -1
		}
		t.Fatalf("Commit called from a done has not returned after 5 s (other goroutine's sync commits done: %d, -1 = still blocked): the engine is deadlocked", n)
	}
	e.Close()
}

// TestCloseKeepsDoneOrder: calls made while Close is writing earlier
// commits are refused with ErrClosed, and their dones still run after the
// dones of the earlier commits from the same goroutine.
func TestCloseKeepsDoneOrder(t *testing.T) {
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
	ctx := context.Background()
	first := claimNew(t, e, "first")
	var mu sync.Mutex
	var order []string
	note := func(s string) func(error) {
		return func(err error) { mu.Lock(); order = append(order, fmt.Sprintf("%s:%v", s, err)); mu.Unlock() }
	}
	gate.Shut()
	e.CommitAsync(ctx, first, note("first"))
	waitWriterInSync(t, gate, e, "first's write to wait in its sync")
	closed := make(chan error, 1)
	go func() { closed <- e.Close() }()
	waitFor(t, "Close to refuse new commits", func() bool {
		short, cancel := context.WithTimeout(ctx, time.Millisecond)
		defer cancel()
		return errors.Is(e.Flush(short), engine.ErrClosed)
	})
	e.CommitAsync(ctx, engine.Claim{Outcome: engine.New}, note("later"))
	mu.Lock()
	early := fmt.Sprint(order)
	mu.Unlock()
	gate.Open()
	<-closed
	if early != "[]" {
		t.Fatalf("dones %s ran while the first commit was not yet durable", early)
	}
	if want := "[first:<nil> later:" + engine.ErrClosed.Error() + "]"; fmt.Sprint(order) != want {
		t.Fatalf("dones %v, want %s", order, want)
	}
}

// TestGroupDeadlineIsEachCallers: on Redis, a caller with no deadline
// whose commit shares a write with a caller holding a short deadline
// succeeds once the slow server answers: one caller's deadline does not
// fail the others.
func TestGroupDeadlineIsEachCallers(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	e := open(t, engine.Options{Backend: redisBackend(c, "q11dl:")})
	defer e.Close()
	ctx := context.Background()
	short := claimNew(t, e, "short")
	patient := claimNew(t, e, "patient")
	res := make(chan string, 2)
	release := engine.HoldCommits()
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	e.CommitAsync(sctx, short, func(err error) { res <- fmt.Sprint("short:", err) })
	e.CommitAsync(ctx, patient, func(err error) { res <- fmt.Sprint("patient:", err) })
	srv.Pause() // a slow server: answers after 500 ms
	release()
	time.Sleep(500 * time.Millisecond)
	srv.Resume()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	close(res)
	var got []string
	for r := range res {
		got = append(got, r)
	}
	t.Logf("dones: %v", got)
	if len(got) != 2 || got[1] != "patient:<nil>" {
		t.Fatalf("the caller with no deadline got %q: failed by another caller's 200 ms deadline", got[1])
	}
}

// TestSyncCommitKeepsItsDeadline: a synchronous Commit with a 100 ms
// deadline, queued behind another caller's slow write to Redis, returns at
// its own deadline (its commit's outcome is then unknown).
func TestSyncCommitKeepsItsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	e := open(t, engine.Options{Backend: redisBackend(c, "q11sync:")})
	defer e.Close()
	ctx := context.Background()
	slow := claimNew(t, e, "slow")
	mine := claimNew(t, e, "mine")
	srv.Pause()
	lctx, lcancel := context.WithTimeout(ctx, 3*time.Second)
	defer lcancel()
	e.CommitAsync(lctx, slow, func(error) {}) // another caller, a long deadline
	time.Sleep(50 * time.Millisecond)         // its group is being written
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	began := time.Now()
	err := e.Commit(cctx, mine)
	took := time.Since(began)
	srv.Resume()
	t.Logf("Commit with a 100 ms deadline returned after %v: %v", took, err)
	if took > time.Second {
		t.Fatalf("Commit with a 100 ms deadline returned after %v (%v)", took, err)
	}
}

// TestSameClaimTwiceInOneGroup: the same claim committed by two calls
// pending together must act as when they are written one after the other.
func TestSameClaimTwiceInOneGroup(t *testing.T) {
	run := func(grouped bool) string {
		e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}})
		defer e.Close()
		ctx := context.Background()
		c := claimNew(t, e, "k")
		res := make(chan string, 3)
		var release func()
		if grouped {
			release = engine.HoldCommits()
		}
		e.CommitAsync(ctx, c, func(err error) { res <- fmt.Sprint(errors.Is(err, engine.ErrLeaseLost), err == nil) })
		if !grouped {
			e.Flush(ctx)
		}
		e.CommitAsync(ctx, c, func(err error) { res <- fmt.Sprint(errors.Is(err, engine.ErrLeaseLost), err == nil) })
		if !grouped {
			e.Flush(ctx)
		}
		e.CommitBatchAsync(ctx, []engine.Claim{c, c}, nil, func(err error) { res <- fmt.Sprint(errors.Is(err, engine.ErrLeaseLost), err == nil) })
		if release != nil {
			release()
		}
		e.Flush(ctx)
		close(res)
		var got []string
		for r := range res {
			got = append(got, r)
		}
		o, err := e.MarkIfAbsent(ctx, []byte("k"))
		return fmt.Sprint(got, o, err)
	}
	seq, grp := run(false), run(true)
	t.Logf("sequential %s; grouped %s", seq, grp)
	if seq != grp {
		t.Fatalf("same claim twice: one after the other %s, in one group %s", seq, grp)
	}
}

// TestCommitAsyncZeroAndForeignClaims: typed errors, no panic.
func TestCommitAsyncZeroAndForeignClaims(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}})
	defer e.Close()
	other := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db2", FS: vfs.NewMem()}})
	defer other.Close()
	foreign := claimNew(t, other, "k")
	mine := claimNew(t, e, "k")
	var errs []error
	var mu sync.Mutex
	rec := func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
	e.CommitAsync(ctx, engine.Claim{}, rec)
	e.CommitAsync(ctx, engine.Claim{Outcome: engine.New}, rec)
	e.CommitAsync(ctx, foreign, rec)
	e.CommitAsync(ctx, engine.Claim{Outcome: engine.New, Key: []byte("k")}, rec)
	e.CommitBatchAsync(ctx, nil, nil, rec)
	e.CommitAsync(ctx, mine, nil) // nil done
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("%v", errs)
	if !errors.Is(errs[0], engine.ErrNotClaimed) || !errors.Is(errs[1], engine.ErrLeaseLost) || !errors.Is(errs[2], engine.ErrLeaseLost) || !errors.Is(errs[3], engine.ErrLeaseLost) || errs[4] != nil {
		t.Fatalf("errors %v", errs)
	}
	if o, _ := other.MarkIfAbsent(ctx, []byte("k")); o != engine.InFlight {
		t.Fatalf("the foreign claim's key in its own engine: %v", o)
	}
}

// TestCloseRacesCommits: Close racing CommitAsync and Commit from several
// goroutines: every done runs exactly once; everything acknowledged is a
// Duplicate after reopening.
func TestCloseRacesCommits(t *testing.T) {
	for round := range 5 {
		fs := vfs.NewMem()
		e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, CommitQueue: 8})
		ctx := context.Background()
		var acked sync.Map
		var runs sync.Map
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for w := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					key := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					c, err := e.Claim(ctx, []byte(key))
					if err != nil {
						return
					}
					if w%2 == 0 {
						var n atomic.Int32
						runs.Store(key, &n)
						e.CommitAsync(ctx, c, func(err error) {
							n.Add(1)
							if err == nil {
								acked.Store(key, true)
							}
						})
					} else if err := e.Commit(ctx, c); err == nil {
						acked.Store(key, true)
					}
				}
			})
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		close(stop)
		wg.Wait()
		time.Sleep(10 * time.Millisecond)
		runs.Range(func(k, v any) bool {
			if n := v.(*atomic.Int32).Load(); n != 1 {
				t.Errorf("%s: done ran %d times", k, n)
			}
			return true
		})
		e = open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
		acked.Range(func(k, _ any) bool {
			if o, err := e.MarkIfAbsent(ctx, []byte(k.(string))); err != nil || o != engine.Duplicate {
				t.Errorf("%s acknowledged, after reopening: %v %v", k, o, err)
			}
			return true
		})
		e.Close()
	}
}

// TestCommitAsyncWritesUnsupportedInOrder: CommitBatchAsync with writes on Redis:
// a typed error in done, in order; MemoryOnly runs inline.
func TestCommitAsyncWritesUnsupportedInOrder(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	e := open(t, engine.Options{Backend: redisBackend(c, "q11w:")})
	defer e.Close()
	ctx := context.Background()
	a, b := claimNew(t, e, "a"), claimNew(t, e, "b")
	var order []string
	var mu sync.Mutex
	note := func(s string) func(error) {
		return func(err error) {
			mu.Lock()
			order = append(order, fmt.Sprint(s, ":", err == nil, errors.Is(err, engine.ErrOptions)))
			mu.Unlock()
		}
	}
	release := engine.HoldCommits()
	e.CommitAsync(ctx, a, note("a"))
	e.CommitBatchAsync(ctx, []engine.Claim{b}, []engine.Write{{Key: []byte("x"), Value: []byte("y")}}, note("w"))
	e.CommitAsync(ctx, b, note("b"))
	release()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(order) != "[a:true false w:false true b:true false]" {
		t.Fatalf("%v", order)
	}
	m := open(t, engine.Options{Tiers: engine.MemoryOnly})
	defer m.Close()
	mc := claimNew(t, m, "k")
	ran := false
	m.CommitAsync(ctx, mc, func(err error) { ran = err == nil })
	if !ran {
		t.Fatal("MemoryOnly CommitAsync did not run done inline")
	}
	if err := m.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func hangWait() time.Duration {
	if os.Getenv("TIERDEDUP_HANG") != "" {
		return time.Hour
	}
	return 5 * time.Second
}

// TestCommitNilContext: a nil ctx given to CommitAsync or Commit does not
// crash the engine's writer goroutine (run in a child process, which would
// die with every pending commit).
func TestCommitNilContext(t *testing.T) {
	child := crashtest.Start(t, "nilctx", "", &crashtest.Options{StderrApart: true})
	if err := child.Wait(); err != nil {
		lines := strings.SplitN(child.Stderr(), "\n", 12)
		t.Fatalf("child crashed (%v):\n%s\n%s", err, strings.Join(child.Lines(), "\n"), strings.Join(lines[:len(lines)-1], "\n"))
	}
	t.Logf("%s", strings.Join(child.Lines(), "\n"))
}

// nilContextChild is TestCommitNilContext's child: it commits with a nil
// ctx, asynchronously and synchronously, and says "survived" if the
// process did.
func nilContextChild(string) int {
	e, err := engine.Open(&engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}, Logger: quiet})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	claimNew := func(key string) engine.Claim {
		c, err := e.Claim(context.Background(), []byte(key))
		if err != nil || c.Outcome != engine.New {
			fmt.Printf("ERR claim %s: %v, %v\n", key, c.Outcome, err)
			os.Exit(1)
		}
		return c
	}
	c := claimNew("k")
	func() {
		defer func() { recover() }()
		e.CommitAsync(nil, c, func(err error) { fmt.Println("done:", err) }) //nolint:staticcheck
	}()
	func() {
		defer func() {
			if r := recover(); r != nil {
				fmt.Println("sync Commit(nil) panicked in the caller:", r)
			}
		}()
		fmt.Println("sync:", e.Commit(nil, claimNew("k2"))) //nolint:staticcheck
	}()
	fmt.Println("flush:", e.Flush(context.Background()))
	e.Close()
	fmt.Println("survived")
	return 0
}

// TestSyncFailureFailsWholeGroup: a WAL sync error in a group: every
// call of the group gets an error (none acknowledged), later calls error.
func TestSyncFailureFailsWholeGroup(t *testing.T) {
	var fault faultfs.Fault
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: faultfs.Wrap(vfs.NewMem(), &fault)}})
	defer e.Close()
	ctx := context.Background()
	var claims []engine.Claim
	for i := range 6 {
		claims = append(claims, claimNew(t, e, fmt.Sprint("k", i)))
	}
	res := make([]error, 8)
	ran := make([]int, 8)
	var mu sync.Mutex
	set := func(i int) func(error) {
		return func(err error) { mu.Lock(); res[i] = err; ran[i]++; mu.Unlock() }
	}
	release := engine.HoldCommits()
	e.CommitAsync(ctx, claims[0], set(0))
	e.CommitBatchAsync(ctx, claims[1:3], nil, set(1))
	e.CommitBatchAsync(ctx, claims[3:4], []engine.Write{{Key: []byte("r"), Value: []byte("v")}}, set(2))
	e.CommitBatchAsync(ctx, nil, []engine.Write{{Key: []byte("r2"), Value: []byte("v")}}, set(3))
	syncErr := make(chan error, 1)
	go func() { syncErr <- e.Commit(ctx, claims[4]) }()
	waitFor(t, "5 pending", func() bool { return e.Stats().Queue.Pending == 5 })
	fault.Arm(faultfs.Match{Kinds: faultfs.Syncs, Contains: ".log"}) // the WAL's syncs
	release()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	e.CommitAsync(ctx, claims[5], set(4))
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	serr := <-syncErr
	t.Logf("async %v; sync %v", res[:5], serr)
	for i := range 5 {
		if res[i] == nil || !errors.Is(res[i], engine.ErrStorage) || ran[i] != 1 {
			t.Errorf("call %d: %v (ran %d); want ErrStorage once", i, res[i], ran[i])
		}
	}
	if !errors.Is(serr, engine.ErrStorage) {
		t.Errorf("sync commit in the failed group: %v", serr)
	}
	if st := e.Stats(); st.Calls.Commits != 0 {
		t.Errorf("Stats.Calls.Commits %d after a failed group", st.Calls.Commits)
	}
}

// TestKeyMutatedBeforeTurn: the key bytes of a pending CommitAsync are
// changed (a reused buffer) before its turn: neither key may be committed.
func TestKeyMutatedBeforeTurn(t *testing.T) {
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}})
	defer e.Close()
	ctx := context.Background()
	buf := []byte("aaaa")
	c, err := e.Claim(ctx, buf)
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	other := claimNew(t, e, "bbbb")
	_ = other
	release := engine.HoldCommits()
	var got error
	e.CommitAsync(ctx, c, func(err error) { got = err })
	copy(buf, "bbbb")
	release()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	a, _ := e.MarkIfAbsent(ctx, []byte("aaaa"))
	b, _ := e.MarkIfAbsent(ctx, []byte("bbbb"))
	t.Logf("done %v; aaaa %v; bbbb %v", got, a, b)
	if got == nil || a == engine.Duplicate || b == engine.Duplicate {
		t.Fatalf("done %v; aaaa %v; bbbb %v", got, a, b)
	}
}

// TestBoundHoldsRefusedCalls: CommitQueue 2 and the writer held in its
// sync: CommitAsync of a claim that is not New (a duplicate the consumer
// acks in order) waits for room too, so the queue holds at most 2 calls.
func TestBoundHoldsRefusedCalls(t *testing.T) {
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, CommitQueue: 2})
	defer e.Close()
	defer gate.Open()
	ctx := context.Background()
	a := claimNew(t, e, "a")
	if err := e.Commit(ctx, a); err != nil {
		t.Fatal(err)
	}
	dup, err := e.Claim(ctx, []byte("a"))
	if err != nil || dup.Outcome != engine.Duplicate {
		t.Fatal(dup.Outcome, err)
	}
	gate.Shut()
	e.CommitAsync(ctx, claimNew(t, e, "b"), nil)
	waitWriterInSync(t, gate, e, "b's write to wait in its sync")
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 100000 {
			e.CommitAsync(ctx, dup, func(error) {})
		}
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
	}
	if n := e.Stats().Queue.Pending; n > 2 {
		t.Fatalf("CommitQueue 2, writer held: %d calls pending, CommitAsync never waited for room", n)
	}
}

// TestPanickingDone: a CommitAsync done that panics neither crashes the
// process nor stops the queue: the dones enqueued around it all run, in
// order, later commits and Flush work, the panic is counted in
// Stats.Calls.DonePanics and logged with its message.
func TestPanickingDone(t *testing.T) {
	var logged strings.Builder
	var logMu sync.Mutex
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000,
		Logger: slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
			logMu.Lock()
			defer logMu.Unlock()
			return logged.Write(p)
		}), nil))})
	defer e.Close()
	ctx := context.Background()
	var mu sync.Mutex
	var order []int
	release := engine.HoldCommits() // one group: the panic sits among the others' dones
	for i := range 6 {
		c := claimNew(t, e, fmt.Sprint("p", i))
		e.CommitAsync(ctx, c, func(err error) {
			if err != nil {
				t.Errorf("done %d: %v", i, err)
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if i == 2 || i == 4 {
				panic(fmt.Sprintf("handler bug %d", i))
			}
		})
	}
	release()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	c := claimNew(t, e, "after")
	ran := make(chan error, 1)
	e.CommitAsync(ctx, c, func(err error) { ran <- err })
	if err := <-ran; err != nil {
		t.Fatalf("a commit after the panics: %v", err)
	}
	if fmt.Sprint(order) != "[0 1 2 3 4 5]" {
		t.Fatalf("dones ran %v, want all six in order", order)
	}
	if n := e.Stats().Calls.DonePanics; n != 2 {
		t.Fatalf("Stats.Calls.DonePanics = %d, want 2", n)
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(logged.String(), "handler bug 2") || !strings.Contains(logged.String(), "handler bug 4") {
		t.Fatalf("the panics were not logged: %q", logged.String())
	}
}

// writerFunc is an io.Writer made of a function.
type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
