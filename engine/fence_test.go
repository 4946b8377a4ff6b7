package engine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// forgetResult is what a Forget returned; forgetAsync runs one on a
// goroutine of its own.
type forgetResult = enginetest.ForgetResult

func forgetAsync(e *engine.Engine, key []byte) <-chan forgetResult {
	return enginetest.ForgetAsync(e, key)
}

// TestForgetFenceOutlivesLease: a Forget whose delete waits on the disk
// for longer than the Lease (its WAL sync held, the clock moved on) keeps
// the key fenced until it returns: a claim and a mark meanwhile answer
// InFlight instead of taking over an expired fence, reading the commit the
// Forget is deleting and caching it. Afterwards memory and the store
// agree that the key is gone, before and after a reopen.
func TestForgetFenceOutlivesLease(t *testing.T) {
	ctx := context.Background()
	gate := faultfs.NewGate(faultfs.WALSyncs)
	fs := faultfs.Wrap(vfs.NewMem(), gate)
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, ExpectedKeys: 1000,
		Window: 24 * time.Hour, Partition: time.Hour, Lease: time.Minute}
	e := open(t, o)
	key := []byte("order-7")
	if got, err := e.MarkIfAbsent(ctx, key); err != nil || got != engine.New {
		t.Fatalf("mark: %v %v", got, err)
	}
	gate.Shut()
	forgot := forgetAsync(e, key)
	// Another writer's WAL sync (a background journal or checkpoint) may
	// be the one the gate holds: wait until the Forget's fence is seen too.
	waitFor(t, "the Forget's delete to wait on its WAL sync", func() bool {
		if gate.Waited() == 0 {
			return false
		}
		info, err := e.Lookup(ctx, key)
		return err == nil && info.Outcome == engine.InFlight
	})
	clock.Add(2 * time.Minute) // past the Lease
	if c, err := e.Claim(ctx, key); err != nil || c.Outcome != engine.InFlight {
		t.Errorf("a claim while the Forget deletes: %v %v, want InFlight", c.Outcome, err)
	}
	if got, err := e.MarkIfAbsent(ctx, key); err != nil || got != engine.InFlight {
		t.Errorf("a mark while the Forget deletes: %v %v, want InFlight", got, err)
	}
	gate.Open()
	r := <-forgot
	if r.Err != nil || r.Info.Outcome != engine.Duplicate {
		t.Fatalf("Forget: %v %v, want the commit it removed", r.Info.Outcome, r.Err)
	}
	check := func(e *engine.Engine, when string) {
		t.Helper()
		if info, err := e.Lookup(ctx, key); err != nil || info.Outcome != engine.New {
			t.Fatalf("Lookup %s: %v %v, want New", when, info.Outcome, err)
		}
	}
	check(e, "after the Forget")
	c, err := e.Claim(ctx, key)
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim after the Forget: %v %v, want New", c.Outcome, err)
	}
	if err := e.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	defer e.Close()
	check(e, "after a reopen")
}

// TestCloseStrandsNoMark: MarkIfAbsent calls racing Close on the Redis
// tier (whose marks are a claim, then a commit) each either complete or
// fail having taken nothing: afterwards another process finds every key a
// failed mark touched free (New), and every key marked New a Duplicate.
// Before, a mark whose claim reached Redis and whose commit found the
// engine closing left its key held there for the whole lease.
func TestCloseStrandsNoMark(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	o := engine.Options{Lease: time.Hour}
	check := openRedis(t, c, "close:", o)
	defer check.Close()
	failed, marked := 0, 0
	for round := range 20 {
		e := openRedis(t, c, "close:", o)
		var wg sync.WaitGroup
		type mark struct {
			key string
			got engine.Outcome
			err error
		}
		results := make(chan mark, 400)
		for w := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ; i++ {
					key := fmt.Sprintf("r%d-w%d-%d", round, w, i)
					got, err := e.MarkIfAbsent(ctx, []byte(key))
					results <- mark{key, got, err}
					if err != nil || i == 40 {
						return
					}
				}
			}()
		}
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		close(results)
		for m := range results {
			c, err := check.Claim(ctx, []byte(m.key))
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case m.err != nil:
				failed++
				if c.Outcome != engine.New {
					t.Fatalf("round %d: a mark that failed (%v) left %s %v for another process", round, m.err, m.key, c.Outcome)
				}
				if err := check.Release(ctx, c); err != nil {
					t.Fatal(err)
				}
			case m.got == engine.New:
				marked++
				if c.Outcome != engine.Duplicate {
					t.Fatalf("round %d: %s marked New is %v for another process", round, m.key, c.Outcome)
				}
			}
		}
	}
	if failed == 0 {
		t.Fatal("no mark raced Close: the test checked nothing")
	}
	t.Logf("%d marks failed at Close, each leaving its key free; %d marked", failed, marked)
}

// TestForgetWaitsForReleaseCount: with MaxAttempts in the embedded store,
// a Release frees its claim in memory, then writes the key's attempt
// count. A Forget in between used to find the count in memory, report it
// removed, and see it come back with the Release's write; now it waits for
// that write, removes the count, and the key has no attempts afterwards.
func TestForgetWaitsForReleaseCount(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, MaxAttempts: 3, Lease: time.Minute})
	defer e.Close()
	key := []byte("job-9")
	c := claimNew(t, e, string(key))
	gate, entered := make(chan struct{}), make(chan struct{})
	var once sync.Once
	enginetest.SetBeforeDurable(func() { once.Do(func() { close(entered); <-gate }) })
	defer enginetest.SetBeforeDurable(nil)
	released := make(chan error, 1)
	go func() { released <- e.Release(ctx, c) }()
	<-entered // the Release's count waits to be written
	forgot := forgetAsync(e, key)
	time.Sleep(50 * time.Millisecond) // let the Forget run as far as it may
	close(gate)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	r := <-forgot
	if r.Err != nil || r.Info.Attempts != 1 {
		t.Fatalf("Forget: %v attempts %d, %v; want the one attempt it removed", r.Info.Outcome, r.Info.Attempts, r.Err)
	}
	if info, err := e.Lookup(ctx, key); err != nil || info.Outcome != engine.New || info.Attempts != 0 {
		t.Fatalf("Lookup after the Forget: %v with %d attempts, %v; want New with none", info.Outcome, info.Attempts, err)
	}
}

// TestReleaseCountNeverErasesCommit: with MaxAttempts in the embedded
// store, a Release frees its claim in memory, then writes the key's
// attempt count. Another claim that takes the key in that gap and commits
// it must not have its commit overwritten by the late count: after a
// reopen (the store alone answering) the key is a Duplicate.
func TestReleaseCountNeverErasesCommit(t *testing.T) {
	ctx := context.Background()
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, MaxAttempts: 3, Lease: time.Minute}
	e := open(t, o)
	key := []byte("job-10")
	first := claimNew(t, e, string(key))
	gate, entered := make(chan struct{}), make(chan struct{})
	var held atomic.Bool // only the first durable write waits (sync.Once would hold the others too)
	enginetest.SetBeforeDurable(func() {
		if held.CompareAndSwap(false, true) {
			close(entered)
			<-gate
		}
	})
	defer enginetest.SetBeforeDurable(nil)
	released := make(chan error, 1)
	go func() { released <- e.Release(ctx, first) }()
	<-entered // the Release's count waits to be written; memory has freed the key
	second := claimNew(t, e, string(key))
	committed := make(chan error, 1)
	go func() { committed <- e.Commit(ctx, second) }()
	time.Sleep(50 * time.Millisecond) // let the Commit run as far as it may
	close(gate)
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	if err := <-committed; err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	defer e.Close()
	if info, err := e.Lookup(ctx, key); err != nil || info.Outcome != engine.Duplicate {
		t.Fatalf("Lookup after a reopen: %v with %d attempts, %v; want Duplicate", info.Outcome, info.Attempts, err)
	}
}
