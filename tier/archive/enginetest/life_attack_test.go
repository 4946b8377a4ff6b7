package enginetest_test

// Attacks on the embedded store's ownership of its partitions' lives
// (tier/embedded/life.go) through the public API: the store decides every
// drop from min(oldest live partition, the archive's reach), the archiver
// is woken by the store's seals (no polling), Sealed answers through a
// sealing pass, DetachArchive clears the hold at once.
//
// Every test here uses hourly partitions, a 4-hour Window and (unless it
// says otherwise) a 12-hour ArchiveWindow, and never runs longer than a
// few seconds unless a promise is broken (then it fails within ~15 s).

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/internal/faultfs"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

const (
	laPart   = time.Hour
	laWindow = 4 * time.Hour
	laAW     = 12 * time.Hour
	laPerP   = 40 // keys committed per partition
)

// laWorld is one engine under attack, its clock, and what it committed:
// keys[r] is the number of keys committed in relative partition r (the
// partition of the clock at the start is 0).
type laWorld struct {
	t     *testing.T
	clock *fakeClock
	o     engine.Options
	e     *engine.Engine
	start int64
	keys  map[int]int
}

// laOptions are the brief's options over storeFS (the store) and arch.
func laOptions(clock *fakeClock, storeFS vfs.FS, arch tier.ArchiveBackend) engine.Options {
	return engine.Options{
		Backend: &embedded.Backend{Dir: "store", FS: storeFS}, Clock: clock,
		Window: laWindow, Partition: laPart, ExpectedKeys: 2000,
		Archive: arch, ArchiveWindow: laAW,
	}
}

func newLAWorld(t *testing.T, o engine.Options, clock *fakeClock) *laWorld {
	w := &laWorld{t: t, clock: clock, o: o, keys: map[int]int{}}
	w.start = clock.Now().UnixNano() / int64(laPart)
	w.e = open(t, o)
	t.Cleanup(func() {
		if w.e != nil {
			_ = w.e.Close()
		}
	})
	return w
}

func laKey(r, i int) []byte { return fmt.Appendf(nil, "p%03d-k%03d", r, i) }

// cur is the clock's relative partition.
func (w *laWorld) cur() int { return int(w.clock.Now().UnixNano()/int64(laPart) - w.start) }

// commit marks laPerP fresh keys in the clock's partition, each New.
func (w *laWorld) commit() {
	w.t.Helper()
	r := w.cur()
	n := w.keys[r]
	keys := make([][]byte, laPerP)
	for i := range keys {
		keys[i] = laKey(r, n+i)
	}
	out := make([]engine.Outcome, len(keys))
	if err := w.e.MarkBatch(context.Background(), keys, nil, out); err != nil {
		w.t.Fatalf("partition %d: mark: %v", r, err)
	}
	for i, o := range out {
		if o != engine.New {
			w.t.Fatalf("partition %d: fresh key %s: %v, want New", r, keys[i], o)
		}
	}
	w.keys[r] = n + laPerP
}

// advance moves the clock by d and makes the engine read it.
func (w *laWorld) advance(d time.Duration) {
	w.t.Helper()
	w.clock.Add(d)
	if _, err := w.e.Lookup(context.Background(), []byte("tick")); err != nil {
		w.t.Fatalf("tick: %v", err)
	}
}

// hours commits keys and moves the clock an hour on, n times.
func (w *laWorld) hours(n int) {
	w.t.Helper()
	for range n {
		w.commit()
		w.advance(laPart)
	}
}

// wantDup looks up every key committed in relative partitions [from, to]
// and returns those not Duplicate.
func (w *laWorld) wantDup(from, to int) []string {
	w.t.Helper()
	var bad []string
	for r := from; r <= to; r++ {
		n := w.keys[r]
		if n == 0 {
			continue
		}
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = laKey(r, i)
		}
		out := make([]engine.KeyInfo, n)
		if err := w.e.LookupBatch(context.Background(), keys, out); err != nil {
			w.t.Fatalf("lookup partition %d: %v", r, err)
		}
		for i, in := range out {
			if in.Outcome != engine.Duplicate {
				bad = append(bad, fmt.Sprintf("partition %d (age %d) key %d: %v from %v", r, w.cur()-r, i, in.Outcome, in.Source))
			}
		}
	}
	return bad
}

// mustDup fails the test (now) unless every key of [from, to] is Duplicate.
func (w *laWorld) mustDup(what string, from, to int) {
	w.t.Helper()
	if bad := w.wantDup(from, to); len(bad) > 0 {
		st := w.e.Stats()
		w.t.Fatalf("%s: %d keys of partitions %d..%d (clock at %d) not Duplicate, first: %s\narchive %+v\nbloom %+v",
			what, len(bad), from, to, w.cur(), bad[0], st.Archive, st.Bloom)
	}
}

// reopen closes the engine and opens it again with change applied.
func (w *laWorld) reopen(change func(*engine.Options)) {
	w.t.Helper()
	if err := w.e.Close(); err != nil {
		w.t.Fatalf("close: %v", err)
	}
	w.e = nil
	if change != nil {
		change(&w.o)
	}
	w.e = open(w.t, w.o)
}

// laWaitLag waits up to d for the archive's lag to reach 0, without moving
// the clock (Stats reads no clock); it returns the last stats.
func laWaitLag(e *engine.Engine, d time.Duration) (engine.Stats, bool) {
	deadline := time.Now().Add(d)
	for {
		st := e.Stats()
		if st.Archive != nil && st.Archive.Lag == 0 {
			return st, true
		}
		if time.Now().After(deadline) {
			return st, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// laQuietLag waits d without calling the engine at all, then reads its
// stats once. Stats is not a neutral observer: it asks the store whether
// each live partition is sealed (engine/filters.go bloomPartition), and
// Store.Sealed wakes the sealer for a closed partition not sealed yet, so
// polling Stats would itself retry a failed seal. The archive's figures
// are read before the Bloom partitions' (engine/stats.go), so this one
// call reports the lag as it was after d of quiet.
func laQuietLag(e *engine.Engine, d time.Duration) engine.Stats {
	time.Sleep(d)
	return e.Stats()
}

// laCatchUp asserts that the archive catches up within quiet (the clock
// unmoved, the engine not called), and if it does not, whether polling
// Stats (which wakes the sealer) then makes it catch up: the report says
// which.
func laCatchUp(t *testing.T, e *engine.Engine, quiet time.Duration, what string) {
	t.Helper()
	st := laQuietLag(e, quiet)
	if st.Archive.Lag == 0 {
		return
	}
	st2, ok := laWaitLag(e, 5*time.Second)
	t.Fatalf("%s: after %v with the clock unmoved and nothing calling the engine, the archive still lags: %+v\n"+
		"bloom: mode %s, %d sealed, %d seal failures\n"+
		"then polling Stats (which wakes the sealer through Store.Sealed) for 5 s: caught up=%v, archive %+v, %d seal failures",
		what, quiet, *st.Archive, st.Bloom.Mode, st.Bloom.Sealed, st.Bloom.SealFailures, ok, *st2.Archive, st2.Bloom.SealFailures)
}

// waitUntil polls cond for up to d.
func laWaitUntil(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); ; time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// sealedSyncs are the syncs of a sealed partition's filter file being
// written (tier/embedded saveAs: name.sealed.tmp), and nothing else.
var sealedSyncs = faultfs.Match{Kinds: faultfs.Syncs, Suffix: ".sealed.tmp"}

// ---------------------------------------------------------------------
// Promise 2: the archive never lags forever.

// TestLifeAttackSealFailureArchiveCatchesUp: sealing passes fail (the
// sealed files' syncs fail, then the disk is fine again), after one
// partition closed, or after a jump of three partitions at once whose
// second seal fails. The closed partitions not sealed must still be
// sealed and archived without any further clock rotation: the archiver
// waits for the seal event, and the sealer tries a failed pass again.
func TestLifeAttackSealFailureArchiveCatchesUp(t *testing.T) {
	for _, c := range []struct {
		name  string
		hours int
		fault func(start int64) faultfs.Match
		jump  int
	}{
		{"one partition", 0, func(int64) faultfs.Match { return sealedSyncs }, 1},
		// Partition 2's seal fails (every try, until the disk heals):
		// partition 1 is sealed (the store says so: OnSealed), 2 and 3 not.
		{"a 3-hour jump, its second seal failing", 1, func(start int64) faultfs.Match {
			return faultfs.Match{Kinds: faultfs.Syncs, Suffix: fmt.Sprintf(".p%d.sealed.tmp", start+2)}
		}, 3},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock := newClock()
			mem := vfs.NewMem()
			var fault faultfs.Fault
			o := laOptions(clock, faultfs.Wrap(mem, &fault), pebble.ArchiveDir{Dir: "archive", FS: mem})
			w := newLAWorld(t, o, clock)
			w.hours(c.hours)
			w.commit()
			fault.Arm(c.fault(w.start))
			w.advance(time.Duration(c.jump) * laPart)
			w.commit()
			// (fault.Hits, not Stats: Stats would wake the sealer, see laQuietLag.)
			if !laWaitUntil(10*time.Second, func() bool { return fault.Hits() > 0 }) {
				t.Fatalf("no sealed file's sync failed (fault %v, seen %d)", &fault, fault.Seen())
			}
			// Let the archiver's pass (woken by the rotation) find the
			// partition unsealed, and any sealing pass it woke fail too;
			// then the disk heals.
			time.Sleep(300 * time.Millisecond)
			fault.Disarm()
			laCatchUp(t, w.e, 3*time.Second, c.name+", then the disk healed")
			w.mustDup("after the seal failure", 0, w.cur())
		})
	}
}

// TestLifeAttackUncleanShutdownRebuildArchives: a machine crash right
// after a partition closed, before its seal (the sealed file's sync is
// held). The copy opens with its filters rebuilding from Pebble (the
// rebuild held by a gate, the checkpoint ignored): every key stays
// Duplicate meanwhile, and once the rebuild ends the closed partition is
// sealed and archived without any clock rotation.
func TestLifeAttackUncleanShutdownRebuildArchives(t *testing.T) {
	clock := newClock()
	crash := newCrashFS()
	gate := faultfs.NewGate(sealedSyncs)
	o := laOptions(clock, faultfs.Wrap(crash, gate), pebble.ArchiveDir{Dir: "archive", FS: crash})
	w := newLAWorld(t, o, clock)
	w.hours(2) // partitions 0 and 1 sealed and archived
	if _, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("archive lags: %+v", w.e.Stats().Archive)
	}
	w.commit()
	gate.Shut()
	w.advance(laPart) // partition 2 closes; its seal waits at the gate
	if !laWaitUntil(10*time.Second, func() bool { return gate.Waited() > 0 }) {
		t.Fatal("the seal of partition 2 never reached the gate")
	}
	clone := crash.CrashClone(vfs.CrashCloneCfg{})
	gate.Open()
	if err := w.e.Close(); err != nil {
		t.Fatal(err)
	}
	w.e = nil

	rebuild := make(chan struct{})
	enginetest.SetRebuildGate(rebuild)
	enginetest.SetNoRestore(true)
	defer func() {
		enginetest.SetRebuildGate(nil)
		enginetest.SetNoRestore(false)
	}()
	o2 := laOptions(clock, clone, pebble.ArchiveDir{Dir: "archive", FS: clone})
	w.o = o2
	w.e = open(t, o2)
	if st := w.e.Stats(); st.Bloom.Mode == "warm" || st.Archive.Lag == 0 {
		t.Fatalf("the crashed copy opened warm, or its archive does not lag (%s, %+v): the test does not rebuild", st.Bloom.Mode, *st.Archive)
	}
	w.mustDup("while rebuilding", 0, w.cur())
	time.Sleep(200 * time.Millisecond) // the archiver's first pass finds 2 unsealed
	close(rebuild)
	laCatchUp(t, w.e, 3*time.Second, "the rebuild after a crash ended")
	w.mustDup("after the rebuild", 0, w.cur())
	// And the history stays once the window has passed it.
	w.advance(6 * laPart)
	w.mustDup("6 hours later", 0, 2)
}

// TestLifeAttackManyPartitionsAtOnce: the clock jumps several partitions
// at once, inside the window and then past it; each time the archive
// catches up with no further rotation and every key inside the archive
// window stays Duplicate. Then a jump with Close right after (Close while
// archiving), a reopen with nothing else to wake it, and the same.
func TestLifeAttackManyPartitionsAtOnce(t *testing.T) {
	clock := newClock()
	mem := vfs.NewMem()
	w := newLAWorld(t, laOptions(clock, mem, pebble.ArchiveDir{Dir: "archive", FS: mem}), clock)
	w.commit()
	for _, jump := range []int{3, 7, 2} { // 3: in the window; 7: past it
		w.advance(time.Duration(jump) * laPart)
		w.commit()
		laCatchUp(t, w.e, 2*time.Second, fmt.Sprintf("a %d-hour jump", jump))
		w.mustDup(fmt.Sprintf("after a %d-hour jump", jump), max(0, w.cur()-11), w.cur())
	}
	for round := range 3 {
		w.advance(5 * laPart)
		w.commit()
		time.Sleep(time.Duration(round) * 3 * time.Millisecond)
		w.reopen(nil)
		w.mustDup(fmt.Sprintf("round %d: reopened", round), max(0, w.cur()-11), w.cur())
		laCatchUp(t, w.e, 2*time.Second, fmt.Sprintf("round %d: reopened after Close while archiving", round))
		w.mustDup(fmt.Sprintf("round %d: archived", round), max(0, w.cur()-11), w.cur())
	}
	// The clock moves while the engine is closed: 3 hours (partitions
	// close inside the window), then 7 (past it). The Open's own reading
	// is the only rotation.
	for _, jump := range []int{3, 7} {
		w.commit()
		if err := w.e.Close(); err != nil {
			t.Fatal(err)
		}
		w.clock.Add(time.Duration(jump) * laPart)
		w.e = open(t, w.o)
		laCatchUp(t, w.e, 2*time.Second, fmt.Sprintf("reopened %d hours later", jump))
		w.mustDup(fmt.Sprintf("reopened %d hours later", jump), max(0, w.cur()-11), w.cur())
	}
}

// ---------------------------------------------------------------------
// Promise 1: an acknowledged key stays Duplicate for its window and
// archive window, across configuration changes.

// TestLifeAttackLaggingArchiveConfigChanges: the archive takes nothing
// for 10 hours (its Put fails), so the store holds partitions past the
// window; then Close and reopen with a longer Window, a shorter
// ArchiveWindow, the archive back, a longer ArchiveWindow, a clock jump
// of many partitions. Every key inside the archive window in force is
// Duplicate at every step.
func TestLifeAttackLaggingArchiveConfigChanges(t *testing.T) {
	clock := newClock()
	mem := vfs.NewMem()
	var down atomic.Bool
	down.Store(true)
	arch := failingArchive(pebble.ArchiveDir{Dir: "archive", FS: mem}, &down)
	w := newLAWorld(t, laOptions(clock, mem, arch), clock)
	w.hours(10) // partitions 0..9, the clock at 10
	w.mustDup("archive down", 0, 9)

	w.reopen(func(o *engine.Options) { o.Window = 7 * time.Hour })
	w.mustDup("reopened with a 7-hour window, archive down", 0, 9)
	w.hours(1) // clock at 11: partition 0 is 11 old
	w.mustDup("an hour later", 0, 10)

	// A shorter archive window is refused (the archive records its
	// window: "a window may grow, never shrink"), and the refusal changes
	// nothing.
	if err := w.e.Close(); err != nil {
		t.Fatal(err)
	}
	w.e = nil
	short := w.o
	short.ArchiveWindow = 10 * time.Hour
	short.Logger = quiet
	if e, err := engine.Open(&short); err == nil {
		_ = e.Close()
		t.Fatalf("reopened with a shorter ArchiveWindow: accepted")
	} else if !errors.Is(err, engine.ErrLayout) && !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("reopened with a shorter ArchiveWindow: %v, want ErrLayout or ErrOptions", err)
	}
	w.e = open(t, w.o)
	w.mustDup("reopened after the refused shorter archive window", 0, w.cur())

	down.Store(false)
	w.commit()
	if st, ok := laWaitLag(w.e, 15*time.Second); !ok {
		t.Fatalf("archive back: still lags %+v", *st.Archive)
	}
	w.mustDup("archive back", 0, w.cur())

	w.reopen(func(o *engine.Options) { o.ArchiveWindow = 20 * time.Hour })
	// What the 12-hour archive window kept (ages up to 11) stays, now for
	// 20 hours.
	keptFrom := max(0, w.cur()-11)
	w.mustDup("reopened with a 20-hour archive window", keptFrom, w.cur())
	w.advance(5 * laPart)
	w.commit()
	w.mustDup("5 hours on", keptFrom, w.cur())
	if st, ok := laWaitLag(w.e, 15*time.Second); !ok {
		t.Fatalf("20-hour archive window: lags %+v", *st.Archive)
	}
	w.mustDup("5 hours on, archived", keptFrom, w.cur())
	w.reopen(nil)
	w.mustDup("reopened again", keptFrom, w.cur())
}

// TestLifeAttackJumpWhileArchiveDownThenReopen: many partitions close at
// once while the archive is down, past the window; the engine is closed
// and reopened at once, then the archive comes back. The keys are
// Duplicate throughout, read from the store's held partitions and then
// from the archive.
func TestLifeAttackJumpWhileArchiveDownThenReopen(t *testing.T) {
	clock := newClock()
	mem := vfs.NewMem()
	var down atomic.Bool
	arch := failingArchive(pebble.ArchiveDir{Dir: "archive", FS: mem}, &down)
	w := newLAWorld(t, laOptions(clock, mem, arch), clock)
	w.hours(3)
	if _, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("lags: %+v", w.e.Stats().Archive)
	}
	down.Store(true)
	w.commit()
	w.advance(9 * laPart) // clock at 12: partitions 0..3 past the window
	w.commit()
	w.mustDup("after the jump, archive down", 1, w.cur())
	w.reopen(nil)
	w.mustDup("reopened, archive down", 1, w.cur())
	down.Store(false)
	if st, ok := laWaitLag(w.e, 15*time.Second); !ok {
		t.Fatalf("archive back (clock unmoved): still lags %+v", *st.Archive)
	}
	w.mustDup("archive back", 1, w.cur())
	w.reopen(nil)
	w.mustDup("reopened, archived", 1, w.cur())
}

// TestLifeAttackDetachThenNewArchive: an archived store is opened with
// DetachArchive (its archived history may go; the keys of its window may
// not), keys are committed while detached, and a new archive is attached.
// The keys inside the window when the new archive was attached are
// archived by it when they leave the window, and stay Duplicate for the
// archive window.
func TestLifeAttackDetachThenNewArchive(t *testing.T) {
	clock := newClock()
	mem := vfs.NewMem()
	w := newLAWorld(t, laOptions(clock, mem, pebble.ArchiveDir{Dir: "archive", FS: mem}), clock)
	w.hours(6) // 0..5, clock at 6
	if _, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("lags: %+v", w.e.Stats().Archive)
	}
	w.reopen(func(o *engine.Options) { o.Archive, o.ArchiveWindow, o.DetachArchive = nil, 0, true })
	w.mustDup("detached: the window", w.cur()-3, w.cur())
	w.hours(2) // detached, commits in 6 and 7; the clock at 8
	w.mustDup("detached, 2 hours on: the window", w.cur()-3, w.cur())
	w.reopen(func(o *engine.Options) {
		o.Archive, o.ArchiveWindow, o.DetachArchive = pebble.ArchiveDir{Dir: "archive-new", FS: mem}, laAW, false
	})
	attachedAt := w.cur()
	w.mustDup("new archive: the window", attachedAt-3, attachedAt)
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("new archive lags: %+v", *st.Archive)
	}
	w.hours(6) // the clock at 14: the window at attach time is 7..10 old
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("new archive lags: %+v", *st.Archive)
	}
	w.mustDup("new archive, 6 hours on", attachedAt-3, w.cur())
	w.reopen(nil)
	w.mustDup("new archive, reopened", attachedAt-3, w.cur())
}

// TestLifeAttackDetachWhileArchiveLags: the archive lags (down), so the
// store holds partitions past its window; it is detached (that history
// may go) and the clock moves on within the same session. The window's
// keys stay, and the held partitions go at the next drop (no store
// growing forever): a new archive then attached holds the keys the
// window had.
func TestLifeAttackDetachWhileArchiveLags(t *testing.T) {
	clock := newClock()
	mem := vfs.NewMem()
	var down atomic.Bool
	down.Store(true)
	w := newLAWorld(t, laOptions(clock, mem, failingArchive(pebble.ArchiveDir{Dir: "archive", FS: mem}, &down)), clock)
	w.hours(8)
	w.reopen(func(o *engine.Options) { o.Archive, o.ArchiveWindow, o.DetachArchive = nil, 0, true })
	w.mustDup("detached", w.cur()-3, w.cur())
	w.hours(3)
	w.mustDup("detached, 3 hours on", w.cur()-3, w.cur())
	w.reopen(func(o *engine.Options) {
		o.Archive, o.ArchiveWindow, o.DetachArchive = pebble.ArchiveDir{Dir: "archive-new", FS: mem}, laAW, false
	})
	from := w.cur() - 3
	w.hours(7)
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("new archive lags: %+v", *st.Archive)
	}
	w.mustDup("new archive, 7 hours on", from, w.cur())
}

// ---------------------------------------------------------------------
// Promise 3: nothing dropped while a durable claim is held.

// TestLifeAttackDurableClaimAcrossPartitions: with an archive attached,
// durable claims (MaxAttempts 1) are held for 12 hours, three times the
// window, by Extend every 90 minutes while the archive takes and the
// store drops the partitions they were claimed in. The one committed at
// the end is Duplicate (from the store, then from the archive); the one
// abandoned (Close) is Poison at the next Open, not New; a third,
// released, is Poison (a counted failure).
func TestLifeAttackDurableClaimAcrossPartitions(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	o := laOptions(clock, mem, pebble.ArchiveDir{Dir: "archive", FS: mem})
	o.DurableClaims, o.MaxAttempts, o.Lease = true, 1, 2*time.Hour
	w := newLAWorld(t, o, clock)
	w.commit()
	var held []engine.Claim
	for _, k := range []string{"abandoned", "committed", "released"} {
		c, err := w.e.Claim(ctx, []byte(k))
		if err != nil || c.Outcome != engine.New {
			t.Fatalf("claim %s: %v %v", k, c.Outcome, err)
		}
		held = append(held, c)
	}
	for step := range 8 { // 12 hours
		w.advance(90 * time.Minute)
		w.commit()
		for i := range held {
			if err := w.e.Extend(ctx, &held[i], 2*time.Hour); err != nil {
				t.Fatalf("step %d: extend %s: %v", step, held[i].Key, err)
			}
		}
		if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
			t.Fatalf("step %d: archive lags %+v", step, *st.Archive)
		}
		for i := range held {
			in, err := w.e.Lookup(ctx, held[i].Key)
			if err != nil || in.Outcome != engine.InFlight {
				t.Fatalf("step %d: a held claim's key %s: %+v %v, want InFlight", step, held[i].Key, in, err)
			}
		}
	}
	if err := w.e.Commit(ctx, held[1]); err != nil {
		t.Fatalf("commit after 12 hours of heartbeats: %v", err)
	}
	if err := w.e.Release(ctx, held[2]); err != nil {
		t.Fatalf("release after 12 hours of heartbeats: %v", err)
	}
	check := func(what string, want map[string]engine.Outcome) {
		t.Helper()
		for k, wo := range want {
			c, err := w.e.Claim(ctx, []byte(k))
			if err != nil {
				t.Fatalf("%s: claim %s: %v", what, k, err)
			}
			if c.Outcome == engine.New {
				_ = w.e.UnclaimBatch(ctx, []engine.Claim{c}, nil)
			}
			if c.Outcome != wo {
				t.Errorf("%s: %s is %v, want %v", what, k, c.Outcome, wo)
			}
		}
	}
	check("after commit", map[string]engine.Outcome{"committed": engine.Duplicate, "released": engine.Poison})
	w.reopen(nil) // "abandoned" is abandoned
	check("reopened", map[string]engine.Outcome{"abandoned": engine.Poison, "committed": engine.Duplicate, "released": engine.Poison})
	w.advance(6 * laPart) // the commit left the window: the archive answers
	w.commit()
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("archive lags %+v", *st.Archive)
	}
	check("6 hours later", map[string]engine.Outcome{"committed": engine.Duplicate})
	w.mustDup("history", max(0, w.cur()-11), w.cur())
}

// TestLifeAttackDurableClaimAcrossReopenAndJump: a durable claim extended
// across partitions and abandoned by a crash-free Close while the archive
// is down (the store holds everything); the clock then jumps past the
// window at reopen. The attempt stays counted while its last renewal is
// inside the window.
func TestLifeAttackDurableClaimAcrossReopenAndJump(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	var down atomic.Bool
	down.Store(true)
	o := laOptions(clock, mem, failingArchive(pebble.ArchiveDir{Dir: "archive", FS: mem}, &down))
	o.DurableClaims, o.MaxAttempts, o.Lease = true, 1, 2*time.Hour
	w := newLAWorld(t, o, clock)
	c, err := w.e.Claim(ctx, []byte("held"))
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim: %v %v", c.Outcome, err)
	}
	for range 6 {
		w.advance(90 * time.Minute)
		w.commit()
		if err := w.e.Extend(ctx, &c, 2*time.Hour); err != nil {
			t.Fatalf("extend: %v", err)
		}
	}
	w.reopen(nil)
	w.advance(2 * laPart) // the last renewal 2 hours old, inside the window
	got, err := w.e.Claim(ctx, []byte("held"))
	if err != nil {
		t.Fatal(err)
	}
	if got.Outcome != engine.Poison {
		t.Fatalf("the abandoned durable claim after reopen and a 2-hour jump: %v, want Poison", got.Outcome)
	}
	down.Store(false)
	w.commit()
	if st, ok := laWaitLag(w.e, 15*time.Second); !ok {
		t.Fatalf("archive back: lags %+v", *st.Archive)
	}
	w.mustDup("archive back", max(0, w.cur()-11), w.cur())
}

// TestLifeAttackWriteInFlightAcrossJumpPastWindow: a MarkBatch has read
// the engine's time (partition p) and is about to write its commit (held
// in enginetest.SetBeforeDurable, as a slow disk or a descheduled
// goroutine would hold it) when the clock jumps past the window. The
// sealer waits for that write (the store's write gate), but the archiver
// takes the partitions that left the window without a seal
// (tier/archive/move.go pass: only p >= Oldest(cur) needs one), and the
// store then drops them (Release). The write lands afterwards in p and
// the mark answers New: its key must be Duplicate from then on, for the
// archive window.
func TestLifeAttackWriteInFlightAcrossJumpPastWindow(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	w := newLAWorld(t, laOptions(clock, mem, pebble.ArchiveDir{Dir: "archive", FS: mem}), clock)
	w.hours(2)
	w.commit() // partition 2 holds keys
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("lags: %+v", *st.Archive)
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
	key := []byte("in-flight")
	type result struct {
		o   engine.Outcome
		err error
	}
	done := make(chan result, 1)
	go func() {
		out := make([]engine.Outcome, 1)
		err := w.e.MarkBatch(ctx, [][]byte{key}, nil, out)
		done <- result{out[0], err}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the mark never reached its durable write")
	}
	p := w.cur() // the partition the held mark writes in
	w.advance(6 * laPart)
	// The archiver takes p and p+1 (left the window) and the store drops
	// them, while the mark is held.
	moved := laWaitUntil(5*time.Second, func() bool { return w.e.Stats().Archive.Lag <= uint64(w.cur()-(p+2)) })
	t.Logf("archive while the mark is held (moved past p+1: %v): %+v", moved, *w.e.Stats().Archive)
	close(release)
	var r result
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the held mark never returned")
	}
	if r.err != nil || r.o != engine.New {
		t.Logf("the held mark: %v, %v (not acknowledged New: nothing promised)", r.o, r.err)
		return
	}
	check := func(what string) {
		t.Helper()
		in, err := w.e.Lookup(ctx, key)
		if err != nil {
			t.Fatalf("%s: lookup: %v", what, err)
		}
		if in.Outcome != engine.Duplicate {
			t.Errorf("%s: the key a mark acknowledged New (written in partition %d, %d hours ago) is %v from %v, want Duplicate (archive %+v)",
				what, p, w.cur()-p, in.Outcome, in.Source, *w.e.Stats().Archive)
		}
	}
	check("right after the mark")
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("lags: %+v", *st.Archive)
	}
	check("archive caught up")
	w.reopen(nil)
	check("reopened")
	out := make([]engine.Outcome, 1)
	if err := w.e.MarkBatch(ctx, [][]byte{key}, nil, out); err != nil || out[0] != engine.New {
		// Only a New here is a second delivery let through.
		return
	}
	t.Errorf("the key a mark acknowledged New was marked New again %d hours later (archive window %v)", w.cur()-p, laAW)
}
