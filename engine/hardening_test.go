package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestClockBefore1970IsNoProgress: the clock steps back to 1600, a date
// Time.UnixNano cannot represent (it would wrap to 2184, a jump far past
// the window). The reading must be no progress: a committed key stays a
// Duplicate.
func TestClockBefore1970IsNoProgress(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}, Clock: clock})
	defer e.Close()
	if o, err := e.MarkIfAbsent(ctx, []byte("paid-order")); err != nil || o != engine.New {
		t.Fatal(o, err)
	}
	clock.Set(time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC)) // a clock stepping back
	if o, err := e.MarkIfAbsent(ctx, []byte("paid-order")); err != nil || o != engine.Duplicate {
		t.Fatalf("after the clock stepped back to 1600: %v, %v; want Duplicate", o, err)
	}
}

// TestClockNear2262IsNoProgress: a clock within a lease of the end of
// int64 nanoseconds would overflow now+lease. Open refuses it when nothing
// earlier was seen, and a running engine takes it as no progress, so a
// second claim inside the first's lease is InFlight.
func TestClockNear2262IsNoProgress(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	if _, err := engine.Open(&engine.Options{Tiers: engine.MemoryOnly, Clock: enginetest.ClockAt(time.Unix(0, 1<<63-1-int64(10*time.Second)))}); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("Open with a clock at 2262 and no earlier reading = %v, want ErrOptions", err)
	}
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock})
	defer e.Close()
	clock.Set(time.Unix(0, 1<<63-1-int64(10*time.Second))) // 2262-04-11
	c1, err := e.Claim(ctx, []byte("k"))
	if err != nil || c1.Outcome != engine.New {
		t.Fatal(c1.Outcome, err)
	}
	if c2, err := e.Claim(ctx, []byte("k")); err != nil || c2.Outcome != engine.InFlight {
		t.Fatalf("second claim inside the first's lease: %v, %v; want InFlight (lease until %d)", c2.Outcome, err, c1.LeaseUntil)
	}
}

// TestClaimKeyMutatedBeforeCommit: a caller reuses its read buffer (or
// reassigns Claim.Key) between Claim and Commit. The commit must be refused
// and change nothing, so after a restart the claimed key is not
// acknowledged and the other key is not a false Duplicate.
func TestClaimKeyMutatedBeforeCommit(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewMem()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}}
	e := open(t, o)
	buf := []byte("msg-A")
	c, err := e.Claim(ctx, buf)
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	copy(buf, "msg-B") // the consumer's read buffer, reused for the next message
	cerr := e.Commit(ctx, c)
	if cerr != nil {
		t.Logf("commit refused: %v", cerr) // what a fix may do
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	defer e.Close()
	a, _ := e.Claim(ctx, []byte("msg-A"))
	b, _ := e.Claim(ctx, []byte("msg-B"))
	if cerr == nil && a.Outcome != engine.Duplicate {
		t.Errorf("acknowledged msg-A after restart: %v, want Duplicate", a.Outcome)
	}
	if b.Outcome != engine.New {
		t.Errorf("never-claimed msg-B after restart: %v, want New", b.Outcome)
	}
}

// TestBloomOnlyDirIsExclusive: two bloom-only engines on one Dir (a rolling
// restart's overlap) would each save their state at Close, the last erasing
// the other's keys: the second Open must be refused with ErrLocked, as the
// default configuration's is, or the first's keys must survive.
func TestBloomOnlyDirIsExclusive(t *testing.T) {
	ctx := context.Background()
	mem := vfs.NewMem()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "bloom", FS: mem}, ExpectedKeys: 1000}
	old := open(t, o)
	neu, err := engine.Open(&engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "bloom", FS: mem}, ExpectedKeys: 1000, Logger: quiet})
	if err != nil {
		old.Close()
		t.Logf("second Open refused: %v", err) // what a fix may do
		return
	}
	if o, err := old.MarkIfAbsent(ctx, []byte("acked-by-old")); err != nil || o != engine.New {
		t.Fatal(o, err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	if err := neu.Close(); err != nil {
		t.Fatal(err)
	}
	e := open(t, o)
	defer e.Close()
	if got, err := e.MarkIfAbsent(ctx, []byte("acked-by-old")); err != nil || got != engine.Duplicate {
		t.Fatalf("key acknowledged by the first engine, after both closed cleanly: %v, %v; want Duplicate (or the second Open refused)", got, err)
	}
}

// TestScanWritesReadErrorIsTyped: a read error while scanning the caller's
// records (a consumed offset stored with the commits) must be ErrStorage
// and latch, like every other read of the store.
func TestScanWritesReadErrorIsTyped(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	// A block cache of one byte: Open's own reads (the journal's end, the
	// layout checks) would otherwise leave the one small table's blocks
	// cached, and ScanWrites would never read the filesystem.
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem, CacheSize: 1}, ExpectedKeys: 1000}
	e := open(t, o)
	c, err := e.Claim(ctx, []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := e.CommitBatchWith(ctx, []engine.Claim{c}, nil, []engine.Write{{Key: []byte("offset"), Value: []byte("42")}}); err != nil {
		t.Fatal(err)
	}
	if err := e.Compact(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	// Which read reaches the filesystem varies (background compactions
	// after the partition drop at Open rewrite the table and may leave its
	// blocks cached): compact first, and try a number of opens.
	for try := 0; try < 60; try++ {
		var fault faultfs.Fault
		setFS(&o, faultfs.Wrap(mem.CrashClone(vfs.CrashCloneCfg{}), &fault))
		e = open(t, o)
		if err := e.Compact(ctx); err != nil {
			t.Fatal(err)
		}
		fault.Arm(faultfs.SSTReads)
		seen := 0
		err = e.ScanWrites(nil, func(k, v []byte) error { seen++; return nil })
		fault.Disarm()
		_ = e.Close()
		if err == nil && seen == 0 {
			t.Fatal("ScanWrites with failing SST reads returned nil and no record")
		}
		if err == nil {
			continue
		}
		if !errors.Is(err, engine.ErrStorage) {
			t.Fatalf("ScanWrites with a failing read: %v; want an error matching ErrStorage", err)
		}
		t.Logf("an injected read error reached ScanWrites at open %d", try+1)
		return
	}
	t.Fatal("no injected read error reached ScanWrites: the test exercised nothing")
}
