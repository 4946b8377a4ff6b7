package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

func claimNew(t *testing.T, e *engine.Engine, key string) engine.Claim {
	t.Helper()
	c, err := e.Claim(context.Background(), []byte(key))
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim %s: %v, %v", key, c.Outcome, err)
	}
	return c
}

// TestCommitAsyncOrderAndDurability: goroutines each enqueue commits with
// CommitAsync; every done runs once, with nil, in its goroutine's enqueue
// order, and only after its commit is durable: while the writer is held
// inside its sync, no done runs.
func TestCommitAsyncOrderAndDurability(t *testing.T) {
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
	ctx := context.Background()
	const workers, each = 4, 500
	gate.Shut()
	// A first commit holds the writer in its sync before the workers
	// start: every commit after it waits behind that write (a writer that
	// took all of them into its first batch would leave none pending).
	var firstDone atomic.Bool
	e.CommitAsync(ctx, claimNew(t, e, "first"), func(err error) {
		if err != nil {
			t.Errorf("first: %v", err)
		}
		firstDone.Store(true)
	})
	waitWriterInSync(t, gate, e, "the writer to wait in its sync")
	var ran atomic.Int64
	got := make([][]int, workers)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				c := claimNew(t, e, fmt.Sprintf("w%d-%d", w, i))
				e.CommitAsync(ctx, c, func(err error) {
					if err != nil {
						t.Errorf("w%d-%d: %v", w, i, err)
					}
					ran.Add(1)
					mu.Lock()
					got[w] = append(got[w], i)
					mu.Unlock()
				})
			}
		})
	}
	wg.Wait()
	if n := ran.Load(); n != 0 || firstDone.Load() {
		t.Fatalf("%d dones (first: %v) ran while the write was not yet durable", n, firstDone.Load())
	}
	if st := e.Stats(); st.Queue.Pending == 0 {
		t.Fatalf("no commit waits behind the held write: %+v", st.Queue.Pending)
	}
	gate.Open()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != workers*each || !firstDone.Load() {
		t.Fatalf("Flush returned with %d of %d dones run (first: %v)", n, workers*each, firstDone.Load())
	}
	checkDoneOrder(t, got)
	st := e.Stats()
	if st.Queue.Groups >= workers*each/2 {
		t.Fatalf("%d commits in %d groups: pending commits were not written together", st.Calls.Commits, st.Queue.Groups)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
	defer e.Close()
	for w := range workers {
		for i := range each {
			if o, err := e.MarkIfAbsent(ctx, fmt.Appendf(nil, "w%d-%d", w, i)); err != nil || o != engine.Duplicate {
				t.Fatalf("w%d-%d after reopening: %v, %v", w, i, o, err)
			}
		}
	}
	t.Logf("%d async commits in %d groups, dones in order", st.Calls.Commits, st.Queue.Groups)
}

// TestCommitAsyncFencedAndNotClaimed: a claim whose lease ended and was
// taken over gets ErrLeaseLost in its done, and changes nothing; a claim
// that is not New gets ErrNotClaimed, in order with the others.
func TestCommitAsyncFencedAndNotClaimed(t *testing.T) {
	clock := newClock()
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Clock: clock, Lease: time.Second})
	defer e.Close()
	ctx := context.Background()
	stale := claimNew(t, e, "k")
	clock.Add(2 * time.Second)
	owner := claimNew(t, e, "k")
	dup, err := e.Claim(ctx, []byte("k"))
	if err != nil || dup.Outcome != engine.InFlight {
		t.Fatalf("third claim: %v, %v", dup.Outcome, err)
	}
	var errs []error
	var mu sync.Mutex
	record := func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() }
	e.CommitAsync(ctx, stale, record)
	e.CommitAsync(ctx, dup, record)
	e.CommitAsync(ctx, owner, record)
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if len(errs) != 3 || !errors.Is(errs[0], engine.ErrLeaseLost) || !errors.Is(errs[1], engine.ErrNotClaimed) || errs[2] != nil {
		t.Fatalf("dones got %v; want ErrLeaseLost, ErrNotClaimed, nil", errs)
	}
}

// TestCommitQueueBound: with CommitQueue 2 and the writer held, a third
// CommitAsync waits for room; its ctx ending gets it ctx's error in done,
// in order after the two before it, which succeed once the writer goes on.
func TestCommitQueueBound(t *testing.T) {
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, CommitQueue: 2})
	defer e.Close()
	ctx := context.Background()
	a, b, c := claimNew(t, e, "a"), claimNew(t, e, "b"), claimNew(t, e, "c")
	gate.Shut()
	var order []string
	var mu sync.Mutex
	note := func(name string) func(error) {
		return func(err error) {
			mu.Lock()
			defer mu.Unlock()
			order = append(order, fmt.Sprintf("%s:%v", name, err))
		}
	}
	e.CommitAsync(ctx, a, note("a"))
	waitWriterInSync(t, gate, e, "a's write to wait in its sync")
	e.CommitAsync(ctx, b, note("b"))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	began := time.Now()
	e.CommitAsync(short, c, note("c"))
	if d := time.Since(began); d < 40*time.Millisecond {
		t.Fatalf("the third CommitAsync returned after %v with the queue full", d)
	}
	gate.Open()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"a:<nil>", "b:<nil>", "c:" + context.DeadlineExceeded.Error()}
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Fatalf("dones %v, want %v", order, want)
	}
	if o, err := e.MarkIfAbsent(ctx, []byte("c")); err != nil || o != engine.InFlight {
		t.Fatalf("c, never written: %v, %v; want InFlight (its claim stands)", o, err)
	}
}

// TestCommitGroupKeepsEachCallsRecords: calls written in one group keep
// CommitBatchWith's rule each: the records of a call whose claims all lost
// their lease are not written, those of the others are, and a call with no
// New claim writes its records.
func TestCommitGroupKeepsEachCallsRecords(t *testing.T) {
	clock := newClock()
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Clock: clock, Lease: time.Second})
	defer e.Close()
	ctx := context.Background()
	stale := claimNew(t, e, "stale")
	clock.Add(2 * time.Second)
	claimNew(t, e, "stale") // takes it over
	kept := claimNew(t, e, "kept")
	dup, _ := e.Claim(ctx, []byte("kept"))
	results := make(chan string, 3)
	groups := e.Stats().Queue.Groups
	release := engine.HoldCommits()
	rec := func(k string) []engine.Write { return []engine.Write{{Key: []byte("rec/" + k), Value: []byte(k)}} }
	e.CommitBatchAsync(ctx, []engine.Claim{stale}, rec("stale"), func(err error) { results <- fmt.Sprint("stale:", errors.Is(err, engine.ErrLeaseLost)) })
	e.CommitBatchAsync(ctx, []engine.Claim{kept}, rec("kept"), func(err error) { results <- fmt.Sprint("kept:", err) })
	e.CommitBatchAsync(ctx, []engine.Claim{dup}, rec("none-new"), func(err error) { results <- fmt.Sprint("none-new:", err) })
	release()
	if err := e.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	close(results)
	var got []string
	for r := range results {
		got = append(got, r)
	}
	if want := "[stale:true kept:<nil> none-new:<nil>]"; fmt.Sprint(got) != want {
		t.Fatalf("dones %v, want %s", got, want)
	}
	if n := e.Stats().Queue.Groups - groups; n != 1 {
		t.Fatalf("the three calls were written in %d writes, want 1", n)
	}
	var recs []string
	if err := e.ScanWrites([]byte("rec/"), func(k, _ []byte) error { recs = append(recs, string(k)); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := "[rec/kept rec/none-new]"; fmt.Sprint(recs) != want {
		t.Fatalf("records %v, want %s", recs, want)
	}
}

// TestCloseFlushesCommitQueue: Close writes every commit enqueued before it
// and runs its done; a CommitAsync after Close gets ErrClosed.
func TestCloseFlushesCommitQueue(t *testing.T) {
	fs := vfs.NewMem() // (it was a gateFS never shut: the same filesystem)
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
	ctx := context.Background()
	var ran atomic.Int64
	for i := range 100 {
		e.CommitAsync(ctx, claimNew(t, e, fmt.Sprint(i)), func(err error) {
			if err == nil {
				ran.Add(1)
			}
		})
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if n := ran.Load(); n != 100 {
		t.Fatalf("Close returned with %d of 100 dones run", n)
	}
	var after error
	e.CommitAsync(ctx, engine.Claim{Outcome: engine.New}, func(err error) { after = err })
	if !errors.Is(after, engine.ErrClosed) && !errors.Is(after, engine.ErrLeaseLost) {
		t.Fatalf("CommitAsync after Close: %v", after)
	}
	e = open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}})
	defer e.Close()
	for i := range 100 {
		if o, err := e.MarkIfAbsent(ctx, fmt.Append(nil, i)); err != nil || o != engine.Duplicate {
			t.Fatalf("%d after reopening: %v, %v", i, o, err)
		}
	}
}

// TestCommitAsyncSharedTiers: on Redis, a 3-master Redis Cluster and
// PostgreSQL, asynchronous commits from several goroutines are written
// together (fewer writes than commits: one pipeline or statement per
// group), every done runs with nil in its goroutine's order, and every key
// is a Duplicate to another process afterwards.
func TestCommitAsyncSharedTiers(t *testing.T) {
	for _, cfg := range enginetest.Pick("redis", "redis-cluster", "postgres") {
		t.Run(cfg.Name, func(t *testing.T) {
			s := cfg.New(t, "async")
			e := open(t, s.Wrapped(engine.Options{}, enginetest.Wrap{Redis: &goredis.Options{PoolSize: 16}}))
			ctx := context.Background()
			const workers, each = 4, 300
			got := make([][]int, workers)
			var mu sync.Mutex
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() {
					for i := range each {
						c := claimNew(t, e, fmt.Sprintf("w%d-%d", w, i))
						e.CommitAsync(ctx, c, func(err error) {
							if err != nil {
								t.Errorf("w%d-%d: %v", w, i, err)
							}
							mu.Lock()
							got[w] = append(got[w], i)
							mu.Unlock()
						})
					}
				})
			}
			wg.Wait()
			if err := e.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			for w, seq := range got {
				if len(seq) != each {
					t.Fatalf("worker %d: %d of %d dones ran before Flush returned", w, len(seq), each)
				}
			}
			checkDoneOrder(t, got)
			st := e.Stats()
			if st.Queue.Groups >= st.Calls.Commits {
				t.Fatalf("%d commits in %d writes: nothing was written together", st.Calls.Commits, st.Queue.Groups)
			}
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			other := open(t, s.Options(engine.Options{}))
			defer other.Close()
			for w := range workers {
				for i := range each {
					if c, err := other.Claim(ctx, fmt.Appendf(nil, "w%d-%d", w, i)); err != nil || c.Outcome != engine.Duplicate {
						t.Fatalf("w%d-%d in another process: %v, %v", w, i, c.Outcome, err)
					}
				}
			}
			t.Logf("%d async commits in %d writes", st.Calls.Commits, st.Queue.Groups)
		})
	}
}

var waitFor = enginetest.WaitFor

// waitWriterInSync waits until the commit queue's writer has taken every
// pending commit and a WAL sync waits at gate. A WAL sync alone is not
// enough: the compaction a partition drop queues at Open rotates the WAL,
// and its sync may be the one the gate holds while the commit still waits
// in the queue.
func waitWriterInSync(t *testing.T, gate *faultfs.Gate, e *engine.Engine, what string) {
	t.Helper()
	waitFor(t, what, func() bool { return gate.Waited() > 0 && e.Stats().Queue.Pending == 0 })
}
