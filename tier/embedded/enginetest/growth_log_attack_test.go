package enginetest_test

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
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// Attacks on the last growth of the embedded store's filters, which
// rebuilds each filter from the keys it logged while the ring was small
// (tier/bloom/growth.go), while a filter restored from a file (a snapshot
// at Close, a checkpoint or a sealed partition after a crash) is copied
// up: crashes just before and after it, with restores, rebuilds and
// another ExpectedKeys; clean reopens at every fill point around it;
// claims held, released and committed across it with the window sliding.
// Every key acknowledged must be a Duplicate inside the window.

// glaFull returns the bytes of o's ring at its full size or more: the
// ring has grown to its full size once Stats().Bloom.Bytes reaches it (a
// growing ring's full size is this rounded up; the step below is half).
func glaFull(t testing.TB, o engine.Options) int64 {
	t.Helper()
	parts, err := tier.NewPartitions(o.Window, o.Partition)
	if err != nil {
		t.Fatal(err)
	}
	fp := o.FalsePositive
	if fp == 0 {
		fp = bloom.DefaultFalsePositive
	}
	return bloom.Sizing(o.ExpectedKeys, fp, parts.Live).Bytes
}

// glaLastAt is the keys one partition holds when the ring grows to its
// full size (growth.go: 1/16 of the step below full's capacity).
func glaLastAt(expected int) int { return expected / 2 / 16 }

// glaSample returns keys, or under -race the newest 8000 of them and 8000
// others spread over the rest (a check of every key, many times over,
// took most of a run under the race detector).
func glaSample(keys [][]byte) [][]byte {
	if !enginetest.RaceEnabled() || len(keys) <= 16000 {
		return keys
	}
	out := append([][]byte(nil), keys[len(keys)-8000:]...)
	rest := len(keys) - 8000
	for i := range 8000 {
		out = append(out, keys[i*rest/8000])
	}
	return out
}

// glaOptions are the attacks' options: hour partitions in a four-hour
// window (five live filters) on fs.
func glaOptions(fs vfs.FS, clock *fakeClock) engine.Options {
	return engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, ExpectedKeys: gaExpected(), Window: 4 * time.Hour, Partition: time.Hour}
}

// glaRemarker re-marks acknowledged keys of l (mostly among the newest
// 3000, a quarter from all of them) until stop closes (gaRemarker).
func glaRemarker(e *engine.Engine, l *ledger, stop <-chan struct{}, checks *atomic.Int64) <-chan error {
	return gaRemarker(e, l, stop, checks, 3000, 4, "growth log")
}

// TestGrowthLogAttackCrashAroundLastGrowth: an hour partition is filled
// at a small step and sealed, then three workers fill the next one
// through the last growth with checkpoints taken every few thousand keys
// (so one is taken at the step below full, its filter logged then); the
// machine crashes (CrashClone) just before the last growth, just after it
// and later. Each crash is reopened three ways: restored from the
// checkpoint and journal (the open partition's filter unlogged, copied at
// the growth still to come), rebuilt by a scan (logged, rebuilt at it),
// and rebuilt with another ExpectedKeys. Each must hold every key
// acknowledged before its crash; then each takes keys past the last
// growth (racing re-marks); the restored one crashes again and reopens.
func TestGrowthLogAttackCrashAroundLastGrowth(t *testing.T) {
	enginetest.SetCheckpointKeys(int64(gaScale(12000, 2)))
	defer enginetest.SetCheckpointKeys(0)
	mem := newCrashFS()
	clock := newClock()
	o := glaOptions(mem, clock)
	full := glaFull(t, o)
	lastAt := glaLastAt(o.ExpectedKeys)
	e := gaOpen(t, o)
	var l ledger
	l.add(gaMarkSeq(t, e, "h0", 0, lastAt/8))
	clock.Add(time.Hour)
	l.add(gaMarkSeq(t, e, "h1-first", 0, 1)) // rotates: h0 is sealed
	gaWaitSealed(t, e, 1)
	base := l.len()
	start := e.Stats().Bloom.Bytes
	var next atomic.Int64
	total := int64(lastAt + lastAt/2)
	done := make(chan error, 1)
	go func() { done <- gaMarkFresh(e, &l, "h1", &next, total, 3, 500, nil) }()
	type clone struct {
		what  string
		fs    crashFS
		acked [][]byte
		bytes int64
	}
	var clones []clone
	take := func(what string) {
		acked := l.snapshot()
		b := e.Stats().Bloom.Bytes
		clones = append(clones, clone{fmt.Sprintf("%s (%d keys in the partition, filters %d bytes, full %d)", what, len(acked)-base, b, full), mem.CrashClone(vfs.CrashCloneCfg{}), acked, b})
	}
	wait := func(cond func() bool) {
		for !cond() && next.Load() < total {
			time.Sleep(100 * time.Microsecond)
		}
	}
	// Three workers hold up to 1500 keys in flight (in the filters before
	// they are acknowledged): the growth comes at about 2000 acknowledged
	// keys before the growth point.
	wait(func() bool { return l.len()-base >= lastAt-5000 })
	take("well before the last growth")
	wait(func() bool { return l.len()-base >= lastAt-3500 })
	take("just before the last growth")
	wait(func() bool { return e.Stats().Bloom.Bytes >= full })
	take("just after the last growth")
	wait(func() bool { return l.len()-base >= lastAt+3000 })
	take("after the last growth")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := e.Stats().Bloom
	if st.Checkpoints == 0 || st.Bytes < full || start >= full/2 {
		t.Fatalf("checkpoints %d, filters %d → %d bytes (full %d): not the growth under attack", st.Checkpoints, start, st.Bytes, full)
	}
	if clones[0].bytes >= full {
		t.Logf("the first crash came after the last growth (%s)", clones[0].what)
	}
	for _, c := range clones {
		t.Logf("crash %s", c.what)
	}
	_ = e.Close()
	modes := []string{"restore", "rebuild", "other ExpectedKeys"}
	var restored uint64
	for i, c := range clones {
		for mi, mode := range modes {
			if enginetest.RaceEnabled() && (i >= 2 || mi == 2 && i != 1) {
				continue
			}
			func() {
				oc := o
				setFS(&oc, c.fs.CrashClone(vfs.CrashCloneCfg{}))
				switch mode {
				case "rebuild":
					enginetest.SetNoRestore(true)
					defer enginetest.SetNoRestore(false)
				case "other ExpectedKeys":
					oc.ExpectedKeys = o.ExpectedKeys / 2
					if i%2 == 1 {
						oc.ExpectedKeys = o.ExpectedKeys * 2
					}
				}
				e := gaOpen(t, oc)
				defer e.Close()
				st := e.Stats().Bloom
				restored += st.Restored
				what := fmt.Sprintf("crash %s, %s (restored %d, journal %d, sealed loaded %d, filters %d bytes)", c.what, mode, st.Restored, st.JournalKeys, st.SealedLoaded, st.Bytes)
				gaAllDuplicate(t, e, glaSample(c.acked), what)
				// Past the last growth (again), racing re-marks.
				var l2 ledger
				var n2 atomic.Int64
				stop := make(chan struct{})
				rem := glaRemarker(e, &l2, stop, nil)
				err := gaMarkFresh(e, &l2, fmt.Sprintf("after-%d-%d", i, mi), &n2, int64(glaLastAt(oc.ExpectedKeys)+1000), 2, 500, nil)
				close(stop)
				if rerr := <-rem; rerr != nil {
					t.Fatalf("%s, growing on: %v", what, rerr)
				}
				if err != nil {
					t.Fatal(err)
				}
				if b := e.Stats().Bloom.Bytes; b < glaFull(t, oc) {
					t.Fatalf("%s: filters at %d bytes after %d more keys, not full", what, b, len(l2.keys))
				}
				all := append(append([][]byte(nil), c.acked...), l2.keys...)
				gaAllDuplicate(t, e, glaSample(all), what+", grown on")
				t.Logf("%s: %d keys, then %d more: all Duplicate", what, len(c.acked), len(l2.keys))
				if mode != "restore" {
					return
				}
				// The restored filter was copied through the last
				// growth; its state is checkpointed or journaled again.
				fs := c.fs
				if mf, ok := backendFS(oc); ok {
					fs = mf
				}
				again := fs.CrashClone(vfs.CrashCloneCfg{})
				_ = e.Close()
				oa := oc
				setFS(&oa, again)
				e2 := gaOpen(t, oa)
				defer e2.Close()
				gaAllDuplicate(t, e2, glaSample(all), what+", grown on, crashed again")
			}()
		}
	}
	if restored == 0 {
		t.Fatal("no crash restored a partition from a checkpoint: the unlogged path was not taken")
	}
}

// backendFS returns the CrashFS o's embedded backend runs on.
func backendFS(o engine.Options) (crashFS, bool) {
	b, ok := o.Backend.(*embedded.Backend)
	if !ok {
		return crashFS{}, false
	}
	fs, ok := b.FS.(crashFS)
	return fs, ok
}

// TestGrowthLogAttackReopenAcrossLastGrowth: a clean Close and reopen (the
// snapshot restores the ring at its step, every filter in it unlogged)
// at each fill point of one partition: at the smallest steps, halfway,
// just below the last growth, just past it; each time four workers mark
// fresh keys through the next growth while a re-marker checks the
// acknowledged ones. Then the next partition, at the full size; then
// reopens with ExpectedKeys doubled (the snapshot refused, the filters
// rebuilt and grown by the scan, logged), halved and back. Every
// acknowledged key is a Duplicate before and after each round.
func TestGrowthLogAttackReopenAcrossLastGrowth(t *testing.T) {
	dir := t.TempDir()
	clock := newClock()
	o := engine.Options{Backend: embedded.Dir(dir), Clock: clock, ExpectedKeys: gaExpected(), Window: 4 * time.Hour, Partition: time.Hour}
	lastAt := glaLastAt(o.ExpectedKeys)
	var all [][]byte
	inPart := 0
	round := 0
	reopen := func(o engine.Options, upTo int, what string) {
		t.Helper()
		round++
		e := gaOpen(t, o)
		defer func() {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
		}()
		before := e.Stats().Bloom.Bytes
		gaAllDuplicate(t, e, glaSample(all), fmt.Sprintf("round %d (%s), reopened", round, what))
		var l ledger
		var next atomic.Int64
		var checks atomic.Int64
		l.add(all[max(0, len(all)-5000):])
		stop := make(chan struct{})
		rem := glaRemarker(e, &l, stop, &checks)
		n := max(upTo-inPart, 1)
		err := gaMarkFresh(e, &l, fmt.Sprintf("r%d", round), &next, int64(n), 4, 400, nil)
		close(stop)
		if rerr := <-rem; rerr != nil {
			t.Fatalf("round %d (%s): %v", round, what, rerr)
		}
		if err != nil {
			t.Fatal(err)
		}
		fresh := l.keys[min(len(all), 5000):]
		all = append(all, fresh...)
		inPart += len(fresh)
		after := e.Stats().Bloom.Bytes
		gaAllDuplicate(t, e, glaSample(all), fmt.Sprintf("round %d (%s), %d keys in the partition, filters %d → %d bytes", round, what, inPart, before, after))
		t.Logf("round %d (%s): %d keys in the partition, filters %d → %d bytes, %d re-marks", round, what, inPart, before, after, checks.Load())
	}
	reopen(o, lastAt/10, "fresh")
	reopen(o, lastAt/2, "restored at a small step")
	reopen(o, lastAt-1500, "restored halfway")
	reopen(o, lastAt+1500, "restored below the last growth: the open partition's filter, unlogged, copied")
	reopen(o, lastAt+4000, "restored at the full size")
	clock.Add(time.Hour)
	inPart = 0
	reopen(o, lastAt/2, "next partition at the full size")
	o2 := o
	o2.ExpectedKeys = o.ExpectedKeys * 2
	inPart = 0
	reopen(o2, glaLastAt(o2.ExpectedKeys)+1000, "ExpectedKeys doubled: rebuilt, grown through its last growth")
	o3 := o
	o3.ExpectedKeys = o.ExpectedKeys / 2
	inPart = 0
	reopen(o3, 3000, "ExpectedKeys halved: rebuilt past every growth point at once")
	inPart = 0
	reopen(o, 3000, "ExpectedKeys back")
}

// TestGrowthLogAttackClaimsAcrossLastGrowth: workers claim batches of
// fresh keys and commit most of each, release some and hold the rest,
// while the commits grow the ring through its last growth; then each held
// claim is InFlight to a second claim and Duplicate once committed, each
// released key New to a new claim and Duplicate once committed, and every
// committed key a Duplicate, and after a crash.
func TestGrowthLogAttackClaimsAcrossLastGrowth(t *testing.T) {
	mem := newCrashFS()
	clock := newClock()
	o := glaOptions(mem, clock)
	o.Window = 3 * time.Hour // four live partitions
	full := glaFull(t, o)
	lastAt := glaLastAt(o.ExpectedKeys)
	e := gaOpen(t, o)
	defer func() { _ = e.Close() }()
	ctx := context.Background()
	var committed, released, held ledger
	var heldClaims []engine.Claim
	var hmu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	var next atomic.Int64
	total := int64(lastAt + lastAt/3)
	const batch = 200
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]engine.Claim, batch)
			cerrs := make([]error, batch)
			for {
				start := next.Add(batch) - batch
				if start >= total {
					return
				}
				keys := make([][]byte, batch)
				for i := range keys {
					keys[i] = fmt.Appendf(nil, "cl-%d", start+int64(i))
				}
				if err := e.ClaimBatch(ctx, keys, nil, out); err != nil {
					errs <- err
					return
				}
				for i, c := range out {
					if c.Outcome != engine.New {
						errs <- fmt.Errorf("worker %d: fresh key %s claimed %v", w, keys[i], c.Outcome)
						return
					}
				}
				// 170 committed, 15 released, 15 held (a fifth of the
				// batches hold theirs).
				if err := e.CommitBatch(ctx, out[:170], cerrs[:170]); err != nil {
					errs <- fmt.Errorf("commit: %w", err)
					return
				}
				committed.add(keys[:170])
				if err := e.ReleaseBatch(ctx, out[170:185], cerrs[170:185]); err != nil {
					errs <- fmt.Errorf("release: %w", err)
					return
				}
				released.add(keys[170:185])
				if start/batch%5 == 0 {
					hmu.Lock()
					heldClaims = append(heldClaims, append([]engine.Claim(nil), out[185:]...)...)
					hmu.Unlock()
					held.add(keys[185:])
				} else if err := e.CommitBatch(ctx, out[185:], cerrs[185:]); err != nil {
					errs <- fmt.Errorf("commit: %w", err)
					return
				} else {
					committed.add(keys[185:])
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if b := e.Stats().Bloom.Bytes; b < full {
		t.Fatalf("filters at %d bytes after %d commits: not grown to the full %d", b, committed.len(), full)
	}
	gaAllDuplicate(t, e, committed.keys, "committed across the last growth")
	claimEach(t, e, held.keys, func(key []byte, c engine.Claim) {
		if c.Outcome != engine.InFlight {
			t.Fatalf("held key %s claimed again: %v, want InFlight", key, c.Outcome)
		}
	})
	if err := e.CommitBatch(ctx, heldClaims, nil); err != nil {
		t.Fatalf("committing the held claims after the growth: %v", err)
	}
	var reclaimed []engine.Claim
	claimEach(t, e, released.keys, func(key []byte, c engine.Claim) {
		if c.Outcome != engine.New {
			t.Fatalf("released key %s claimed again: %v, want New", key, c.Outcome)
		}
		reclaimed = append(reclaimed, c)
	})
	if err := e.CommitBatch(ctx, reclaimed, nil); err != nil {
		t.Fatal(err)
	}
	all := append(append(append([][]byte(nil), committed.keys...), held.keys...), released.keys...)
	gaAllDuplicate(t, e, all, "held and released claims committed after the growth")

	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	e = gaOpen(t, o)
	st := e.Stats().Bloom
	gaAllDuplicate(t, e, all, fmt.Sprintf("after a crash (restored %d, journal %d)", st.Restored, st.JournalKeys))
}

// TestGrowthLogAttackWindowSlidesAtLastGrowth: three live partitions
// (two-hour window): the first two are filled just below the last growth
// point (step below full, logged), then workers mark fresh keys into the
// third, and the clock jumps an hour when it nears the last growth point
// (a little before, at, or after it, one round each): the first partition
// is dropped and the fourth takes its slot while batches of the third
// still commit (the growth before the drop, after it, or while it
// happens); marks go on into the fourth past the last growth point. Every
// key of the live partitions is a Duplicate, and after a crash.
func TestGrowthLogAttackWindowSlidesAtLastGrowth(t *testing.T) {
	// Three workers with batches of 700 hold up to 2100 keys in flight,
	// added to the filters before they are acknowledged: the growth comes
	// at about 2800 acknowledged keys before the growth point.
	offsets := []int{-4500, -3200, -2400, -1600, 0}
	if enginetest.RaceEnabled() {
		offsets = []int{-3200, -1600}
	}
	for _, off := range offsets {
		t.Run(fmt.Sprint(off), func(t *testing.T) {
			mem := newCrashFS()
			clock := newClock()
			o := glaOptions(mem, clock)
			o.Window = 2 * time.Hour
			full := glaFull(t, o)
			lastAt := glaLastAt(o.ExpectedKeys)
			e := gaOpen(t, o)
			defer func() { _ = e.Close() }()
			_ = gaMarkSeq(t, e, "A", 0, lastAt-2000) // dropped by the jump
			clock.Add(time.Hour)
			live := gaMarkSeq(t, e, "B", 0, lastAt-2000)
			clock.Add(time.Hour)
			if b := e.Stats().Bloom.Bytes; b >= full {
				t.Fatalf("grown to the full %d bytes before the attack", b)
			}
			var l ledger
			var next atomic.Int64
			total := int64(2*lastAt + 2000)
			stop := make(chan struct{})
			var checks atomic.Int64
			l.add(live[len(live)-2000:])
			rem := glaRemarker(e, &l, stop, &checks)
			done := make(chan error, 1)
			go func() { done <- gaMarkFreshClock(e, &l, "C", &next, total, 3, 700, nil, true) }()
			for l.len()-2000 < lastAt+off && next.Load() < total {
				time.Sleep(50 * time.Microsecond)
			}
			before := e.Stats().Bloom.Bytes
			clock.Add(time.Hour)
			after := e.Stats().Bloom.Bytes
			err := <-done
			close(stop)
			if rerr := <-rem; rerr != nil {
				t.Fatal(rerr)
			}
			if err != nil {
				t.Fatal(err)
			}
			st := e.Stats().Bloom
			if st.Bytes < full {
				t.Fatalf("filters at %d bytes, not grown to the full %d", st.Bytes, full)
			}
			all := append(append([][]byte(nil), live...), l.keys[2000:]...)
			what := fmt.Sprintf("jump at %d keys (filters %d bytes before it, %d after, full %d)", lastAt+off, before, after, full)
			gaAllDuplicate(t, e, glaSample(all), what)
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			setFS(&o, crashed)
			e = gaOpen(t, o)
			st = e.Stats().Bloom
			gaAllDuplicate(t, e, glaSample(all), fmt.Sprintf("%s, after a crash (restored %d, sealed loaded %d)", what, st.Restored, st.SealedLoaded))
			t.Logf("%s: %d keys checked, %d re-marks during", what, len(all), checks.Load())
		})
	}
}
