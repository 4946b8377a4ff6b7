package engine_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// slidingBatchEngine opens an embedded store on a crashable filesystem
// with a sliding default namespace, marks "k" New, and moves the clock to
// a later partition inside the window, where a duplicate of "k" refreshes
// it.
func slidingBatchEngine(t *testing.T, lease time.Duration) (*engine.Engine, engine.Options, *vfs.MemFS, *fakeClock) {
	t.Helper()
	clock := newClock()
	fs := vfs.NewCrashableMem()
	o := engine.Options{Backend: &embedded.Backend{Dir: "s", FS: fs}, Window: slideWindow, Partition: slidePart, ExpectedKeys: 1000,
		Clock: clock, Lease: lease, Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
	e := open(t, o)
	if g, err := e.MarkIfAbsent(context.Background(), []byte("k")); g != engine.New || err != nil {
		t.Fatal(g, err)
	}
	clock.Add(slideWindow - time.Minute)
	return e, o, fs, clock
}

// TestSlidingRefreshSharesTheBatchWrite: a MarkBatch whose batch holds
// New keys and a sliding duplicate that refreshes makes one durable write,
// not two (the refresh rides with the commits), and both are durable when
// it returns: a machine crash right after (a crash clone: what was not
// synced is lost) keeps the New keys Duplicate and the refreshed key
// Duplicate past its first commit's expiry. A batch of the refresh alone
// (no New key) writes once too.
func TestSlidingRefreshSharesTheBatchWrite(t *testing.T) {
	ctx := context.Background()
	e, o, fs, clock := slidingBatchEngine(t, 0)
	var writes atomic.Int64
	enginetest.SetBeforeDurable(func() { writes.Add(1) })
	defer enginetest.SetBeforeDurable(nil)
	keys := [][]byte{[]byte("a"), []byte("k"), []byte("b")}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	if out[0] != engine.New || out[1] != engine.Duplicate || out[2] != engine.New {
		t.Fatalf("answers %v, want [New Duplicate New]", out)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("a batch of two New keys and a refresh made %d durable writes, want 1", n)
	}
	if r := e.Stats().Calls.Refreshes; r != 1 {
		t.Errorf("Refreshes %d, want 1", r)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})

	// The refresh alone: one write.
	clock.Add(slidePart)
	writes.Store(0)
	if err := e.MarkBatch(ctx, [][]byte{[]byte("k")}, nil, out[:1]); err != nil || out[0] != engine.Duplicate {
		t.Fatal(out[0], err)
	}
	if n := writes.Load(); n != 1 {
		t.Errorf("a batch of one refresh made %d durable writes, want 1", n)
	}
	enginetest.SetBeforeDurable(nil)
	e.Close()

	// Past the first commit's expiry, inside the refresh's.
	clock.Add(2 * time.Minute)
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	for _, k := range []string{"a", "k", "b"} {
		if g, err := e.MarkIfAbsent(ctx, []byte(k)); g != engine.Duplicate || err != nil {
			t.Errorf("after a machine crash, %q: %v %v, want Duplicate", k, g, err)
		}
	}
}

// TestSlidingRefreshNotWrittenAfterItsLease: a MarkBatch held between its
// claim and its commit while the lease of its claims ends, and a Forget
// of the key it decided to refresh runs meanwhile: the refresh is not
// written (it would bring the forgotten key back), the duplicate it
// answered stands (decided while it held the key), the New key whose
// claim ended is InFlight, and no claim is left behind.
func TestSlidingRefreshNotWrittenAfterItsLease(t *testing.T) {
	ctx := context.Background()
	const lease = time.Minute
	e, _, _, clock := slidingBatchEngine(t, lease)
	defer e.Close()
	entered, release := make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	enginetest.SetMarkBeforeCommit(func() {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	})
	defer enginetest.SetMarkBeforeCommit(nil)
	keys := [][]byte{[]byte("k"), []byte("fresh")}
	out := make([]engine.Outcome, len(keys))
	done := make(chan error, 1)
	go func() { done <- e.MarkBatch(ctx, keys, nil, out) }()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the mark never reached its commit")
	}
	clock.Add(2 * lease)
	found, err := e.Forget(ctx, []byte("k"))
	if err != nil || found.Outcome != engine.Duplicate {
		t.Fatalf("Forget of the held key after its lease: %v, %v; want the commit it removed", found.Outcome, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out[0] != engine.Duplicate || out[1] != engine.InFlight {
		t.Errorf("the held mark answered %v, want [Duplicate InFlight]", out)
	}
	in, err := e.Lookup(ctx, []byte("k"))
	if err != nil || in.Outcome != engine.New {
		t.Errorf("the forgotten key after the held mark's late commit: %v %v, want New (not written back by a refresh)", in.Outcome, err)
	}
	for _, k := range []string{"k", "fresh"} {
		if g, err := e.MarkIfAbsent(ctx, []byte(k)); g != engine.New || err != nil {
			t.Errorf("%q marked again: %v %v, want New (no claim left behind)", k, g, err)
		}
	}
}
