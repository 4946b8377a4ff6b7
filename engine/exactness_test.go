package engine_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/internal/enginetest"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestReadErrorNeverNew commits a key in the newest partition (so a cold
// claim reads it first, then older partitions), compacts it into an SST,
// crashes, and then fails the n-th SST read of a cold claim, for every n
// that a claim performs. A failed read must surface as ErrStorage, never as
// New, and must latch: the next claim of a key never seen is ErrStorage too.
func TestReadErrorNeverNew(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
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
	enginetest.SetRebuildGate(gate) // stay cold: every claim reads Pebble
	defer enginetest.SetRebuildGate(nil)
	// Background work (the WAL replayed at open, table statistics) reads
	// SSTs too, so which read is the claim's varies: every n is tried a few
	// times, past the most reads a claim was seen to make.
	failures, most := 0, int64(1)
	for n := int64(1); n <= most+2; n++ {
		for range 3 {
			var fault faultfs.Fault
			setFS(&o, faultfs.Wrap(base.CrashClone(vfs.CrashCloneCfg{}), &fault))
			e := open(t, o)
			fault.ArmNth(faultfs.SSTReads, n)
			c, err := e.Claim(ctx, victim)
			fired := fault.Hits() > 0
			most = max(most, fault.Seen())
			fault.Disarm()
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
	mem := newCrashFS()
	o1 := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, ExpectedKeys: 1000}
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

	setFS(&o1, crashed)
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

// TestFailedOpenLeaksNoGoroutine retries Open on a locked directory: no
// goroutine may survive a failed Open.
func TestFailedOpenLeaksNoGoroutine(t *testing.T) {
	dir := t.TempDir()
	e := open(t, engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000})
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
		if _, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000, Logger: quiet}); !errors.Is(err, engine.ErrLocked) {
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
	mem := newCrashFS()
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, ExpectedKeys: 1000})
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
	e2 := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem.CrashClone(vfs.CrashCloneCfg{})}, ExpectedKeys: 1000})
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

// TestLayoutChangesAreRefused: a directory remembers the partition length,
// window and configuration it was written with; an Open that differs is
// refused with ErrLayout naming the field, and changes nothing, so the
// acknowledged key is still a Duplicate with the original options. A longer
// window is accepted.
func TestLayoutChangesAreRefused(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	base := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Window: 48 * time.Hour, Partition: 24 * time.Hour, ExpectedKeys: 1000}
	e := open(t, base)
	if o, err := e.MarkIfAbsent(ctx, []byte("acked")); err != nil || o != engine.New {
		t.Fatal(o, err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	expectRefused(t, base, []layoutChange{
		{"shorter partition", func(o *engine.Options) { o.Partition = time.Hour }, "Partition"},
		{"longer partition", func(o *engine.Options) { o.Partition, o.Window = 48*time.Hour, 96*time.Hour }, "Partition"},
		{"shorter window", func(o *engine.Options) { o.Window = 24 * time.Hour }, "Window"},
		{"bloom-only on a store", func(o *engine.Options) { o.Tiers = engine.BloomOnly }, "Tiers"},
	})
	longer := base
	longer.Window = 72 * time.Hour
	e = open(t, longer)
	expectAll(t, e, [][]byte{[]byte("acked")}, engine.Duplicate)
	_ = e.Close()
	e = open(t, longer)
	expectAll(t, e, [][]byte{[]byte("acked")}, engine.Duplicate)
	_ = e.Close()
	base.Logger = quiet
	if _, err := engine.Open(&base); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("the window went back to 48h after it was lengthened: %v", err)
	}
}

// layoutChange edits Options so that they no longer match a directory.
type layoutChange struct {
	name  string
	edit  func(*engine.Options)
	field string
}

// expectRefused opens base edited by each change: every Open must fail with
// ErrLayout naming the field.
func expectRefused(t *testing.T, base engine.Options, changes []layoutChange) {
	t.Helper()
	for _, c := range changes {
		o := base
		c.edit(&o)
		o.Logger = quiet
		if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) || !strings.Contains(err.Error(), c.field) {
			t.Fatalf("%s: Open = %v, want ErrLayout naming %s", c.name, err, c.field)
		}
	}
}

// TestBloomOnlyStateIsItsOwnLayout: bloom-only state refuses a store's
// configuration and other filter parameters (which would silently start
// empty and let every duplicate through), and a damaged state file is an
// error, not a fresh start.
func TestBloomOnlyStateIsItsOwnLayout(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "state", FS: mem}, ExpectedKeys: 1000}
	e := open(t, o)
	if _, err := e.MarkIfAbsent(ctx, []byte("acked")); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	expectRefused(t, o, []layoutChange{
		{"store on bloom-only state", func(o *engine.Options) { o.Tiers = engine.Default }, "Tiers"},
		{"other ExpectedKeys", func(o *engine.Options) { o.ExpectedKeys = 5000 }, "ExpectedKeys"},
		{"other partition", func(o *engine.Options) { o.Partition = 12 * time.Hour }, "Partition"},
	})
	e = open(t, o)
	expectAll(t, e, [][]byte{[]byte("acked")}, engine.Duplicate)
	_ = e.Close()

	f, err := mem.OpenReadWrite("state/tierdedup-bloom.snapshot", vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{0xff}, 200); err != nil {
		t.Fatal(err)
	}
	_ = f.Close()
	o.Logger = quiet
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrStorage) {
		t.Fatalf("Open on a damaged bloom-only state = %v, want ErrStorage", err)
	}
}

// TestBloomOnlyKeepsItsClock: bloom-only with a Dir persists its high-water
// clock, so a clock stepped back across a restart neither ignores new marks
// (the filters' ring is newer than the clock) nor answers a key marked
// twice New twice.
func TestBloomOnlyKeepsItsClock(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "state", FS: vfs.NewMem()}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	if _, err := e.MarkIfAbsent(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	_ = e.Close()
	clock.Add(-6 * time.Hour) // further back than the window: older than every live partition
	e = open(t, o)
	defer e.Close()
	for _, k := range []string{"after-1", "after-2"} {
		if o, err := e.MarkIfAbsent(ctx, []byte(k)); err != nil || o != engine.New {
			t.Fatalf("first mark of %s: %v %v", k, o, err)
		}
		if o, err := e.MarkIfAbsent(ctx, []byte(k)); err != nil || o != engine.Duplicate {
			t.Fatalf("second mark of %s after the clock stepped back: %v %v, want Duplicate", k, o, err)
		}
	}
	expectAll(t, e, [][]byte{[]byte("before")}, engine.Duplicate)
}

// TestConstructedFingerprintCollision: two distinct keys built to collide
// in all 128 bits of an unkeyed two-lane xxh64 fingerprint (shard's
// TestSumResistsConstructedCollisions builds them) are two keys to every
// configuration: the second is New, not a Duplicate of the first.
func TestConstructedFingerprintCollision(t *testing.T) {
	a, _ := hex.DecodeString("616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161616161")
	b, _ := hex.DecodeString("6262626262626262626262626262626262626262626262626262626262626265ebb10e3940909bd7314f371a036fbcd7314fb7be02df1fd7314fb7be02df1f616161")
	ctx := context.Background()
	for _, o := range []engine.Options{
		{Tiers: engine.MemoryOnly},
		{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}, ExpectedKeys: 1000},
	} {
		e := open(t, o)
		if out, err := e.MarkIfAbsent(ctx, a); err != nil || out != engine.New {
			t.Fatal(out, err)
		}
		if out, err := e.MarkIfAbsent(ctx, b); err != nil || out != engine.New {
			t.Fatalf("%v: the second constructed key = %v, %v; want New", o.Tiers, out, err)
		}
		_ = e.Close()
	}
}

// TestDigestsComparedAtFullWidth: digests that differ only in bytes 8-15
// are a Conflict from memory and from disk alike.
func TestDigestsComparedAtFullWidth(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, ExpectedKeys: 1000}
	e := open(t, o)
	var d1, d2 engine.Digest
	d1[0], d2[0] = 1, 1
	d1[15], d2[15] = 1, 2
	ns, _ := e.Namespace("")
	c, err := ns.ClaimDigest(ctx, []byte("k"), d1)
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	if err := e.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	check := func(where string) {
		t.Helper()
		for _, tt := range []struct {
			d    engine.Digest
			want engine.Outcome
		}{{d2, engine.Conflict}, {d1, engine.Duplicate}, {engine.Digest{}, engine.Duplicate}} {
			if c, err := ns.ClaimDigest(ctx, []byte("k"), tt.d); err != nil || c.Outcome != tt.want {
				t.Fatalf("%s: digest %x = %v, %v; want %v", where, tt.d, c.Outcome, err, tt.want)
			}
		}
	}
	check("from memory")
	_ = e.Close()
	e = open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, ExpectedKeys: 1000})
	defer e.Close()
	ns, _ = e.Namespace("")
	check("from disk")
}

// TestAttemptsAreDurable: with MaxAttempts, a key's failed attempts
// (releases and lease expiries) are stored with it in the embedded store,
// so a crash, a clean restart or an evicted memory entry forgets none of
// them, and a key made poison by lease expiries stays poison for the
// window, not just one more lease.
func TestAttemptsAreDurable(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("handler failed")
	fail := func(context.Context) error { return boom }
	for _, restart := range []string{"crash", "clean", "eviction"} {
		t.Run(restart, func(t *testing.T) {
			mem := newCrashFS()
			clock := newClock()
			o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, MaxAttempts: 3, ExpectedKeys: 1000, Lease: time.Minute, MemoryCapacity: 16, Stripes: 1}
			e := open(t, o)
			reopen := func() {
				switch restart {
				case "crash":
					crashed := mem.CrashClone(vfs.CrashCloneCfg{})
					_ = e.Close()
					mem = crashed
					setFS(&o, crashed)
				case "clean":
					_ = e.Close()
				case "eviction": // fill the memory tier past its capacity
					for i := range 64 {
						if _, err := e.MarkIfAbsent(ctx, fmt.Appendf(nil, "filler-%d", i)); err != nil {
							t.Fatal(err)
						}
					}
					return
				}
				e = open(t, o)
			}
			if out, err := e.Do(ctx, []byte("released"), fail); out != engine.New || !errors.Is(err, boom) {
				t.Fatal(out, err)
			}
			// The second attempt's lease runs out (its worker hung), seen
			// by the next claim in this process, whose handler fails too.
			// (A claim abandoned by a crash is void at open and not
			// counted: the embedded store keeps no claims.)
			if c, err := e.Claim(ctx, []byte("released")); err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			clock.Add(2 * time.Minute)
			c, err := e.Claim(ctx, []byte("released"))
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			if err := e.Release(ctx, c); err != nil {
				t.Fatal(err)
			}
			reopen()
			if out, err := e.Do(ctx, []byte("released"), func(context.Context) error { return nil }); out != engine.Poison || err != nil {
				t.Fatalf("after a release, an expiry and a release, then a %s = %v, %v; want Poison", restart, out, err)
			}

			// Three lease expiries make a key poison; it stays poison for
			// the window.
			for i := range 4 {
				want := engine.New
				if i == 3 {
					want = engine.Poison
				}
				c, err := e.Claim(ctx, []byte("expired"))
				if err != nil || c.Outcome != want {
					t.Fatalf("claim %d = %v, %v; want %v", i, c.Outcome, err, want)
				}
				clock.Add(2 * time.Minute)
			}
			reopen()
			clock.Add(time.Hour)
			if c, err := e.Claim(ctx, []byte("expired")); err != nil || c.Outcome != engine.Poison {
				t.Fatalf("an hour after three lease expiries = %v, %v; want Poison", c.Outcome, err)
			}
			_ = e.Close()
		})
	}
}

var waitWarm = enginetest.WaitWarm
