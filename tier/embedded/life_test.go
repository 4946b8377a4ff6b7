package embedded_test

import (
	"context"
	"errors"
	"io"
	"log"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// A store of 1-hour partitions whose clock starts at partition 100.
const (
	lifeHour  = int64(time.Hour)
	lifeStart = 100
)

// lifeStore is an embedded store under test with its engine's clock.
type lifeStore struct {
	*embedded.Store
	t  *testing.T
	hw atomic.Int64
}

// openLife opens (and starts) the store in dir with a window of `window`
// hours, its clock at partition at, holding drops for an archive when
// hold is set.
func openLife(t *testing.T, dir string, window int, at int64, hold bool) *lifeStore {
	t.Helper()
	s, err := openLifeErr(dir, window, at, hold)
	if err != nil {
		t.Fatal(err)
	}
	ls := &lifeStore{Store: s, t: t}
	ls.hw.Store(at * lifeHour)
	return ls
}

func openLifeErr(dir string, window int, at int64, hold bool) (*embedded.Store, error) {
	return embedded.Open(&embedded.Options{
		Dir: dir, Window: time.Duration(window) * time.Hour, Partition: time.Hour,
		ExpectedKeys: 1000, FalsePositive: 0.01, Logger: log.New(io.Discard, "", 0),
		Now: at * lifeHour, HoldDrops: hold, CacheSize: 1 << 20,
	})
}

func (s *lifeStore) start(onSealed func()) {
	if onSealed != nil {
		s.OnSealed(onSealed)
	}
	s.Start(s.hw.Load()/lifeHour, s.hw.Load)
	s.t.Cleanup(func() { _ = s.Close(s.hw.Load()) })
}

// commit writes key in the current partition, as the engine does.
func (s *lifeStore) commit(key string) {
	s.t.Helper()
	p := s.hw.Load() / lifeHour
	s.Add([]shard.Fingerprint{shard.Sum(shard.NewHasher(s.Secret()), "", []byte(key))}, p)
	out := make([]tier.Status, 1)
	if err := s.Exact().Commit(context.Background(), p, []tier.Request{{Key: []byte(key)}}, out); err != nil {
		s.t.Fatal(err)
	}
}

// rotate moves the clock into partition p.
func (s *lifeStore) rotate(p int64) {
	s.t.Helper()
	s.hw.Store(p * lifeHour)
	if _, err := s.Rotate(p, p*lifeHour); err != nil {
		s.t.Fatalf("Rotate(%d): %v", p, err)
	}
}

// held returns the partitions holding records.
func (s *lifeStore) held() map[int64]int {
	s.t.Helper()
	got := map[int64]int{}
	err := s.Exact().(tier.Scanner).Scan(context.Background(), 0, math.MaxUint32, func(p int64, _, _ []byte) error {
		got[p]++
		return nil
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return got
}

// waitStage waits until partition p reaches stage want.
func (s *lifeStore) waitStage(p int64, want embedded.Stage) {
	s.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stage(p) < want {
		if time.Now().After(deadline) {
			s.t.Fatalf("partition %d stays %v, want %v", p, s.Stage(p), want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (s *lifeStore) wantStage(p int64, want embedded.Stage) {
	s.t.Helper()
	if got := s.Stage(p); got != want {
		s.t.Fatalf("partition %d is %v, want %v", p, got, want)
	}
}

// TestLifeStages follows a partition through every stage, each from the
// event that causes it: a rotation closes it, the sealer seals it (and
// says so: OnSealed), the mover moves it, the archive's reach archives it
// and Release drops it. A partition that left the window stays while the
// archive does not hold it, and one the archive holds stays while it is
// in the window.
func TestLifeStages(t *testing.T) {
	s := openLife(t, t.TempDir(), 4, lifeStart, true)
	var sealedEvents atomic.Int64
	s.start(func() { sealedEvents.Add(1) })
	s.commit("a")
	s.wantStage(lifeStart, embedded.StageOpen)
	s.wantStage(lifeStart+1, embedded.StageFuture)

	s.rotate(lifeStart + 1)
	s.waitStage(lifeStart, embedded.StageSealed)
	// OnSealed runs after the sealing pass, so shortly after the stage
	// shows: waited for, not read at once (CI read it first, once).
	for deadline := time.Now().Add(10 * time.Second); sealedEvents.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("partition sealed, OnSealed not called")
		}
	}
	s.waitStage(lifeStart, embedded.StageMoved)

	// Configured for an archive that has given no reach yet: nothing is
	// dropped, in the window or out of it.
	s.rotate(lifeStart + 6)
	s.wantStage(lifeStart, embedded.StageMoved)
	if s.held()[lifeStart] != 1 {
		t.Fatalf("partition %d dropped before the archive gave its reach: %v", lifeStart, s.held())
	}
	var reach atomic.Int64
	reach.Store(lifeStart)
	s.HoldFor(reach.Load)
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if s.held()[lifeStart] != 1 {
		t.Fatalf("partition %d dropped before the archive held it: %v", lifeStart, s.held())
	}

	reach.Store(lifeStart + 1)
	s.wantStage(lifeStart, embedded.StageArchived)
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	s.wantStage(lifeStart, embedded.StageDropped)
	if len(s.held()) != 0 {
		t.Fatalf("after the archive took partition %d: %v, want nothing", lifeStart, s.held())
	}

	// Archived partitions inside the window stay.
	s.commit("b")
	p := s.hw.Load() / lifeHour
	s.rotate(p + 1)
	s.waitStage(p, embedded.StageSealed)
	reach.Store(p + 1)
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	s.wantStage(p, embedded.StageArchived)
	if s.held()[p] != 1 {
		t.Fatalf("partition %d, archived and in the window, dropped: %v", p, s.held())
	}
}

// TestLifeWithoutArchive: without an archive a partition is dropped by
// the rotation it leaves the window at, and Release (which only an
// archive calls) drops no more.
func TestLifeWithoutArchive(t *testing.T) {
	s := openLife(t, t.TempDir(), 4, lifeStart, false)
	s.start(nil)
	parts, _ := tier.NewPartitions(4*time.Hour, time.Hour)
	for p := int64(lifeStart); p < lifeStart+4; p++ {
		s.commit("k")
		s.rotate(p + 1)
	}
	// The rotation that makes 101 the oldest live partition drops 100.
	for p := int64(lifeStart + 4); parts.Oldest(p) <= lifeStart; p++ {
		if s.held()[lifeStart] != 1 {
			t.Fatalf("at partition %d (oldest live %d): partition %d dropped", p, parts.Oldest(p), lifeStart)
		}
		s.rotate(p + 1)
	}
	if h := s.held(); h[lifeStart] != 0 || h[lifeStart+1] != 1 {
		t.Fatalf("once partition %d left the window: %v, want it dropped and %d kept", lifeStart, h, lifeStart+1)
	}
	s.wantStage(lifeStart, embedded.StageDropped)
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if h := s.held(); h[lifeStart+1] != 1 {
		t.Fatalf("Release dropped a live partition: %v", h)
	}
}

// TestLifeDetach: a store whose archive never took partition 100 keeps it
// past the window, across a reopen (the attachment is recorded); once the
// archive is detached the next rotation drops it; a new archive attached
// holds again.
func TestLifeDetach(t *testing.T) {
	dir := t.TempDir()
	s := openLife(t, dir, 4, lifeStart, true)
	s.start(nil)
	if err := s.SetArchiveAttached(); err != nil {
		t.Fatal(err)
	}
	s.HoldFor(func() int64 { return lifeStart })
	s.commit("a")
	s.rotate(lifeStart + 6)
	if err := s.Close(s.hw.Load()); err != nil {
		t.Fatal(err)
	}

	// Reopened without the archive configured: the attachment recorded
	// holds the drops until the archive is detached.
	s = openLife(t, dir, 4, lifeStart+7, false)
	s.start(nil)
	s.rotate(lifeStart + 8)
	if s.held()[lifeStart] != 1 {
		t.Fatalf("partition %d, which the attached archive never took, dropped: %v", lifeStart, s.held())
	}
	if _, err := s.DetachArchive(); err != nil {
		t.Fatal(err)
	}
	s.rotate(lifeStart + 9)
	if h := s.held(); len(h) != 0 {
		t.Fatalf("after the archive was detached: %v, want nothing", h)
	}
	s.wantStage(lifeStart, embedded.StageDropped)

	// A new archive attached holds again what it has not taken, from the
	// store's partitions then.
	s.commit("b")
	p := s.hw.Load() / lifeHour
	if err := s.SetArchiveAttached(); err != nil {
		t.Fatal(err)
	}
	s.HoldFor(func() int64 { return p })
	s.rotate(p + 6)
	if s.held()[p] != 1 {
		t.Fatalf("partition %d, which the new archive has not taken, dropped: %v", p, s.held())
	}
}

// TestLifeLongerWindow: a store reopened with a longer window keeps what
// the shorter one had not dropped (and drops it when the longer window
// lets it go); a shorter window is refused, nothing dropped.
func TestLifeLongerWindow(t *testing.T) {
	dir := t.TempDir()
	s := openLife(t, dir, 4, lifeStart, false)
	s.start(nil)
	for p := int64(lifeStart); p < lifeStart+4; p++ {
		s.commit("k")
		s.rotate(p + 1)
	}
	if err := s.Close(s.hw.Load()); err != nil {
		t.Fatal(err)
	}
	if _, err := openLifeErr(dir, 2, lifeStart+4, false); !errors.Is(err, tier.ErrLayout) {
		t.Fatalf("reopened with a shorter window: %v, want ErrLayout", err)
	}
	// Reopened where the 4-hour window would have dropped 100 and 101,
	// the 8-hour one keeps them.
	short, _ := tier.NewPartitions(4*time.Hour, time.Hour)
	long, _ := tier.NewPartitions(8*time.Hour, time.Hour)
	at := short.Oldest(lifeStart+4) + int64(short.Live) + 1 // short.Oldest(at) > 101
	if short.Oldest(at) <= lifeStart+1 || long.Oldest(at) > lifeStart {
		t.Fatalf("bad test clock %d", at)
	}
	s = openLife(t, dir, 8, at, false)
	s.start(nil)
	if h := s.held(); h[lifeStart] != 1 || h[lifeStart+1] != 1 || h[lifeStart+3] != 1 {
		t.Fatalf("reopened with an 8-hour window at %d: %v, want 100..103 kept", at, h)
	}
	// And drops them when the longer window lets them go.
	next := lifeStart + 2 + int64(long.Live) - 1
	if long.Oldest(next) != lifeStart+2 {
		t.Fatalf("bad test clock %d: oldest %d", next, long.Oldest(next))
	}
	s.rotate(next)
	if h := s.held(); h[lifeStart+1] != 0 || h[lifeStart+2] != 1 {
		t.Fatalf("at %d with an 8-hour window: %v, want 102 and 103 only", next, h)
	}
}

// TestLifeClockNeverMovesBack: a drop records the latest clock it was
// given or recorded before, whichever event brings it: a Release that saw
// a later reading than the rotation after it leaves that reading as the
// store's clock on reopen.
func TestLifeClockNeverMovesBack(t *testing.T) {
	dir := t.TempDir()
	s := openLife(t, dir, 4, lifeStart, true)
	s.start(nil)
	s.HoldFor(func() int64 { return 0 })
	late := int64(lifeStart+1)*lifeHour + 30*int64(time.Minute)
	s.hw.Store(late) // the engine read this; the archiver releases with it
	if err := s.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rotate(lifeStart+1, int64(lifeStart+1)*lifeHour); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(int64(lifeStart+1) * lifeHour); err != nil {
		t.Fatal(err)
	}
	r, err := openLifeErr(dir, 4, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Discard()
	if r.Now() != late {
		t.Fatalf("reopened at clock %d, want the latest recorded %d", r.Now(), late)
	}
}

// TestOneOwnerDrops: in this package only life.go drops partitions, and
// the engine drops none of the embedded store's (it rotates, the store
// decides).
func TestOneOwnerDrops(t *testing.T) {
	for _, dir := range []string{".", "../../engine"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") || filepath.Base(f) == "life.go" {
				continue
			}
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, call := range []string{"store.Drop(", "local.Drop(", "Exact().(tier.Dropper)"} {
				if strings.Contains(string(b), call) {
					t.Errorf("%s calls %s: only life.go drops the embedded store's partitions", f, call)
				}
			}
		}
	}
}
