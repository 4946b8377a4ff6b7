package enginetest_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestGrowthAttackSealSmallThenGrow combines a partition sealed while the
// ring is at its smallest step, then another that grows the ring through
// its steps, then a machine crash: the sealed file, of a smaller step, is
// merged into the larger ring (copied up) and the open partition restored
// or rebuilt; and the reverse (a partition sealed at a large step, a small
// open one, a crash: the seal grows the fresh ring at Open).
func TestGrowthAttackSealSmallThenGrow(t *testing.T) {
	for _, order := range []string{"small-then-large", "large-then-small"} {
		t.Run(order, func(t *testing.T) {
			const expected = 2_000_000
			mem := newCrashFS()
			clock := newClock()
			o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, ExpectedKeys: expected, Window: 4 * time.Hour, Partition: time.Hour}
			e := gaOpen(t, o)
			large := (expected/32 + expected/40) / 2
			if enginetest.RaceEnabled() {
				large = 20000 // past two of the four doublings
			}
			sizes := []int{expected / 128 / 16 / 2, large}
			if order == "large-then-small" {
				sizes[0], sizes[1] = sizes[1], sizes[0]
			}
			first := gaMarkSeq(t, e, "h0", 0, sizes[0])
			afterFirst := e.Stats().Bloom.Bytes
			clock.Add(time.Hour)
			_ = gaMarkSeq(t, e, "h1-first", 0, 1) // rotates
			gaWaitSealed(t, e, 1)
			second := gaMarkSeq(t, e, "h1", 0, sizes[1])
			all := append(append([][]byte(nil), first...), second...)
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			afterSecond := e.Stats().Bloom.Bytes
			_ = e.Close()
			setFS(&o, crashed)
			e = gaOpen(t, o)
			st := e.Stats().Bloom
			if st.SealedLoaded != 1 {
				t.Fatalf("%d sealed partitions loaded, want 1", st.SealedLoaded)
			}
			if order == "small-then-large" && afterSecond < 4*afterFirst {
				t.Fatalf("the ring went from %d to %d bytes after the seal: not the growth under attack", afterFirst, afterSecond)
			}
			if order == "large-then-small" && st.Bytes < afterFirst {
				t.Fatalf("after the crash the ring holds %d bytes, less than the %d its sealed partition was written at", st.Bytes, afterFirst)
			}
			gaAllDuplicate(t, e, all, fmt.Sprintf("after the crash (filters %d then %d bytes before it)", afterFirst, afterSecond))
			// The restored ring goes on growing, and another partition
			// closes and is sealed at the grown step.
			third := gaMarkSeq(t, e, "h1-more", 0, gaScale(30000, 3))
			all = append(all, third...)
			clock.Add(time.Hour)
			_ = gaMarkSeq(t, e, "h2-first", 0, 1)
			gaWaitSealed(t, e, 2)
			fourth := gaMarkSeq(t, e, "h2", 0, gaScale(20000, 3))
			all = append(all, fourth...)
			running := crashed // the filesystem e runs on
			crashed = running.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			crashed2 := crashed.CrashClone(vfs.CrashCloneCfg{})
			setFS(&o, crashed)
			e = gaOpen(t, o)
			gaAllDuplicate(t, e, all, "after the second crash")
			_ = e.Close()
			// The same crashed state with another ExpectedKeys: every
			// sealed file refused, all rebuilt.
			o2 := o
			o2.ExpectedKeys = expected / 3
			setFS(&o2, crashed2)
			e = gaOpen(t, o2)
			defer e.Close()
			gaAllDuplicate(t, e, all, "after the second crash, reopened with another ExpectedKeys")
			_ = e.Close()
			// Again, with a longer window (more live partitions: another
			// layout, every file refused).
			crashed3 := crashed2.CrashClone(vfs.CrashCloneCfg{})
			o3 := o
			o3.Window = 6 * time.Hour
			setFS(&o3, crashed3)
			e3 := gaOpen(t, o3)
			defer e3.Close()
			gaAllDuplicate(t, e3, all, "after the second crash, reopened with a longer window")
		})
	}
}

// TestGrowthAttackRotationRacesGrowth combines concurrent marking that
// grows the ring with a clock that jumps to the next partition every few
// milliseconds (rotation, a new partition's filter, seals of partitions
// written at every step racing the doublings), keys staying inside the
// window; then a crash and reopen, and a clean Close and reopen.
func TestGrowthAttackRotationRacesGrowth(t *testing.T) {
	enginetest.SetCheckpointKeys(int64(gaScale(20000, 3)))
	defer enginetest.SetCheckpointKeys(0)
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, ExpectedKeys: gaExpected(), Window: 7 * time.Hour, Partition: time.Hour}
	e := gaOpen(t, o)
	var l ledger
	var next atomic.Int64
	total := int64(gaFull() * 3 / 2)
	done := make(chan error, 1)
	go func() { done <- gaMarkFreshClock(e, &l, "rot", &next, total, 4, 600, nil, true) }()
	// Six jumps of an hour spread over the run: every key stays live
	// (7-hour window, 8 live partitions).
	for jump := 1; jump <= 6; jump++ {
		for l.len() < int(total)*jump/7 && next.Load() < total {
			time.Sleep(200 * time.Microsecond)
		}
		clock.Add(time.Hour)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	gaAllDuplicate(t, e, l.keys, "after rotations racing growth")
	gaWaitSealed(t, e, 6)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	clean := mem
	setFS(&o, crashed)
	e = gaOpen(t, o)
	st := e.Stats().Bloom
	gaAllDuplicate(t, e, l.keys, fmt.Sprintf("after a crash (sealed loaded %d)", st.SealedLoaded))
	_ = e.Close()
	setFS(&o, clean)
	e = gaOpen(t, o)
	defer e.Close()
	gaAllDuplicate(t, e, l.keys, "after a clean Close")
}

// TestGrowthAttackRebuildRacesGrowth combines a crash with no usable
// checkpoint or seal (the rebuild scans Pebble and grows the fresh ring)
// with concurrent marks of fresh keys that grow it too, while the rebuild
// runs; once warm every key is a Duplicate, then after another crash.
func TestGrowthAttackRebuildRacesGrowth(t *testing.T) {
	const expected = 2_000_000
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, ExpectedKeys: expected}
	t0 := time.Now()
	e := gaOpen(t, o)
	first := gaMarkSeq(t, e, "before", 0, (expected/32+expected/40)/2)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	enginetest.SetNoRestore(true)
	defer enginetest.SetNoRestore(false)
	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	setFS(&o, crashed)
	e = gaOpen(t, o)
	if m := e.Stats().Bloom.Mode; m == "warm" {
		t.Fatalf("mode %s after a crash without restore", m)
	}
	var l ledger
	var next atomic.Int64
	done := make(chan error, 1)
	go func() { done <- gaMarkFresh(e, &l, "during", &next, int64((expected/32+expected/40)/2), 3, 500, nil) }()
	for l.len() < (expected/32+expected/40)/20 {
		time.Sleep(time.Millisecond)
	}
	t.Logf("%v: %d keys marked before the rebuild starts", time.Since(t0), l.len())
	close(gate) // the rebuild starts while marks grow the ring
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%v: marks done (%d keys), mode %s", time.Since(t0), l.len(), e.Stats().Bloom.Mode)
	all := append(append([][]byte(nil), first...), l.keys...)
	if r := e.Stats().Bloom.RebuiltKeys; r < uint64(len(first)) {
		t.Fatalf("rebuilt %d keys, want at least the %d marked before the crash", r, len(first))
	}
	gaAllDuplicate(t, e, all, "after a rebuild racing growth")
	t.Logf("%v: checked", time.Since(t0))
	enginetest.SetNoRestore(false)
	enginetest.SetRebuildGate(nil)
	crashed2 := crashed.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed2)
	e = gaOpen(t, o)
	defer e.Close()
	gaAllDuplicate(t, e, all, "after a second crash")
}
