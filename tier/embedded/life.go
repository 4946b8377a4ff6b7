package embedded

import (
	"fmt"
	"sync"
)

// A partition's life in the store, and its one owner.
//
// Each partition passes through these stages, in order, and each is
// recorded durably where the next Open reads it:
//
//	open      the partition of the engine's clock: writes land in it
//	closed    before the persisted clock (the Drop record's high-water
//	          clock): no write lands in it again
//	sealed    its filter saved to a file, and a seal naming the file in
//	          the store (pebble.Store.SealPartition); writes into it are
//	          refused from then on
//	moved     its records copied to the cold database and the move
//	          recorded (pebble's keyMoved)
//	archived  held by the archive, as far as the archive's reach says
//	          (the archive's Next; the store also records it,
//	          SetArchived, so that it is never opened without it)
//	dropped   deleted, with its seal, by one synced range deletion that
//	          records the clock too (pebble.Store.Drop)
//
// The store decides every drop, here and nowhere else: life.drop is the
// only caller of pebble.Store.Drop. The events that move a partition on
// are the engine's rotation (Rotate: a partition closes, one may leave
// the window), the sealer's pass (a partition sealed: the archive is
// told, OnSealed), the archive's progress (Release: it holds more, so the
// store may drop more), Open and Close. None is polled.
//
// What is dropped is decided from one floor: every partition before the
// oldest live one, except those an attached archive does not hold yet
// (its reach), which stay, read unfiltered for keys found nowhere else,
// until it does. The transitions that change the floor:
//   - A longer window on reopen keeps the partitions the shorter one had
//     not dropped yet (nothing dropped comes back); a shorter one is
//     refused (pebble's layout: keys were promised the stored one).
//   - An archive attached (or configured: HoldDrops) holds every drop
//     from Open until the archiver gives its reach (HoldFor), then holds
//     back what it has not taken; a longer or shorter archive window
//     changes only the archive's own expiry.
//   - An archive detached (DetachArchive, the engine's
//     Options.DetachArchive) clears the hold and the reach: the floor is
//     the window's again, and the next drop lets the held partitions go.
//     An archive attached again starts from the store's partitions then.
//   - A claim is never held by the floor: a durable claim's attempt is
//     written again in the current partition while it is extended
//     (engine/extend.go), so a drop never takes a live claim.
//
// The recorded clock never moves back: every drop records the latest
// reading it was given or recorded before.

// Stage is a partition's stage in the store (see above).
type Stage int

// The stages, in the order a partition passes them.
const (
	// StageFuture is a partition after the current one.
	StageFuture Stage = iota
	StageOpen
	StageClosed
	StageSealed
	StageMoved
	StageArchived
	StageDropped
)

var stageNames = [...]string{"future", "open", "closed", "sealed", "moved", "archived", "dropped"}

// String names the stage.
func (s Stage) String() string {
	if s < 0 || int(s) >= len(stageNames) {
		return fmt.Sprintf("Stage(%d)", int(s))
	}
	return stageNames[s]
}

// life is the store's owner of partitions' lives: it serialises the drops
// and holds what decides them.
type life struct {
	mu       sync.Mutex
	reach    func() int64 // the archive's first partition not held; nil: none given
	recorded int64        // the latest clock a drop recorded
	dropped  int64        // every partition before it is dropped
}

// floor returns the first partition the store must keep when cur is the
// current partition: the oldest live one, or the first the archive does
// not hold yet; with an archive configured whose reach is not known yet
// (HoldDrops before HoldFor), none is dropped.
func (s *Store) floor(cur int64) int64 {
	f := s.parts.Oldest(cur)
	switch {
	case s.life.reach != nil:
		f = min(f, s.life.reach())
	case s.holdDrops:
		f = 0
	}
	return f
}

// drop deletes the partitions before the floor of cur and records the
// clock highWater (or a later one recorded before), synced, in one step;
// the caller holds life.mu. Errors match tier.ErrStorage.
func (s *Store) drop(cur, highWater int64) error {
	if s.store == nil {
		return nil
	}
	highWater = max(highWater, s.life.recorded)
	before := s.floor(cur)
	if err := s.store.Drop(before, highWater); err != nil {
		return storageErr(err)
	}
	s.life.recorded = highWater
	s.life.dropped = max(s.life.dropped, before)
	return nil
}

// Rotate makes p the current partition (the engine's clock, highWater,
// moved into it): the store drops what left the window (and the archive
// holds), recording the clock, then the filters drop what left the
// window and the sealer is woken for the partition that closed. It
// returns how many filters were dropped. A failed drop changes nothing:
// the engine keeps its current partition and rotates again at its next
// reading.
func (s *Store) Rotate(p, highWater int64) (dropped int, err error) {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	if p <= s.current.Load() {
		return 0, nil
	}
	if err := s.drop(p, highWater); err != nil {
		return 0, err
	}
	dropped = s.bloom.Rotate(p)
	s.current.Store(p)
	s.sealWakeup()
	return dropped, nil
}

// HoldFor gives the store the archive's reach: the first partition the
// archive does not hold yet, which must never decrease. From then on the
// store keeps every partition from there on, and lets go of those before
// it once they leave the window (Release). Called once, by the archiver,
// before the engine answers anything.
func (s *Store) HoldFor(reach func() int64) {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	s.life.reach = reach
}

// Release drops what the archive's reach now lets go, recording the
// engine's clock: the archiver calls it after it moved its reach on.
func (s *Store) Release() error {
	s.life.mu.Lock()
	defer s.life.mu.Unlock()
	hw := s.life.recorded
	if s.highWater != nil {
		hw = max(hw, s.highWater())
	}
	return s.drop(s.current.Load(), hw)
}

// CloseWrites refuses every write into a partition before `before` from
// now on, and returns once every write into them it did not refuse is
// durable or failed (pebble.Store.CloseWrites). Errors match
// tier.ErrStorage.
func (s *Store) CloseWrites(before int64) error {
	if s.store == nil {
		return nil
	}
	if err := s.store.CloseWrites(before); err != nil {
		return storageErr(err)
	}
	return nil
}

// OnSealed sets fn to be called after each sealing pass that sealed a
// partition (the archiver's wake-up). Set before Start.
func (s *Store) OnSealed(fn func()) { s.onSealed = fn }

// Stage returns partition p's stage, as the store's records give it.
func (s *Store) Stage(p int64) Stage {
	cur := s.current.Load()
	s.life.mu.Lock()
	dropped, reach := s.life.dropped, s.life.reach
	s.life.mu.Unlock()
	switch {
	case p > cur:
		return StageFuture
	case p == cur:
		return StageOpen
	case p < dropped:
		return StageDropped
	case reach != nil && p < reach():
		return StageArchived
	case s.store != nil && p <= s.store.MovedUpTo():
		return StageMoved
	}
	if s.isSealed(p) {
		return StageSealed
	}
	return StageClosed
}
