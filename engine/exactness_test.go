package engine_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/tierdedup/tierdedup/engine"
)

// failNthRead fails the n-th read of an SST file after it is armed, once.
type failNthRead struct {
	armed atomic.Int64 // n; 0 is off
	seen  atomic.Int64
	fired atomic.Bool
}

func (f *failNthRead) MaybeError(op errorfs.Op) error {
	n := f.armed.Load()
	if n == 0 || (op.Kind != errorfs.OpFileRead && op.Kind != errorfs.OpFileReadAt) || !strings.HasSuffix(op.Path, ".sst") {
		return nil
	}
	if f.seen.Add(1) == n {
		f.fired.Store(true)
		return errorfs.ErrInjected
	}
	return nil
}

func (f *failNthRead) String() string { return "fail-nth-sst-read" }

// TestReadErrorNeverNew commits a key in the newest partition (so a cold
// claim reads it first, then older partitions), compacts it into an SST,
// crashes, and then fails the n-th SST read of a cold claim, for every n
// that a claim performs. A failed read must surface as ErrStorage, never as
// New, and must latch: the next claim of a key never seen is ErrStorage too.
func TestReadErrorNeverNew(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	clock := newClock()
	o := engine.Options{Dir: "db", FS: mem, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	for h := range 4 {
		for i := range 20 {
			if _, err := e.MarkIfAbsent(ctx, fmt.Appendf(nil, "old-%d-%d", h, i)); err != nil {
				t.Fatal(err)
			}
		}
		clock.Add(time.Hour)
	}
	victim := []byte("victim")
	if o, err := e.MarkIfAbsent(ctx, victim); err != nil || o != engine.New {
		t.Fatal(o, err)
	}
	if err := e.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	base := mem.CrashClone(vfs.CrashCloneCfg{}) // a crash: no snapshot, cold filters
	_ = e.Close()

	gate := make(chan struct{})
	engine.SetRebuildGate(gate) // stay cold: every claim reads Pebble
	defer engine.SetRebuildGate(nil)
	// Background work (the WAL replayed at open, table statistics) reads
	// SSTs too, so which read is the claim's varies: every n is tried a few
	// times, past the most reads a claim was seen to make.
	failures, most := 0, int64(1)
	for n := int64(1); n <= most+2; n++ {
		for range 3 {
			inj := &failNthRead{}
			o.FS = errorfs.Wrap(base.CrashClone(vfs.CrashCloneCfg{}), inj)
			e := open(t, o)
			inj.armed.Store(n)
			c, err := e.Claim(ctx, victim)
			fired := inj.fired.Load()
			most = max(most, inj.seen.Load())
			inj.armed.Store(0)
			switch {
			case c.Outcome == engine.New:
				t.Fatalf("read %d failed (injected: %v) and the committed key was answered New, err %v", n, fired, err)
			case err == nil && c.Outcome != engine.Duplicate:
				t.Fatalf("read %d: outcome %v", n, c.Outcome)
			case err != nil && !errors.Is(err, engine.ErrStorage):
				t.Fatalf("read %d: error %v, want ErrStorage", n, err)
			case err != nil:
				failures++
				// Read errors latch: a key never seen is not New either.
				if c, err := e.Claim(ctx, []byte("never-seen")); !errors.Is(err, engine.ErrStorage) || c.Outcome == engine.New {
					t.Fatalf("after a read error: %v, %v; want ErrStorage", c.Outcome, err)
				}
			}
			_ = e.Close()
		}
	}
	if failures == 0 {
		t.Fatal("no injected read error reached the claim")
	}
}

// TestRejectedSnapshotIsNeverReused: run 1 closes cleanly (snapshot); run 2
// opens with other Bloom parameters (the snapshot is rejected), commits and
// crashes; run 3 opens with the first parameters. Every key run 2
// acknowledged must still be a Duplicate.
func TestRejectedSnapshotIsNeverReused(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	o1 := engine.Options{Dir: "db", FS: mem, ExpectedKeys: 1000}
	e := open(t, o1)
	if _, err := e.MarkIfAbsent(ctx, []byte("run-1")); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o2 := o1
	o2.ExpectedKeys = 2000
	e = open(t, o2)
	keys := make([][]byte, 100)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "run-2-%d", i)
	}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()

	o1.FS = crashed
	e = open(t, o1)
	defer e.Close()
	waitWarm(t, e)
	claims := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(ctx, keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.Outcome != engine.Duplicate {
			t.Fatalf("acknowledged key %s is %v after the rejected snapshot's run", keys[i], c.Outcome)
		}
	}
}

func waitWarm(t *testing.T, e *engine.Engine) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for e.Stats().BloomMode != "warm" {
		if time.Now().After(deadline) {
			t.Fatal("the filters did not become warm")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestFailedOpenLeaksNoGoroutine retries Open on a locked directory: no
// goroutine may survive a failed Open.
func TestFailedOpenLeaksNoGoroutine(t *testing.T) {
	dir := t.TempDir()
	e := open(t, engine.Options{Dir: dir, ExpectedKeys: 1000})
	defer e.Close()
	settle := func() int {
		var n int
		for range 50 {
			runtime.GC()
			n = runtime.NumGoroutine()
			time.Sleep(2 * time.Millisecond)
		}
		return n
	}
	before := settle()
	for range 20 {
		if _, err := engine.Open(&engine.Options{Dir: dir, ExpectedKeys: 1000, Logger: quiet}); !errors.Is(err, engine.ErrLocked) {
			t.Fatalf("second Open: %v, want ErrLocked", err)
		}
	}
	if after := settle(); after > before {
		buf := make([]byte, 1<<16)
		t.Fatalf("%d goroutines before 20 failed Opens, %d after\n%s", before, after, buf[:runtime.Stack(buf, true)])
	}
}

// TestCommitBatchWithNoNewClaimWrites: writes given with a batch that holds
// no New claim (every message was a duplicate) are written, atomically and
// durably, not dropped.
func TestCommitBatchWithNoNewClaimWrites(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewCrashableMem()
	e := open(t, engine.Options{Dir: "db", FS: mem, ExpectedKeys: 1000})
	if _, err := e.MarkIfAbsent(ctx, []byte("k")); err != nil {
		t.Fatal(err)
	}
	c, err := e.Claim(ctx, []byte("k"))
	if err != nil || c.Outcome != engine.Duplicate {
		t.Fatal(c.Outcome, err)
	}
	if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, []engine.Write{{Key: []byte("offset"), Value: []byte("42")}}); err != nil {
		t.Fatal(err)
	}
	e2 := open(t, engine.Options{Dir: "db", FS: mem.CrashClone(vfs.CrashCloneCfg{}), ExpectedKeys: 1000})
	defer e2.Close()
	_ = e.Close()
	var got string
	if err := e2.ScanWrites(nil, func(k, v []byte) error { got = string(k) + "=" + string(v); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != "offset=42" {
		t.Fatalf("writes after a crash: %q, want offset=42", got)
	}
}
