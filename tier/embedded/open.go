package embedded

import (
	"errors"
	"fmt"
	"log"
	"math"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// Open opens (or creates) the store in o.Dir exclusively, finishing an
// Import a crash interrupted first, and loads the filters: warm from the
// snapshot of the exact state a clean Close left, or the sealed
// partitions' files and a rebuild of the others to come (Start). BloomOnly
// loads the filters' saved state instead. Errors match tier.ErrLocked,
// tier.ErrLayout, tier.ErrOptions or tier.ErrStorage. Start must follow
// before the store is used.
func Open(o *Options) (_ *Store, err error) {
	parts, err := tier.NewPartitions(o.Window, o.Partition)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrOptions, err)
	}
	s := &Store{parts: parts, window: o.Window, logger: o.Logger, now: o.Now, secret: shard.NewSecret(), holdDrops: o.HoldDrops}
	if s.logger == nil {
		s.logger = log.Default()
	}
	if o.Dir != "" {
		s.snapshots = newSnapshotFile(o.FS, o.Dir)
		s.sealedDir = newSnapshotFile(o.FS, s.snapshots.fs.PathJoin(o.Dir, sealedSubdir))
		// Within the process, by file identity: a file lock does not
		// exclude its own process, and Pebble's check compares the path's
		// spelling, so a symbolic link or a relative path would open a
		// directory twice.
		if !s.reserveDir(s.snapshots.fs, o.Dir) {
			return nil, fmt.Errorf("%w: %s is held by another engine of this process", tier.ErrLocked, o.Dir)
		}
	}
	defer func() {
		if err != nil {
			s.closeOpened()
			s.releaseDir()
		}
	}()
	if s.now == 0 && !s.recordsClock(o) {
		// Nothing to stand on: refused before anything is created.
		return nil, ErrNoClock
	}
	if o.BloomOnly {
		err = s.openBloomOnly(o)
	} else {
		err = s.openPebble(o)
	}
	if err != nil {
		return nil, err
	}
	if s.now == 0 {
		// A clock outside the range the engine takes as time, and no
		// stored reading to stand on: running at 1970 would let the first
		// sane reading drop every partition written meanwhile.
		return nil, ErrNoClock
	}
	s.hasher = shard.NewHasher(s.secret)
	if o.Dir != "" {
		s.holdDir(s.snapshots.fs, o.Dir)
	}
	return s, nil
}

// recordsClock reports whether o.Dir may hold a clock reading: a Pebble
// store (not BloomOnly) or bloom-only's saved state.
func (s *Store) recordsClock(o *Options) bool {
	switch {
	case s.snapshots == nil:
		return false
	case o.BloomOnly:
		return s.snapshots.exists()
	}
	return s.snapshots.holdsStore() || s.snapshots.exists()
}

// Discard closes a store that was never started (its owner failed to open
// after it) without saving or writing anything.
func (s *Store) Discard() {
	s.closeOpened()
	s.releaseDir()
}

// closeOpened closes what a failed Open opened.
func (s *Store) closeOpened() {
	if s.store != nil {
		_ = s.store.Close()
	}
	if s.dirLock != nil {
		_ = s.dirLock.Close()
	}
}

// openPebble opens the Pebble store and loads the filters for it.
func (s *Store) openPebble(o *Options) error {
	if o.Dir == "" {
		return fmt.Errorf("%w: the embedded store needs a Dir", tier.ErrOptions)
	}
	// An Import of Dir a crash interrupted is finished first: Dir is never
	// opened empty in place of the state it was replacing.
	if err := finishImport(s.snapshots.fs, canonical(s.snapshots.fs, o.Dir)); err != nil {
		return err
	}
	// Bloom-only's lock too, so that neither configuration opens a
	// directory the other holds, in another process (Pebble's own lock is
	// a file bloom-only does not take).
	lock, err := s.snapshots.lock()
	if err != nil {
		return err
	}
	s.dirLock = lock
	if err := s.snapshots.refuseState(); err != nil {
		return err
	}
	store, err := pebble.Open(&pebble.Options{Dir: o.Dir, FS: o.FS, NoSync: o.NoSync, CacheSize: o.CacheSize, Logger: s.logger, Partition: o.Partition, Window: o.Window, Now: s.now, Journal: true, KeepExpired: o.HoldDrops})
	switch {
	case errors.Is(err, pebble.ErrLocked):
		return fmt.Errorf("%w: %w", tier.ErrLocked, err)
	case errors.Is(err, pebble.ErrLayout):
		return fmt.Errorf("%w: %w", tier.ErrLayout, err)
	case err != nil:
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	s.store, s.secret = store, store.Layout().Secret
	// A store with an archive attached drops nothing by itself, even when
	// opened without it: the engine refuses that Open, or detaches the
	// archive and drops by its window from then on.
	s.holdDrops = s.holdDrops || store.KeepsExpired()
	hw, err := store.HighWater()
	if err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	if s.now = max(s.now, hw); s.now == 0 {
		return nil // Open refuses it, the store holding no reading either
	}
	s.sealFrom = math.MinInt64
	if created, err := store.Created(); err == nil {
		if created < s.now {
			s.openedAt = created
		}
		s.sealFrom = s.parts.Of(created)
	}
	if err := s.newFilters(o); err != nil {
		return err
	}
	return s.loadFilters()
}

// loadFilters makes the filters warm from the snapshot of the exact state
// the store was closed in, or loads the sealed partitions and lists the
// others for the rebuild. The snapshot can match only the epoch the store
// sealed at its last clean Close, which TakeSnapshotEpoch forgets before
// anything else is written; the file is removed whatever the outcome. So a
// snapshot is trusted at most once, and only for the exact state it was
// taken of.
func (s *Store) loadFilters() error {
	epoch, err := s.store.TakeSnapshotEpoch()
	if err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	id := s.store.Layout().ID
	s.sealed = make(map[int64]bool)
	err = s.snapshots.load(s.bloom, func(h bloom.SnapshotHeader) error {
		switch {
		case h.Kind != bloom.SnapshotCache:
			return fmt.Errorf("snapshot kind %d is not a store's cache", h.Kind)
		case h.StoreID != id:
			return errors.New("snapshot of another store")
		case epoch == 0 || h.Epoch != epoch:
			return errors.New("snapshot of an earlier state of this store (writes followed it)")
		}
		return nil
	}, true, s.logger)
	// Drop what expired while the store was closed, and persist the
	// high-water clock before answering anything.
	s.life.mu.Lock()
	derr := s.drop(s.parts.Of(s.now), s.now)
	s.life.mu.Unlock()
	if derr != nil {
		return derr
	}
	switch {
	case err == nil || s.store.Fresh():
		// Warm from the snapshot, or a store created by this Open, which
		// holds nothing the filters have not seen.
		s.warm.Store(true)
		err = s.keepSealed(s.parts.Of(s.now))
	default:
		if !isNotExist(err) {
			s.logger.Printf("tierdedup: bloom snapshot not used, rebuilding from Pebble: %v", err)
		}
		s.toRebuild, err = s.loadSealed(s.parts.Of(s.now))
		if err == nil {
			s.toRebuild, err = s.restore(s.toRebuild)
		}
		if err == nil && len(s.toRebuild) == 0 {
			s.warm.Store(true) // every live partition sealed or restored
		}
	}
	if err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

// openBloomOnly makes the filters the only tier, loading their state from
// Dir when it is set.
func (s *Store) openBloomOnly(o *Options) error {
	if err := s.newFilters(o); err != nil {
		return err
	}
	s.warm.Store(true)
	if s.snapshots == nil {
		return nil
	}
	// One engine at a time: two would each save their own filters at
	// Close, and the last would erase the other's keys.
	lock, err := s.snapshots.lock()
	if err != nil {
		return err
	}
	s.dirLock = lock
	// The snapshot is the whole state of bloom-only: it brings its secret
	// and clock, and one that cannot be used is an error, not a silent
	// fresh start that would let every duplicate through.
	hw, err := s.loadState()
	if err != nil {
		return err
	}
	s.now = max(s.now, hw)
	return nil
}

// newFilters makes the Bloom filters, current at the store's clock.
func (s *Store) newFilters(o *Options) (err error) {
	// The store's filters cache Pebble, which rebuilds them: they start
	// small and grow with the keys (ExpectedKeys is their ceiling).
	// Bloom-only's are the state itself, at the size its snapshot has.
	bopts := &bloom.Options{Partitions: s.parts, ExpectedKeys: o.ExpectedKeys, FalsePositive: o.FalsePositive, Grow: !o.BloomOnly}
	if s.bloom, err = bloom.New(bopts, s.parts.Of(s.now)); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrOptions, err)
	}
	return nil
}

// loadState loads bloom-only's snapshot (it is kept: a crash falls back to
// the state of the last clean Close) and returns its clock. A directory
// holding a Pebble store, a snapshot written for other parameters and a
// damaged snapshot are refused.
func (s *Store) loadState() (highWater int64, err error) {
	if err := s.snapshots.refuseStore(); err != nil {
		return 0, err
	}
	err = s.snapshots.load(s.bloom, func(h bloom.SnapshotHeader) error {
		if h.Kind != bloom.SnapshotState {
			return layoutError("Tiers", "memory+bloom+pebble", "bloom")
		}
		m, k, _ := s.bloom.Params()
		switch {
		case h.PartitionLength != s.parts.Length:
			return layoutError("Partition", time.Duration(h.PartitionLength).String(), time.Duration(s.parts.Length).String())
		case h.Live != s.parts.Live:
			return layoutError("Window", fmt.Sprintf("%d live partitions", h.Live), fmt.Sprintf("%d", s.parts.Live))
		case h.M != m || h.K != k:
			return layoutError("ExpectedKeys/FalsePositive", fmt.Sprintf("filters of %d bits, %d hashes", h.M, h.K), fmt.Sprintf("%d bits, %d hashes", m, k))
		}
		s.secret, highWater = h.Secret, h.HighWater
		return nil
	}, false, s.logger)
	switch {
	case err == nil:
		return highWater, nil
	case isNotExist(err):
		return 0, nil
	case errors.Is(err, tier.ErrLayout):
		return 0, err
	case errors.Is(err, bloom.ErrSnapshotVersion):
		// Filters of another layout cannot be converted (the keys are not
		// kept): the state is refused, not dropped, so the operator decides.
		return 0, fmt.Errorf("%w: bloom-only state in another filter format: %w (open it with the release that wrote it until its window has passed, or remove the file to start empty)", tier.ErrLayout, err)
	default:
		return 0, fmt.Errorf("%w: bloom-only state: %w (remove the file to start empty)", tier.ErrStorage, err)
	}
}

func layoutError(field, stored, given string) error {
	return fmt.Errorf("%w: %s is %s in the directory, %s in the options", tier.ErrLayout, field, stored, given)
}
