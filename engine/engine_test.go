package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/internal/enginetest"

	"github.com/cockroachdb/pebble/v2/vfs"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

func TestOptionsValidateReportsEveryField(t *testing.T) {
	o := engine.Options{
		Tiers: engine.Tiers(9), Window: -1, Partition: -time.Second, Lease: -1,
		MemoryCapacity: -1, Stripes: 3, ExpectedKeys: -5, FalsePositive: 1.5, MaxKeySize: -1,
	}
	err := o.Validate()
	if !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("err = %v", err)
	}
	for _, field := range []string{"Tiers", "Window", "Partition", "Lease", "MemoryCapacity", "Stripes", "ExpectedKeys", "FalsePositive", "MaxKeySize"} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("error does not name %s:\n%v", field, err)
		}
	}
	bad := []engine.Options{
		{}, // Default needs Dir
		{Tiers: engine.MemoryOnly, Backend: embedded.Dir("x")},                    // memory-only has no Backend
		{Tiers: engine.MemoryOnly, Window: time.Hour, Lease: time.Hour},           // lease ≥ window
		{Tiers: engine.MemoryOnly, Window: 100 * time.Hour, Partition: time.Hour}, // too many partitions
		{Tiers: engine.BloomOnly, FalsePositive: 1e-12},                           // too many hashes
		{Tiers: engine.MemoryOnly, MaxKeySize: engine.MaxKeySize + 1},
		{Tiers: engine.MemoryOnly, Window: engine.MaxWindow + 1, Partition: engine.MaxWindow / 4},
		{Tiers: engine.MemoryOnly, Window: 8e18, Partition: 2e17},             // centuries: overflows time arithmetic
		{Tiers: engine.MemoryOnly, Partition: engine.MaxWindow + time.Second}, // a partition past the bound
		{Tiers: engine.BloomOnly, ExpectedKeys: 1 << 50},                      // petabyte filters
		{Tiers: engine.MemoryOnly, MemoryCapacity: 1 << 40},                   // past 32-bit entry indices
	}
	for i, o := range bad {
		if _, err := engine.Open(&o); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("case %d: Open = %v, want ErrOptions", i, err)
		}
	}
}

func TestBadInputIsTypedAndWritesNothing(t *testing.T) {
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000})
	defer e.Close()
	ctx := context.Background()
	if _, err := e.Claim(ctx, nil); !errors.Is(err, engine.ErrEmptyKey) {
		t.Errorf("empty key: %v", err)
	}
	if _, err := e.Claim(ctx, make([]byte, engine.DefaultMaxKeySize+1)); !errors.Is(err, engine.ErrKeyTooLong) {
		t.Errorf("long key: %v", err)
	}
	// A bad key anywhere in a batch rejects the whole batch before anything
	// is claimed.
	keys := [][]byte{[]byte("ok"), {}, []byte("also-ok")}
	err := e.ClaimBatch(ctx, keys, nil, make([]engine.Claim, 3))
	var ke *engine.KeyError
	if !errors.As(err, &ke) || ke.Index != 1 || !errors.Is(err, engine.ErrEmptyKey) {
		t.Fatalf("batch with an empty key: %v", err)
	}
	if c, _ := e.Claim(ctx, []byte("ok")); c.Outcome != engine.New {
		t.Fatalf("a rejected batch claimed its good keys: %v", c.Outcome)
	}
	if err := e.ClaimBatch(ctx, keys[:2], nil, make([]engine.Claim, 1)); !errors.Is(err, engine.ErrBatch) {
		t.Errorf("mismatched out: %v", err)
	}
	if _, err := e.Namespace(strings.Repeat("n", 256)); !errors.Is(err, engine.ErrNamespace) {
		t.Errorf("long namespace: %v", err)
	}
	if err := e.Commit(ctx, engine.Claim{Outcome: engine.Duplicate}); !errors.Is(err, engine.ErrNotClaimed) {
		t.Errorf("commit of a duplicate: %v", err)
	}
	if err := e.Commit(ctx, engine.Claim{Outcome: engine.New, Key: []byte("forged")}); !errors.Is(err, engine.ErrLeaseLost) {
		t.Errorf("commit of a forged claim: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.Claim(cctx, []byte("x")); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

// TestFencing: a worker whose lease expired and was taken over can neither
// commit nor release, and changes nothing by trying.
func TestFencing(t *testing.T) {
	for _, tiers := range []engine.Tiers{engine.Default, engine.MemoryOnly, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			clock := newClock()
			o := engine.Options{Tiers: tiers, Clock: clock, Lease: time.Second, ExpectedKeys: 1000}
			if tiers == engine.Default {
				setDir(&o, t.TempDir())
			}
			e := open(t, o)
			defer e.Close()
			ctx := context.Background()
			key := []byte("order-1")
			a, _ := e.Claim(ctx, key)
			if b, _ := e.Claim(ctx, key); b.Outcome != engine.InFlight {
				t.Fatalf("second claim inside the lease = %v", b.Outcome)
			}
			clock.Add(2 * time.Second)
			b, _ := e.Claim(ctx, key)
			if a.Outcome != engine.New || b.Outcome != engine.New {
				t.Fatalf("claims = %v, %v; want new, new (takeover)", a.Outcome, b.Outcome)
			}
			if err := e.Commit(ctx, a); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("commit by the fenced worker: %v", err)
			}
			if err := e.Release(ctx, a); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("release by the fenced worker: %v", err)
			}
			if c, _ := e.Claim(ctx, key); c.Outcome != engine.InFlight {
				t.Fatalf("the fenced worker's attempts changed the key: %v", c.Outcome)
			}
			if err := e.Commit(ctx, b); err != nil {
				t.Fatalf("commit by the owner: %v", err)
			}
			if c, _ := e.Claim(ctx, key); c.Outcome != engine.Duplicate {
				t.Fatalf("after commit = %v", c.Outcome)
			}
			if st := e.Stats(); st.Calls.LeaseExpiries != 1 || st.Calls.LeaseLost != 2 {
				t.Fatalf("stats: expiries %d lost %d", st.Calls.LeaseExpiries, st.Calls.LeaseLost)
			}
		})
	}
}

// TestConcurrentClaimsOneNewPerKey: 64 goroutines claim the same keys in
// different orders and batch sizes; exactly one claim per key is New.
func TestConcurrentClaimsOneNewPerKey(t *testing.T) {
	for _, cfg := range enginetest.Pick("default", "memory", "bloom", "redis", "redis-cluster") {
		t.Run(cfg.Name, func(t *testing.T) {
			s := cfg.New(t, "concurrent")
			e := open(t, s.Wrapped(engine.Options{ExpectedKeys: 10_000, MemoryCapacity: 4096}, enginetest.Wrap{Redis: &goredis.Options{PoolSize: 64}}))
			defer e.Close()
			tiers := engine.Default
			if cfg.Tiers == engine.BloomOnly {
				tiers = engine.BloomOnly
			}
			const workers, nkeys = 64, 500
			keys := make([][]byte, nkeys)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "6ba7b810-9dad-11d1-80b4-%012d", i)
			}
			var news [nkeys]atomic.Int32
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					order := make([]int, nkeys)
					for i := range order {
						order[i] = (i*7 + w*13) % nkeys
					}
					batch := 1 + w%16
					for i := 0; i < nkeys; i += batch {
						idx := order[i:min(i+batch, nkeys)]
						ks := make([][]byte, len(idx))
						for j, k := range idx {
							ks[j] = keys[k]
						}
						claims := make([]engine.Claim, len(ks))
						if err := e.ClaimBatch(context.Background(), ks, nil, claims); err != nil {
							t.Error(err)
							return
						}
						for j, c := range claims {
							if c.Outcome == engine.New {
								news[idx[j]].Add(1)
							}
						}
						if w%2 == 0 { // half commit, half keep their claims
							if err := e.CommitBatch(context.Background(), claims, nil); err != nil {
								t.Error(err)
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			for i := range news {
				n := news[i].Load()
				if n > 1 || (n == 0 && tiers != engine.BloomOnly) {
					t.Fatalf("key %d was New %d times", i, n)
				}
			}
		})
	}
}

// TestStorageFaults injects WAL write and sync failures: the failing commit
// and every later claim get ErrStorage (never New), and after a restart
// every commit acknowledged before the fault is still a Duplicate.
func TestStorageFaults(t *testing.T) {
	for name, wal := range map[string]faultfs.Match{"sync": faultfs.WALSyncs, "write": faultfs.WALWrites} {
		t.Run(name, func(t *testing.T) {
			mem := newCrashFS()
			var fault faultfs.Fault
			e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: faultfs.Wrap(mem, &fault)}, ExpectedKeys: 1000})
			ctx := context.Background()
			var acked [][]byte
			for i := range 50 {
				k := fmt.Appendf(nil, "acked-%d", i)
				if o, err := e.MarkIfAbsent(ctx, k); err != nil || o != engine.New {
					t.Fatalf("mark %s: %v %v", k, o, err)
				}
				acked = append(acked, k)
			}
			c, err := e.Claim(ctx, []byte("doomed"))
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			fault.Arm(wal)
			if err := e.Commit(ctx, c); !errors.Is(err, engine.ErrStorage) {
				t.Fatalf("commit under a failing WAL: %v, want ErrStorage", err)
			}
			fault.Disarm()
			if c, err := e.Claim(ctx, []byte("fresh")); !errors.Is(err, engine.ErrStorage) || c.Outcome == engine.New {
				t.Fatalf("claim after a storage failure = %v, %v; want ErrStorage and no New", c.Outcome, err)
			}
			if _, err := e.MarkIfAbsent(ctx, acked[0]); !errors.Is(err, engine.ErrStorage) {
				t.Fatalf("mark after a storage failure: %v", err)
			}
			if st := e.Stats(); st.Calls.Errors == 0 {
				t.Error("Stats.Calls.Errors did not count the failure")
			}
			_ = e.Close()

			e2 := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem.CrashClone(vfs.CrashCloneCfg{})}, ExpectedKeys: 1000})
			defer e2.Close()
			out := make([]engine.Claim, len(acked))
			if err := e2.ClaimBatch(ctx, acked, nil, out); err != nil {
				t.Fatal(err)
			}
			for i, c := range out {
				if c.Outcome != engine.Duplicate {
					t.Fatalf("acknowledged key %s is %v after the fault", acked[i], c.Outcome)
				}
			}
		})
	}
}

// TestRetention: a key is a duplicate for the whole window, New again once
// its partition expires, and the expired partition is dropped.
func TestRetention(t *testing.T) {
	for _, tiers := range []engine.Tiers{engine.Default, engine.MemoryOnly, engine.BloomOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			clock := newClock()
			o := engine.Options{Tiers: tiers, Clock: clock, Window: 48 * time.Hour, Partition: 24 * time.Hour, ExpectedKeys: 1000}
			if tiers == engine.Default {
				setDir(&o, t.TempDir())
			}
			e := open(t, o)
			defer e.Close()
			ctx := context.Background()
			key := []byte("k")
			if o, _ := e.MarkIfAbsent(ctx, key); o != engine.New {
				t.Fatal(o)
			}
			clock.Add(48*time.Hour - time.Second)
			if o, _ := e.MarkIfAbsent(ctx, key); o != engine.Duplicate {
				t.Fatalf("inside the window: %v", o)
			}
			// A clock step back is ignored: nothing expires early, nothing
			// is dropped.
			clock.Add(-72 * time.Hour)
			if o, _ := e.MarkIfAbsent(ctx, key); o != engine.Duplicate {
				t.Fatalf("after a clock step back: %v", o)
			}
			clock.Add(72*time.Hour + 24*time.Hour + time.Second)
			if o, _ := e.MarkIfAbsent(ctx, key); o != engine.New {
				t.Fatalf("past window + partition: %v", o)
			}
			if tiers != engine.MemoryOnly && e.Stats().Store.PartitionsDropped == 0 {
				t.Fatal("no partition was dropped")
			}
		})
	}
}

// TestColdStart: after a clean Close the filters come back from the
// snapshot (warm at once); after a crash the engine answers correctly from
// Pebble while the filters rebuild, then returns to the fast path.
func TestColdStart(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, ExpectedKeys: 10_000}
	e := open(t, o)
	keys := make([][]byte, 2000)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "key-%d", i)
	}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// Clean restart: warm from the snapshot.
	e = open(t, o)
	if st := e.Stats(); st.Bloom.Mode != "warm" || st.Bloom.RebuiltKeys != 0 {
		t.Fatalf("after a clean restart: mode %q, rebuilt %d", st.Bloom.Mode, st.Bloom.RebuiltKeys)
	}
	expectAll(t, e, keys, engine.Duplicate)
	before := e.Stats()
	expectAll(t, e, [][]byte{[]byte("brand-new")}, engine.New)
	if after := e.Stats(); after.Bloom.Negatives != before.Bloom.Negatives+1 || after.Store.Reads != before.Store.Reads {
		t.Fatalf("a new key read the disk while warm: %+v", after)
	}

	// Crash: reopen what was synced, with no snapshot, and no checkpoint
	// either (the scan path; TestCheckpointRestore has the restore).
	enginetest.SetNoRestore(true)
	defer enginetest.SetNoRestore(false)
	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	setFS(&o, crashed)
	e2 := open(t, o)
	defer e2.Close()
	if st := e2.Stats(); st.Bloom.Mode != "rebuilding" {
		t.Fatalf("after a crash: mode %q, want rebuilding", st.Bloom.Mode)
	}
	expectAll(t, e2, keys, engine.Duplicate)
	before = e2.Stats()
	expectAll(t, e2, [][]byte{[]byte("another-new")}, engine.New)
	if after := e2.Stats(); after.Store.Reads != before.Store.Reads+1 {
		t.Fatalf("a new key skipped the disk while cold")
	}
	close(gate)
	deadline := time.Now().Add(10 * time.Second)
	for e2.Stats().Bloom.Mode != "warm" {
		if time.Now().After(deadline) {
			t.Fatal("the rebuild did not finish")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if st := e2.Stats(); st.Bloom.RebuiltKeys < uint64(len(keys)) {
		t.Fatalf("rebuilt %d keys, want ≥ %d", st.Bloom.RebuiltKeys, len(keys))
	}
	expectAll(t, e2, keys, engine.Duplicate)
	before = e2.Stats()
	expectAll(t, e2, [][]byte{[]byte("third-new")}, engine.New)
	if after := e2.Stats(); after.Store.Reads != before.Store.Reads {
		t.Fatalf("a new key read the disk after the rebuild")
	}
	_ = e.Close()
}

func expectAll(t *testing.T, e *engine.Engine, keys [][]byte, want engine.Outcome) {
	t.Helper()
	out := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, c := range out {
		if c.Outcome != want {
			t.Fatalf("key %s = %v, want %v", keys[i], c.Outcome, want)
		}
	}
	_ = e.ReleaseBatch(context.Background(), out, nil)
}

func TestDoReleasesOnErrorAndPanic(t *testing.T) {
	e := open(t, engine.Options{Tiers: engine.MemoryOnly})
	defer e.Close()
	ctx := context.Background()
	boom := errors.New("handler failed")
	o, err := e.Do(ctx, []byte("k"), func(context.Context) error { return boom })
	if o != engine.New || !errors.Is(err, boom) {
		t.Fatalf("Do with a failing handler = %v, %v", o, err)
	}
	func() {
		defer func() { _ = recover() }()
		_, _ = e.Do(ctx, []byte("k"), func(context.Context) error { panic("handler panicked") })
	}()
	runs := 0
	o, err = e.Do(ctx, []byte("k"), func(context.Context) error { runs++; return nil })
	if o != engine.New || err != nil || runs != 1 {
		t.Fatalf("redelivery after failures = %v, %v, runs %d", o, err, runs)
	}
	o, err = e.Do(ctx, []byte("k"), func(context.Context) error { runs++; return nil })
	if o != engine.Duplicate || err != nil || runs != 1 {
		t.Fatalf("after success = %v, %v, runs %d", o, err, runs)
	}
	if st := e.Stats(); st.Calls.Releases != 2 || st.Calls.Commits != 1 {
		t.Fatalf("stats: releases %d commits %d", st.Calls.Releases, st.Calls.Commits)
	}
}

func TestSecondOpenIsLocked(t *testing.T) {
	dir := t.TempDir()
	e := open(t, engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000})
	defer e.Close()
	if _, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), Logger: quiet}); !errors.Is(err, engine.ErrLocked) {
		t.Fatalf("second Open: %v", err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := e.Claim(context.Background(), []byte("k")); !errors.Is(err, engine.ErrClosed) {
		t.Fatalf("claim after close: %v", err)
	}
}

// TestPoisonAfterMaxAttempts: a message whose handler keeps failing is
// released MaxAttempts times, then answered Poison (claiming nothing) so the
// consumer can dead-letter it; a key that succeeds is unaffected.
func TestPoisonAfterMaxAttempts(t *testing.T) {
	for _, tiers := range []engine.Tiers{engine.Default, engine.MemoryOnly} {
		t.Run(tiers.String(), func(t *testing.T) {
			o := engine.Options{Tiers: tiers, MaxAttempts: 3, ExpectedKeys: 1000}
			if tiers == engine.Default {
				setDir(&o, t.TempDir())
			}
			e := open(t, o)
			defer e.Close()
			ctx := context.Background()
			boom := errors.New("handler failed")
			runs := 0
			for i := range 3 {
				out, err := e.Do(ctx, []byte("poison"), func(context.Context) error { runs++; return boom })
				if out != engine.New || !errors.Is(err, boom) {
					t.Fatalf("attempt %d = %v, %v", i+1, out, err)
				}
			}
			out, err := e.Do(ctx, []byte("poison"), func(context.Context) error { runs++; return nil })
			if out != engine.Poison || err != nil || runs != 3 {
				t.Fatalf("after 3 failures = %v, %v (handler ran %d times)", out, err, runs)
			}
			if o, _ := e.Do(ctx, []byte("fine"), func(context.Context) error { return nil }); o != engine.New {
				t.Fatalf("another key = %v", o)
			}
			if st := e.Stats(); st.Calls.Poisoned != 1 {
				t.Fatalf("Stats.Calls.Poisoned = %d", st.Calls.Poisoned)
			}
		})
	}
}

// TestCommitBatchWithWritesAtomically: the caller's records become durable
// with the commit (they survive a crash of the filesystem together), and
// are refused outside the embedded store.
func TestCommitBatchWithWritesAtomically(t *testing.T) {
	mem := newCrashFS()
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, ExpectedKeys: 1000})
	ctx := context.Background()
	keys := [][]byte{[]byte("m1"), []byte("m2"), []byte("m1")}
	claims := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(ctx, keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	var writes []engine.Write
	for _, c := range claims {
		if c.Owned() {
			writes = append(writes, engine.Write{Key: append([]byte("ledger/"), c.Key...), Value: []byte("effect")})
		}
	}
	if err := e.CommitBatchWith(ctx, claims, nil, writes); err != nil {
		t.Fatal(err)
	}
	e2 := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem.CrashClone(vfs.CrashCloneCfg{})}, ExpectedKeys: 1000})
	defer e2.Close()
	var got []string
	if err := e2.ScanWrites([]byte("ledger/"), func(k, v []byte) error {
		got = append(got, string(k)+"="+string(v))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "ledger/m1=effect,ledger/m2=effect" {
		t.Fatalf("ledger after a crash: %v", got)
	}
	expectAll(t, e2, keys[:2], engine.Duplicate)
	_ = e.Close()

	m := open(t, engine.Options{Tiers: engine.MemoryOnly})
	defer m.Close()
	if err := m.CommitBatchWith(ctx, nil, nil, writes); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("CommitBatchWith without a store: %v", err)
	}
}
