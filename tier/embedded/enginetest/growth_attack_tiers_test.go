package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestGrowthAttackBloomOnly combines bloom-only (its filters are its
// state: they must not grow) with ExpectedKeys large enough for a growing
// ring to have steps: the filters take their full size at the first key,
// keep every key across a clean Close and reopen, and refuse a changed
// ExpectedKeys (ErrLayout) instead of dropping the state.
func TestGrowthAttackBloomOnly(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	expected := 400_000
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: dir}, Clock: clock, ExpectedKeys: expected, Window: 4 * time.Hour, Partition: time.Hour, MemoryCapacity: 1}
	parts, err := tier.NewPartitions(o.Window, o.Partition)
	if err != nil {
		t.Fatal(err)
	}
	full := bloom.Sizing(expected, bloom.DefaultFalsePositive, parts.Live).Bytes
	e := open(t, o)
	keys := gaMarkSeq(t, e, "bo", 0, gaScale(30000, 3))
	if b := e.Stats().Bloom.Bytes; b != full {
		t.Fatalf("bloom-only filters hold %d bytes, want the full %d (no growth)", b, full)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	if b := e.Stats().Bloom.Bytes; b != full {
		t.Fatalf("bloom-only filters after reopen hold %d bytes, want %d", b, full)
	}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, oc := range out {
		if oc != engine.Duplicate {
			t.Fatalf("bloom-only after reopen: acknowledged key %s is %v", keys[i], oc)
		}
	}
	more := gaMarkSeq(t, e, "bo2", 0, gaScale(20000, 3))
	_ = more
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	o2 := o
	o2.ExpectedKeys = expected * 2
	o2.Logger = quiet
	if e2, err := engine.Open(&o2); err == nil {
		_ = e2.Close()
		t.Fatal("bloom-only reopened with another ExpectedKeys: its state should be refused (ErrLayout)")
	} else if !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("bloom-only with another ExpectedKeys: %v, want ErrLayout", err)
	}
	e = open(t, o)
	defer e.Close()
	all := append(keys, more...)
	out = make([]engine.Outcome, len(all))
	if err := e.MarkBatch(context.Background(), all, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, oc := range out {
		if oc != engine.Duplicate {
			t.Fatalf("bloom-only after the refused open: acknowledged key %s is %v", all[i], oc)
		}
	}
}

// TestGrowthAttackMemoryTierGrows combines the memory tier's growing
// table (default capacity, memory only) with many goroutines marking
// fresh keys (the table grows 4x at a time under them) and goroutines
// re-marking acknowledged keys: none is lost; then claims held in flight
// beyond a small table's full slab (it grows past it) are each InFlight
// to a second claim, and Duplicate once committed.
func TestGrowthAttackMemoryTierGrows(t *testing.T) {
	e := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock()})
	defer e.Close()
	var l ledger
	var next atomic.Int64
	total := int64(gaScale(400000, 4))
	stop := make(chan struct{})
	checkErr := gaRemarker(e, &l, stop, nil, 5000, 0, "memory growing")
	err := gaMarkFresh(e, &l, "mem", &next, total, 4, 512, nil)
	close(stop)
	if cerr := <-checkErr; cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	gaAllDuplicateMem(t, e, l.keys, "memory tier after growth")

	// Claims in flight beyond a small table's slab.
	// 64 committed keys a stripe (256 stripes): the held claims outgrow
	// each stripe's full slab.
	e2 := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: newClock(), MemoryCapacity: 64 * 256})
	defer e2.Close()
	n := gaScale(40000, 4)
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "held-%d", i)
	}
	claims := make([]engine.Claim, n)
	var wg sync.WaitGroup
	const workers = 4
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w * 256; i < n; i += workers * 256 {
				b := keys[i:min(i+256, n)]
				if err := e2.ClaimBatch(context.Background(), b, nil, claims[i:i+len(b)]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.Outcome != engine.New {
			t.Fatalf("first claim of %s: %v", keys[i], c.Outcome)
		}
	}
	again := make([]engine.Claim, n)
	for i := 0; i < n; i += 1024 {
		b := keys[i:min(i+1024, n)]
		if err := e2.ClaimBatch(context.Background(), b, nil, again[i:i+len(b)]); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range again {
		if c.Outcome != engine.InFlight {
			t.Fatalf("second claim of held key %s (%d held): %v, want InFlight", keys[i], n, c.Outcome)
		}
	}
	// Commit the last 900 (a few a stripe: the capacity holds them all):
	// Duplicate after.
	for i := n - 900; i < n; i++ {
		if err := e2.Commit(context.Background(), claims[i]); err != nil {
			t.Fatalf("commit %s: %v", keys[i], err)
		}
	}
	out := make([]engine.Outcome, 900)
	if err := e2.MarkBatch(context.Background(), keys[n-900:], nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.Duplicate {
			t.Fatalf("committed key %s: %v, want Duplicate", keys[n-900+i], o)
		}
	}
}

// gaAllDuplicateMem is gaAllDuplicate without waiting for filters.
func gaAllDuplicateMem(t testing.TB, e *engine.Engine, keys [][]byte, what string) {
	t.Helper()
	out := make([]engine.Outcome, 1024)
	for i := 0; i < len(keys); i += 1024 {
		b := keys[i:min(i+1024, len(keys))]
		if err := e.MarkBatch(context.Background(), b, nil, out[:len(b)]); err != nil {
			t.Fatal(err)
		}
		for j, o := range out[:len(b)] {
			if o != engine.Duplicate {
				t.Fatalf("%s: acknowledged key %s is %v", what, b[j], o)
			}
		}
	}
}

// TestGrowthAttackDefaultMemoryWithStore combines the default memory
// capacity (the table grows under the marks) with the embedded store and
// concurrent Claim/Commit and MarkBatch of overlapping keys while the
// filters grow: of the concurrent claims of a key exactly one is New, and
// every committed key is a Duplicate after a crash and reopen.
func TestGrowthAttackDefaultMemoryWithStore(t *testing.T) {
	mem := newCrashFS()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: newClock(), ExpectedKeys: gaExpected()}
	e := open(t, o)
	n := gaScale(120000, 4)
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "dm-%d", i)
	}
	var news atomic.Int64
	newCount := make([]atomic.Int32, n)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Every worker walks all keys, from its own offset, half by
			// MarkBatch and half by ClaimBatch + CommitBatch.
			off := w * n / 4
			const batch = 300
			out := make([]engine.Outcome, batch)
			cl := make([]engine.Claim, batch)
			for s := 0; s < n; s += batch {
				idx := make([]int, 0, batch)
				b := make([][]byte, 0, batch)
				for i := s; i < min(s+batch, n); i++ {
					k := (i + off) % n
					idx = append(idx, k)
					b = append(b, keys[k])
				}
				if (s/batch+w)%2 == 0 {
					if err := e.MarkBatch(context.Background(), b, nil, out[:len(b)]); err != nil {
						errs <- err
						return
					}
					for j, oc := range out[:len(b)] {
						if oc == engine.New {
							newCount[idx[j]].Add(1)
							news.Add(1)
						} else if oc != engine.Duplicate && oc != engine.InFlight {
							errs <- fmt.Errorf("mark of %s: %v", b[j], oc)
							return
						}
					}
					continue
				}
				if err := e.ClaimBatch(context.Background(), b, nil, cl[:len(b)]); err != nil {
					errs <- err
					return
				}
				var commit []engine.Claim
				for j, c := range cl[:len(b)] {
					switch c.Outcome {
					case engine.New:
						newCount[idx[j]].Add(1)
						news.Add(1)
						commit = append(commit, c)
					case engine.Duplicate, engine.InFlight:
					default:
						errs <- fmt.Errorf("claim of %s: %v", b[j], c.Outcome)
						return
					}
				}
				if len(commit) > 0 {
					if err := e.CommitBatch(context.Background(), commit, nil); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for i := range newCount {
		if c := newCount[i].Load(); c != 1 {
			t.Fatalf("key %s answered New %d times (want exactly once)", keys[i], c)
		}
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	e = gaOpen(t, o)
	defer e.Close()
	gaAllDuplicate(t, e, keys, "default memory, after a crash")
}

// TestGrowthAttackWideWindow combines a window of 25 live partitions
// (blocks of 4 cache lines, lanes of 25 bits: another layout than the
// default's) with growth across partitions written at different steps
// (hour 0 small, hour 1 through several doublings, hour 2 after them),
// checkpoints, seals, a crash and reopen, then a clean Close and reopen.
func TestGrowthAttackWideWindow(t *testing.T) {
	enginetest.SetCheckpointKeys(4000)
	defer enginetest.SetCheckpointKeys(0)
	mem := newCrashFS()
	clock := newClock()
	const expected = 1_000_000
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, ExpectedKeys: expected, Window: 24 * time.Hour, Partition: time.Hour}
	e := gaOpen(t, o)
	var all [][]byte
	all = append(all, gaMarkSeq(t, e, "w0", 0, 1500)...)
	small := e.Stats().Bloom.Bytes
	clock.Add(time.Hour)
	var l ledger
	var next atomic.Int64
	if err := gaMarkFresh(e, &l, "w1", &next, int64(gaScale(40000, 2)), 3, 400, nil); err != nil {
		t.Fatal(err)
	}
	all = append(all, l.keys...)
	grown := e.Stats().Bloom.Bytes
	if grown < int64(gaScaleUp(8))*small {
		t.Fatalf("the ring went from %d to %d bytes: no growth to attack", small, grown)
	}
	clock.Add(time.Hour)
	all = append(all, gaMarkSeq(t, e, "w2", 0, 3000)...)
	gaWaitSealed(t, e, 2)
	gaAllDuplicate(t, e, all, "wide window, before the crash")
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	e = gaOpen(t, o)
	st := e.Stats().Bloom
	gaAllDuplicate(t, e, all, fmt.Sprintf("wide window, after a crash (sealed loaded %d, restored %d, rebuilt %d)", st.SealedLoaded, st.Restored, st.RebuiltKeys))
	all = append(all, gaMarkSeq(t, e, "w2b", 0, gaScale(20000, 2))...)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = gaOpen(t, o)
	defer e.Close()
	gaAllDuplicate(t, e, all, "wide window, after a clean Close")
}

// TestGrowthAttackBloomOnlyCrash combines bloom-only on a crashable
// filesystem (ExpectedKeys large enough for a growing ring to have
// steps) with a clean Close, more keys, and a crash: the reopened state is
// the last clean Close's, every key acknowledged before it a Duplicate.
func TestGrowthAttackBloomOnlyCrash(t *testing.T) {
	mem := newCrashFS()
	o := engine.Options{Tiers: engine.BloomOnly, Backend: &embedded.Backend{Dir: "bo", FS: mem}, Clock: newClock(), ExpectedKeys: 300_000, MemoryCapacity: 1}
	e := open(t, o)
	before := gaMarkSeq(t, e, "boc", 0, gaScale(20000, 2))
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	e = open(t, o)
	_ = gaMarkSeq(t, e, "boc-after", 0, gaScale(20000, 2))
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	out := make([]engine.Outcome, len(before))
	if err := e.MarkBatch(context.Background(), before, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, oc := range out {
		if oc != engine.Duplicate {
			t.Fatalf("bloom-only after a crash: key %s acknowledged before the last clean Close is %v", before[i], oc)
		}
	}
}

// TestGrowthAttackExportDuringGrowth combines an Export taken while
// concurrent marks grow the ring (sealed files and checkpoints at the
// steps they were written at, in the export) with its Import into a
// fresh directory, opened with the same options (files copied up or the
// ring grown at Open) and with another ExpectedKeys (files refused,
// rebuilt): every key acknowledged before the Export is a Duplicate.
func TestGrowthAttackExportDuringGrowth(t *testing.T) {
	enginetest.SetCheckpointKeys(5000)
	defer enginetest.SetCheckpointKeys(0)
	root := t.TempDir()
	clock := newClock()
	const expected = 2_000_000
	o := engine.Options{Backend: embedded.Dir(root + "/src"), Clock: clock, ExpectedKeys: expected, Window: 4 * time.Hour, Partition: time.Hour}
	e := gaOpen(t, o)
	defer e.Close()
	sealedKeys := gaMarkSeq(t, e, "x0", 0, 3000) // hour 0, the smallest step
	clock.Add(time.Hour)
	var l ledger
	l.add(sealedKeys)
	l.add(gaMarkSeq(t, e, "x1-first", 0, 1))
	gaWaitSealed(t, e, 1)
	var next atomic.Int64
	total := int64(expected/32 + expected/40)
	done := make(chan error, 1)
	go func() { done <- gaMarkFresh(e, &l, "x1", &next, total, 3, 500, nil) }()
	for l.len() < int(total)/3 {
		time.Sleep(time.Millisecond)
	}
	acked := l.snapshot()
	exp := root + "/export"
	if _, err := e.Export(context.Background(), exp, 1); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i, exp2 := range []int{expected, expected / 4} {
		dst := o
		dst.ExpectedKeys = exp2
		setDir(&dst, fmt.Sprintf("%s/dst%d", root, i))
		if _, err := importExport(context.Background(), exp, &dst, 0); err != nil {
			t.Fatal(err)
		}
		r := gaOpen(t, dst)
		st := r.Stats().Bloom
		gaAllDuplicate(t, r, acked, fmt.Sprintf("imported with ExpectedKeys %d (sealed loaded %d, restored %d)", exp2, st.SealedLoaded, st.Restored))
		more := gaMarkSeq(t, r, fmt.Sprintf("imp%d", i), 0, 20000)
		gaAllDuplicate(t, r, append(append([][]byte(nil), acked...), more...), fmt.Sprintf("imported with ExpectedKeys %d, grown", exp2))
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
