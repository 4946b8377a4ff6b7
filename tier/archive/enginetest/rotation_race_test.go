package enginetest_test

// Calls that read the engine's time, then reach the store after a
// rotation, while the archive is behind: each must still find a key in
// the partition that left the window in between (Engine.archiveNow).
//
// The world (laWorld), its options and helpers are life_attack_test.go's:
// hourly partitions, a 4-hour Window (5 live partitions: the current one
// and 4 before it) and a 12-hour ArchiveWindow.

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// TestLife2AttackForgetStalledBehindArchiverAcrossRotation shows whether a
// Forget that read the engine's time just before a partition left the
// window, and then waited for the archiver (Forgetting: the archiver
// holds its lock while a slow Put of an older partition runs), still
// removes the key when the clock moves on meanwhile. The key's partition
// (1) is the oldest in the window when the Forget starts; the archive has
// not taken it (its Put of partition 0 is slow); the clock then moves one
// partition on, so partition 1 leaves the window and the store keeps it
// for the archive. The Forget then deletes in the live partitions as
// they are now (2..6: engine/lookup.go lookupExact, allLive) and asks the
// archiver with its own, older time (tier/archive/read.go Forget: the
// lagging partitions [next, Oldest(its cur)) = [1, 1), nothing; the
// archive [.., next=1)): partition 1 is in neither. The promise
// (ForgetBatch's doc): once Forget returns nil, the key's next claim is
// New.
//
// The control ("clock still") is the same run without the clock moving
// while the Forget waits: it must pass too.
func TestLife2AttackForgetStalledBehindArchiverAcrossRotation(t *testing.T) {
	t.Run("clock moves while the Forget waits", func(t *testing.T) { forgetStalledAcrossRotation(t, true) })
	t.Run("clock still (control)", func(t *testing.T) { forgetStalledAcrossRotation(t, false) })
}

func forgetStalledAcrossRotation(t *testing.T, move bool) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	g := newPutGate()
	defer g.open()
	w := newLAWorld(t, laOptions(clock, mem, g.wrap(pebble.ArchiveDir{Dir: "archive", FS: mem})), clock)
	t.Cleanup(g.open) // before the world's Close (cleanups run last-in first-out)
	w.commit()        // partition 0
	g.armed.Store(true)
	w.advance(laPart) // partition 0 closes, is sealed; the archiver's Put(0) is held
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the archiver never tried to archive partition 0")
	}
	w.commit()            // partition 1: the key to forget
	w.advance(4 * laPart) // clock at 5: partition 1 is the oldest in the window
	key := laKey(1, 0)
	if in, err := w.e.Lookup(ctx, key); err != nil || in.Outcome != engine.Duplicate {
		t.Fatalf("before the Forget: %+v %v, want Duplicate", in, err)
	}
	type result struct {
		in  engine.KeyInfo
		err error
	}
	done := make(chan result, 1)
	go func() {
		in, err := w.e.Forget(ctx, key)
		done <- result{in, err}
	}()
	stalled := false
	select {
	case r := <-done:
		t.Logf("the Forget did not wait for the archiver: %+v %v", r.in, r.err)
		done <- r
	case <-time.After(300 * time.Millisecond):
		stalled = true
	}
	if move {
		w.advance(laPart) // clock at 6: partition 1 leaves the window (held by the store)
	}
	g.armed.Store(false)
	g.open()
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the Forget never returned")
	}
	if r.err != nil {
		t.Logf("the Forget failed (%v): nothing promised", r.err)
		return
	}
	t.Logf("the Forget (stalled behind the archiver: %v) returned %v from %v", stalled, r.in.Outcome, r.in.Source)
	if r.in.Outcome != engine.Duplicate {
		t.Errorf("the Forget answered %v from %v for a key committed 5 hours before (Duplicate just before the call): want Duplicate, what it held", r.in.Outcome, r.in.Source)
	}
	check := func(what string) {
		t.Helper()
		in, err := w.e.Lookup(ctx, key)
		if err != nil {
			t.Fatalf("%s: lookup: %v", what, err)
		}
		if in.Outcome != engine.New {
			t.Errorf("%s: a key whose Forget returned nil (it answered %v) is %v from %v, want New (archive %+v)",
				what, r.in.Outcome, in.Outcome, in.Source, *w.e.Stats().Archive)
		}
	}
	check("right after the Forget")
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("the archive lags: %+v", *st.Archive)
	}
	check("the archive caught up")
	w.reopen(nil)
	check("reopened")
	out := make([]engine.Outcome, 1)
	if err := w.e.MarkBatch(ctx, [][]byte{key}, nil, out); err != nil {
		t.Fatalf("mark after the Forget: %v", err)
	}
	if out[0] != engine.New {
		t.Errorf("the forgotten key's next mark: %v, want New", out[0])
	}
	// The other keys of partition 1 were not forgotten: Duplicate.
	for i := 1; i < laPerP; i++ {
		if in, err := w.e.Lookup(ctx, laKey(1, i)); err != nil || in.Outcome != engine.Duplicate {
			t.Errorf("partition 1's key %d, not forgotten: %+v %v, want Duplicate", i, in, err)
		}
	}
}

// TestLife2AttackReadsAcrossRotationWhileArchiveLags shows whether a
// Lookup racing the rotation that takes its key's partition out of the
// window answers Duplicate while the archive lags (its Put fails: the
// store holds every partition that left the window and reads them,
// unfiltered, for keys found nowhere else). Readers look up the keys of
// the oldest partition of the window over and over while the clock moves
// one partition on (no tick: the readers' own calls rotate). A reader
// that read the time before the rotation and the filters after it asks
// the store the partitions from the filters' oldest on, and the lagging
// read the partitions before its own time's oldest: the partition that
// just left the window would be in neither (engine/resolve.go and
// engine/lookup.go: the filter's oldest; tier/archive/read.go Find: the
// call's now). Memory holds at most one commit (MemoryCapacity 1, one stripe), so
// the store and the archiver answer. Every answer must be Duplicate: the
// key is inside the window or the archive window at every instant of the
// call (InFlight is allowed: the marking readers hold keys for a moment).
// Some readers mark instead (MarkBatch): a New there is a second
// delivery let through, and commits the key again. The control runs the same rounds with the archive up, waiting
// before each round until it holds every closed partition: it must
// pass. (Without that wait the control fails too, now and then: an
// archive that is up lags for a moment after each rotation, and a
// partition leaving the window in that moment is exposed the same way.)
func TestLife2AttackReadsAcrossRotationWhileArchiveLags(t *testing.T) {
	t.Run("archive down, lookups and marks", func(t *testing.T) { readsAcrossRotation(t, true, 3) })
	t.Run("archive down, marks only", func(t *testing.T) { readsAcrossRotation(t, true, 6) })
	t.Run("archive up (control)", func(t *testing.T) { readsAcrossRotation(t, false, 3) })
}

// readsAcrossRotation runs the rounds with six readers, markers of them
// marking.
func readsAcrossRotation(t *testing.T, archiveDown bool, markers int) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	var down atomic.Bool
	down.Store(archiveDown)
	o := laOptions(clock, mem, failingArchive(pebble.ArchiveDir{Dir: "archive", FS: mem}, &down))
	o.MemoryCapacity, o.Stripes = 1, 1 // one commit cached in all: the store answers
	o.Logger = quiet
	w := newLAWorld(t, o, clock)
	w.hours(4) // 0..3, clock at 4
	deadline := time.Now().Add(4 * time.Second)
	if archiveDown && markers < 6 {
		deadline = time.Now().Add(7 * time.Second)
	}
	var bad, newMarks atomic.Int64
	var first atomic.Pointer[string]
	rounds, lookups := 0, 0
	for time.Now().Before(deadline) && bad.Load() == 0 {
		w.commit() // the clock's partition
		if !archiveDown {
			// The control: the archive holds every closed partition
			// before the round (it lags for a moment after each
			// rotation, and then the race is the one under test).
			if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
				t.Fatalf("the archive lags: %+v", *st.Archive)
			}
		}
		q := w.cur() - 4
		keys := make([][]byte, w.keys[q])
		for i := range keys {
			keys[i] = laKey(q, i)
		}
		var stop atomic.Bool
		var wg sync.WaitGroup
		var n atomic.Int64
		for g := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out := make([]engine.KeyInfo, 4)
				marks := make([]engine.Outcome, 4)
				for i := g * 4; !stop.Load(); i = (i + 4) % (len(keys) - 4) {
					if g < markers {
						// A mark: a New here is a second delivery let through.
						if err := w.e.MarkBatch(ctx, keys[i:i+4], nil, marks); err != nil {
							msg := "mark: " + err.Error()
							first.CompareAndSwap(nil, &msg)
							bad.Add(1)
							return
						}
						n.Add(1)
						for k, o := range marks {
							// InFlight: another reader's mark holds the key (allowed).
							if o != engine.Duplicate && o != engine.InFlight {
								msg := "MarkBatch " + string(keys[i+k]) + ": " + o.String()
								first.CompareAndSwap(nil, &msg)
								bad.Add(1)
								newMarks.Add(1)
							}
						}
						continue
					}
					if err := w.e.LookupBatch(ctx, keys[i:i+4], out); err != nil {
						msg := "lookup: " + err.Error()
						first.CompareAndSwap(nil, &msg)
						bad.Add(1)
						return
					}
					n.Add(1)
					for k, in := range out {
						if in.Outcome != engine.Duplicate && in.Outcome != engine.InFlight {
							msg := "LookupBatch " + string(keys[i+k]) + ": " + in.Outcome.String() + " from " + in.Source.String()
							first.CompareAndSwap(nil, &msg)
							bad.Add(1)
						}
					}
				}
			}()
		}
		time.Sleep(time.Duration(rounds%3) * time.Millisecond)
		clock.Add(laPart) // q leaves the window at the readers' next call
		time.Sleep(3 * time.Millisecond)
		stop.Store(true)
		wg.Wait()
		lookups += int(n.Load())
		rounds++
	}
	t.Logf("%d rounds, %d lookups and marks of 4 keys", rounds, lookups)
	// Read again, alone: the keys are there (the wrong answers were the
	// race's, not a loss).
	after := w.wantDup(max(0, w.cur()-11), w.cur())
	if b := bad.Load(); b > 0 {
		t.Fatalf("%d answers not Duplicate (%d of them marks) for keys committed 4 or 5 hours before (window 4h, archive window 12h, archive down %v), in round %d, first: %s; read again alone afterwards: %d not Duplicate",
			b, newMarks.Load(), archiveDown, rounds, *first.Load(), len(after))
	}
	if len(after) > 0 {
		t.Fatalf("after the rounds: %d keys not Duplicate, first: %s", len(after), after[0])
	}
}

// TestLife2AttackMarkStalledAcrossRotationWhileArchiveLags shows whether a
// MarkBatch that read the engine's time just before a partition left the
// window (at 4:55, the clock moving to 5:05 meanwhile), and wrote an
// attempt count before reading the filters (a key of
// its batch whose claim's lease had ended: persistExpiries, with
// MaxAttempts; the write is held in enginetest.SetBeforeDurable as a slow
// disk would hold it), answers Duplicate for a key committed in that
// partition while the archive lags (its Put fails: the store holds the
// partition and reads it for keys found nowhere else). The mark reads the
// filters after the rotation (their oldest partition is 1), and the
// store's lagging partitions before its own time's window (Oldest(4) = 0:
// none): partition 0 is in neither, the key is answered New and committed
// again. The key was acknowledged 4 hours before: a New is a second
// delivery let through (the archive window is 12 hours). The control
// ("clock still") must pass.
func TestLife2AttackMarkStalledAcrossRotationWhileArchiveLags(t *testing.T) {
	t.Run("clock moves while the mark is held", func(t *testing.T) { markStalledAcrossRotation(t, true) })
	t.Run("clock still (control)", func(t *testing.T) { markStalledAcrossRotation(t, false) })
}

func markStalledAcrossRotation(t *testing.T, move bool) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	var down atomic.Bool
	down.Store(true)
	o := laOptions(clock, mem, failingArchive(pebble.ArchiveDir{Dir: "archive", FS: mem}, &down))
	o.MemoryCapacity, o.Stripes = 1, 1 // one commit cached in all: the store answers
	o.MaxAttempts, o.Lease = 5, 30*time.Minute
	o.Logger = quiet
	w := newLAWorld(t, o, clock)
	w.commit() // partition 0
	expiring := []byte("lease-ends")
	c, err := w.e.Claim(ctx, expiring)
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	// Clock at 4:55: partition 0 is the oldest in the window; the claim's
	// lease ended.
	w.advance(4*laPart + 55*time.Minute)
	key := laKey(0, 0)
	if in, err := w.e.Lookup(ctx, key); err != nil || in.Outcome != engine.Duplicate {
		t.Fatalf("before the mark: %+v %v, want Duplicate", in, err)
	}
	var armed atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	armed.Store(true)
	enginetest.SetBeforeDurable(func() {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	})
	defer enginetest.SetBeforeDurable(nil)
	type result struct {
		out []engine.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out := make([]engine.Outcome, 2)
		err := w.e.MarkBatch(ctx, [][]byte{expiring, key}, nil, out)
		done <- result{out, err}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the mark never wrote the ended lease's attempt count")
	}
	if move {
		// Clock at 5:05: partition 0 leaves the window (held by the
		// store); the held mark's lease (to 5:25) has not ended.
		w.advance(10 * time.Minute)
	}
	close(release)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the held mark never returned")
	}
	if r.err != nil {
		t.Logf("the held mark failed (%v): nothing answered", r.err)
		return
	}
	t.Logf("the held mark answered %v", r.out)
	if r.out[1] != engine.Duplicate {
		t.Errorf("a key acknowledged %v before (window 4h, archive window 12h, archive down) was marked %v, want Duplicate", clock.Now().Sub(newClock().Now()), r.out[1])
	}
	w.mustDup("after the mark", 0, 0)
}
