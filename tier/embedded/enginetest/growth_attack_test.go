package enginetest_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestGrowthAttackConcurrentGrowth combines many goroutines marking large
// batches of fresh keys while the ring grows through all its steps (one
// partition, default window, on a real directory) with goroutines that
// re-mark and look up keys acknowledged before them (probes racing the
// copy of each doubling); then every key is a Duplicate, and the ring did
// grow.
func TestGrowthAttackConcurrentGrowth(t *testing.T) {
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), Clock: newClock(), ExpectedKeys: gaExpected()}
	e := gaOpen(t, o)
	defer e.Close()
	var l ledger
	l.add(gaMarkSeq(t, e, "cg-first", 0, 1))
	start := e.Stats().Bloom.Bytes
	var next atomic.Int64
	total := int64(gaFull())
	stop := make(chan struct{})
	checkErr := make(chan error, 1)
	var checks atomic.Int64
	go func() {
		// Re-mark and look up acknowledged keys while the ring grows.
		rng := rand.New(rand.NewPCG(1, 2))
		out := make([]engine.Outcome, 256)
		infos := make([]engine.KeyInfo, 256)
		for {
			select {
			case <-stop:
				checkErr <- nil
				return
			default:
			}
			keys := l.snapshot()
			if len(keys) < 256 {
				time.Sleep(time.Millisecond)
				continue
			}
			b := make([][]byte, 256)
			for i := range b {
				// Mostly the newest keys: those added around a growth.
				j := len(keys) - 1 - rng.IntN(min(len(keys), 4096))
				if i%4 == 0 {
					j = rng.IntN(len(keys))
				}
				b[i] = keys[j]
			}
			if err := e.MarkBatch(context.Background(), b, nil, out); err != nil {
				checkErr <- err
				return
			}
			for i, o := range out {
				if o != engine.Duplicate {
					checkErr <- fmt.Errorf("during growth (%d keys acknowledged), acknowledged key %s marked %v", len(keys), b[i], o)
					return
				}
			}
			if err := e.LookupBatch(context.Background(), b, infos); err != nil {
				checkErr <- err
				return
			}
			for i, info := range infos {
				if info.Outcome != engine.Duplicate {
					checkErr <- fmt.Errorf("during growth, lookup of acknowledged key %s: %v", b[i], info.Outcome)
					return
				}
			}
			checks.Add(1)
		}
	}()
	err := gaMarkFresh(e, &l, "cg", &next, total, 4, 1000, nil)
	close(stop)
	if cerr := <-checkErr; cerr != nil {
		t.Fatal(cerr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if checks.Load() == 0 {
		t.Fatal("no check ran during the growth")
	}
	grown := e.Stats().Bloom.Bytes
	if grown < int64(gaScaleUp(16))*start || start == 0 {
		t.Fatalf("the filters went from %d to %d bytes: no growth to attack", start, grown)
	}
	gaAllDuplicate(t, e, l.keys, "after concurrent growth")
	gaLookupAll(t, e, l.keys[:min(len(l.keys), 20000)], "after concurrent growth")
	t.Logf("%d keys, %d checks; filters %d → %d bytes", len(l.keys), checks.Load(), start, grown)
}

// TestGrowthAttackCrashDuringGrowth combines concurrent marking through
// every step of growth with frequent checkpoints (taken at one step,
// restored into another) and machine crashes (CrashClone) at random points
// of the growth; each clone is reopened (restore from the checkpoint and
// the journal, or rebuild), must hold every key acknowledged before its
// crash, then takes more keys (growth after restore), crashes again and
// reopens.
func TestGrowthAttackCrashDuringGrowth(t *testing.T) {
	enginetest.SetCheckpointKeys(int64(gaScale(6000, 2)))
	defer enginetest.SetCheckpointKeys(0)
	mem := newCrashFS()
	clock := newClock()
	// 2M keys a partition: four doublings, the last at 62.5k keys.
	const expected = 2_000_000
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, ExpectedKeys: expected, Window: 4 * time.Hour, Partition: time.Hour}
	e := gaOpen(t, o)
	var l ledger
	var next atomic.Int64
	total := int64(expected/32 + expected/40)
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	// Crash points: ack counts around the steps' growth points
	// (expected/256 = 7.8k, 15.6k, 31k, 62.5k).
	var points []int
	for i := range 4 { // the last is always taken (its g is 62496, not expected/32)
		g := expected / 256 << i
		if rng.IntN(2) == 0 || i == 3 {
			points = append(points, g*3/4+rng.IntN(g/2))
		}
	}
	type clone struct {
		fs    crashFS
		acked [][]byte
	}
	var clones []clone
	done := make(chan error, 1)
	go func() { done <- gaMarkFresh(e, &l, "crash", &next, total, 3, 700, nil) }()
	for _, p := range points {
		for l.len() < p {
			select {
			case err := <-done:
				done <- err
			default:
			}
			if next.Load() >= total {
				break
			}
			time.Sleep(200 * time.Microsecond)
		}
		acked := l.snapshot()
		clones = append(clones, clone{mem.CrashClone(vfs.CrashCloneCfg{}), acked})
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if ck := e.Stats().Bloom.Checkpoints; ck == 0 {
		t.Fatalf("no checkpoint taken during %d keys", l.len())
	}
	_ = e.Close()
	var restored uint64
	for i, c := range clones {
		func() {
			oc := o
			setFS(&oc, c.fs)
			e := gaOpen(t, oc)
			defer e.Close()
			st := e.Stats().Bloom
			restored += st.Restored
			what := fmt.Sprintf("clone %d (%d keys acknowledged before the crash; restored %d, journal %d)", i, len(c.acked), st.Restored, st.JournalKeys)
			gaAllDuplicate(t, e, c.acked, what)
			if i == len(clones)/2 || i == len(clones)-1 {
				// Grow again after the restore, and crash again.
				var l2 ledger
				var n2 atomic.Int64
				if err := gaMarkFresh(e, &l2, fmt.Sprintf("after-%d", i), &n2, int64(gaScale(40000, 2)), 2, 500, nil); err != nil {
					t.Fatal(err)
				}
				again := c.fs.CrashClone(vfs.CrashCloneCfg{})
				_ = e.Close()
				oa := o
				setFS(&oa, again)
				e2 := gaOpen(t, oa)
				defer e2.Close()
				gaAllDuplicate(t, e2, append(append([][]byte(nil), c.acked...), l2.keys...), what+", grown after restore, crashed again")
			}
		}()
	}
	if restored == 0 {
		t.Fatalf("none of %d crashes restored a partition from a checkpoint: the path under attack was not taken", len(clones))
	}
}

// TestGrowthAttackRestartsWithChangedParameters combines a clean Close at
// a small step, a reopen that restores it and grows it further, a clean
// Close at a large step, then reopen after reopen with another
// ExpectedKeys (the snapshot refused, the filters rebuilt), back to the
// first, another FalsePositive, and a longer Window (more live
// partitions), keys added after each: every key acknowledged is a
// Duplicate at every step.
func TestGrowthAttackRestartsWithChangedParameters(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: gaExpected(), Window: 4 * time.Hour, Partition: time.Hour}
	var all [][]byte
	round := 0
	reopen := func(o engine.Options, n int, what string) {
		t.Helper()
		round++
		e := gaOpen(t, o)
		gaAllDuplicate(t, e, all, fmt.Sprintf("round %d (%s), before adding", round, what))
		all = append(all, gaMarkSeq(t, e, fmt.Sprintf("r%d", round), 0, n)...)
		gaAllDuplicate(t, e, all, fmt.Sprintf("round %d (%s), after adding %d", round, what, n))
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	small := gaExpected() / 128 / 16 // the first growth point (or about)
	reopen(o, small+small/2, "fresh, a small step")
	reopen(o, gaScale(40000, 2), "restored at a small step, grown")
	reopen(o, gaScale(5000, 2), "restored at a larger step")
	o2 := o
	o2.ExpectedKeys = gaExpected() / 5
	reopen(o2, gaScale(30000, 2), "ExpectedKeys changed")
	reopen(o2, gaScale(3000, 2), "same ExpectedKeys again")
	reopen(o, gaScale(30000, 2), "ExpectedKeys back")
	o3 := o
	o3.FalsePositive = 0.001
	reopen(o3, gaScale(20000, 2), "FalsePositive changed")
	o4 := o3
	o4.Window = 6 * time.Hour
	reopen(o4, gaScale(20000, 2), "Window lengthened")
	o5 := o4
	o5.ExpectedKeys = gaExpected() * 2
	reopen(o5, gaScale(20000, 2), "ExpectedKeys doubled")
}

// gaWaitSealed waits until every closed live partition (hour partitions)
// of e is sealed.
func gaWaitSealed(t testing.TB, e *engine.Engine, want int) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d sealed partitions", want), func() bool { return e.Stats().Bloom.Sealed >= uint64(want) })
}
