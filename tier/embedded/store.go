package embedded

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// Options configure a Store. The engine fills them from its own Options.
type Options struct {
	// Dir is the directory: required unless BloomOnly, whose state it
	// keeps when set.
	Dir string
	// FS is the filesystem under Dir; nil means the operating system's.
	FS vfs.FS
	// BloomOnly keeps the filters alone, with no Pebble store: they are
	// then the only tier, and their state (in Dir) is saved at Close.
	BloomOnly bool
	// NoSync, CacheSize: the Pebble store's (pebble.Options).
	NoSync    bool
	CacheSize int
	// Window and Partition are the engine's, already validated.
	Window, Partition time.Duration
	// ExpectedKeys and FalsePositive size the filters (bloom.Options).
	ExpectedKeys  int
	FalsePositive float64
	// Logger receives the store's logs; nil means the standard logger.
	Logger *log.Logger
	// Now is the engine's clock reading (Unix ns), 0 when it is not one;
	// the store starts from the later of it and its own recorded clock.
	Now int64
	// HoldDrops says an archive is configured, which needs a partition
	// until it holds it: no partition is dropped (Open records the clock
	// only) until the archive gives its reach (HoldFor; see life.go).
	HoldDrops bool
}

// Store is the engine's embedded default: a Pebble store in a directory
// and the Bloom filters in front of it, with their lifecycle (seals, the
// snapshot, the rebuild) and the directory's handoff (Export, Import);
// or, BloomOnly, the filters alone with their state in the directory. It
// is safe for concurrent use.
type Store struct {
	parts     tier.Partitions
	window    time.Duration
	logger    *log.Logger
	store     *pebble.Store // nil when BloomOnly
	bloom     *bloom.Filters
	snapshots *snapshotFile // nil when the filters are not persisted
	sealedDir *snapshotFile // the sealed partitions' directory (not BloomOnly)
	dirLock   io.Closer     // bloom-only's hold on Dir

	holdDrops bool        // Options.HoldDrops
	life      life        // the partitions' lives: every drop (life.go)
	onSealed  func()      // called after a pass sealed a partition; nil: none
	closing   atomic.Bool // closed: a second Close does nothing

	secret   shard.Secret // keys the fingerprints
	hasher   shard.Hasher // of secret, for the rebuild
	now      int64        // the clock reading Open starts from
	openedAt int64        // the store's creation, 0 when unknown or later than now

	// warm is true while the filters have seen every key the store
	// holds, so a "no" may skip the store.
	warm       atomic.Bool
	rebuilding atomic.Bool
	// cold, while rebuilding, lists the partitions whose filter the
	// rebuild is refilling; every other live partition's filter is
	// complete. Nil when warm, or when no filter is known complete.
	cold      atomic.Pointer[[]int64]
	toRebuild []int64 // between Open and Start

	// gate tracks the writes in flight, so the sealer knows when a closed
	// partition gets no more; sealed is the sealer's (and Open's) set of
	// partitions whose filter is saved with a seal the store holds; the
	// sealer wakes on sealWake (nil when partitions are not sealed).
	gate      writeGate
	sealFrom  int64      // the partition the store was created in: the sealer skips older ones, which hold nothing
	sealMu    sync.Mutex // held by a sealing pass
	sealedMu  sync.Mutex // guards sealed, which a pass writes and anyone reads
	sealed    map[int64]bool
	sealWake  chan struct{}
	current   atomic.Int64 // the engine's current partition
	highWater func() int64 // the engine's clock, for the seals

	stop    context.CancelFunc
	workers sync.WaitGroup // the rebuild and the sealer

	rebuilt, sealedN, sealedLoaded, sealFailures atomic.Uint64

	// The checkpointer (checkpoint.go): woken on ckptWake once sinceCkpt
	// keys reached ckptEvery; nil when the filters are not checkpointed.
	ckptWake                   chan struct{}
	sinceCkpt                  atomic.Uint64
	ckptEvery                  atomic.Uint64 // follows the filters as they grow
	checkpoints, ckptFailures  atomic.Uint64
	restoredParts, journalKeys atomic.Uint64
}

// Exact returns the Pebble store, the exact tier; nil when BloomOnly.
func (s *Store) Exact() tier.Exact {
	if s.store == nil {
		return nil
	}
	return s.store
}

// ID returns the Pebble store's ID; zero when BloomOnly.
func (s *Store) ID() [16]byte {
	if s.store == nil {
		return [16]byte{}
	}
	return s.store.Layout().ID
}

// Secret returns the secret that keys the fingerprints: the directory's,
// or a new one when nothing was persisted.
func (s *Store) Secret() shard.Secret { return s.secret }

// Now returns the clock reading to start from: the later of Options.Now
// and the clock the directory recorded (0 when neither is one).
func (s *Store) Now() int64 { return s.now }

// OpenedAt returns when the store was created, 0 when unknown or not
// before Now.
func (s *Store) OpenedAt() int64 { return s.openedAt }

// Start begins the background work, the engine's partition being current:
// the rebuild of the filters Open could not load, and the sealer of
// closed partitions. highWater reads the engine's clock.
func (s *Store) Start(current int64, highWater func() int64) {
	s.current.Store(current)
	s.highWater = highWater
	ctx, cancel := context.WithCancel(context.Background())
	s.stop = cancel
	if s.store == nil {
		return
	}
	s.sealWake = make(chan struct{}, 1) // before the rebuild, which wakes the sealer
	s.ckptWake = make(chan struct{}, 1) // and the checkpointer
	s.ckptEvery.Store(s.checkpointEvery())
	if !s.warm.Load() {
		rebuild := s.toRebuild
		s.toRebuild = nil
		s.cold.Store(&rebuild)
		s.rebuilding.Store(true)
		s.workers.Add(1)
		go s.rebuild(ctx, spans(rebuild))
	}
	s.workers.Add(1)
	go s.work(ctx, s.sealWake, s.seal)
	s.sealWakeup() // partitions that closed while the store was closed
	s.workers.Add(1)
	go s.work(ctx, s.ckptWake, s.checkpointPass)
}

// Close stops the background work and, if the store works, seals what
// closed since the sealer's last pass, persists the engine's clock
// highWater, seals the state and saves the filters with it (so the next
// Open is warm), then closes the store. No write may follow or run
// concurrently. Errors match tier.ErrStorage.
func (s *Store) Close(highWater int64) error {
	if s.closing.Load() {
		return nil // closed already
	}
	if s.stop != nil {
		s.stop()
	}
	s.workers.Wait()
	var errs []error
	healthy := s.store == nil || s.store.Broken() == nil
	if s.sealWake != nil && healthy {
		// No call is in flight: seal what closed since the sealer's last
		// pass (a crash then needs to rebuild only the open partition).
		s.seal(context.Background())
	}
	meta := bloom.SnapshotMeta{Kind: bloom.SnapshotState, Secret: s.secret, HighWater: highWater}
	if s.store != nil && healthy {
		// Persist the high-water clock, so time does not run back across a
		// clean restart, then seal the state the snapshot describes: no
		// write follows.
		s.life.mu.Lock()
		err := s.drop(s.current.Load(), highWater)
		s.life.mu.Unlock()
		if err == nil {
			meta = bloom.SnapshotMeta{Kind: bloom.SnapshotCache, StoreID: s.store.Layout().ID, HighWater: highWater}
			meta.Epoch, err = s.store.SealSnapshot()
		}
		if err != nil {
			errs = append(errs, storageErr(err))
			healthy = false
		}
	}
	if s.snapshots != nil && s.warm.Load() && healthy {
		if err := s.snapshots.save(s.bloom, meta); err != nil {
			errs = append(errs, fmt.Errorf("tierdedup: saving bloom snapshot: %w", err))
		}
	}
	closed := true
	if s.store != nil {
		if err := s.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", tier.ErrStorage, err))
			closed = false // the store may still hold its directory
		}
	}
	if s.dirLock != nil && closed {
		_ = s.dirLock.Close()
	}
	if closed {
		s.releaseDir()
		s.closing.Store(true)
	}
	return errors.Join(errs...)
}

// Stats are the store's figures (tier.LocalStats).
type Stats = tier.LocalStats

// Stats returns the store's figures.
func (s *Store) Stats() Stats {
	st := Stats{
		Bytes: s.bloom.Bytes(), EstimatedFP: s.bloom.EstimatedFalsePositive(),
		RebuiltKeys: s.rebuilt.Load(), Sealed: s.sealedN.Load(), SealedLoaded: s.sealedLoaded.Load(), SealFailures: s.sealFailures.Load(),
		Checkpoints: s.checkpoints.Load(), CheckpointFailures: s.ckptFailures.Load(),
		RestoredPartitions: s.restoredParts.Load(), JournalKeys: s.journalKeys.Load(),
	}
	switch {
	case s.warm.Load():
		st.Mode = "warm"
	case s.rebuilding.Load():
		st.Mode = "rebuilding"
	default:
		st.Mode = "cold"
	}
	_, _, per := s.bloom.Params()
	st.TargetFP = 1 - pow(1-per, s.parts.Live)
	if s.store != nil {
		st.Disk = s.store.Disk()
	}
	if s.snapshots != nil {
		st.Disk.Allocated = allocated(s.snapshots.fs, s.snapshots.dir)
	}
	return st
}

// FsyncLatency returns the WAL's fsync latency histogram over the bounds
// want (pebble.Store.FsyncLatency); nothing when BloomOnly.
func (s *Store) FsyncLatency(want []float64) (bounds []float64, counts []uint64, count uint64, sum float64) {
	if s.store == nil {
		return nil, nil, 0, 0
	}
	return s.store.FsyncLatency(want)
}

func pow(x float64, n int) float64 {
	r := 1.0
	for range n {
		r *= x
	}
	return r
}

// SetArchived records that every partition before next is in the engine's
// archive (pebble.Store.SetArchived); next < 0 removes the record. Errors
// match tier.ErrStorage.
func (s *Store) SetArchived(next int64) error {
	if s.store == nil {
		return nil
	}
	if err := s.store.SetArchived(next); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

// DetachArchive lets the store's archive go: the SetArchived record is
// removed and the detached archives counted, durably; it returns the new
// count (ArchiveGeneration). From then on the store drops what leaves
// the window, the partitions it held for the archive included, at the
// next drop.
func (s *Store) DetachArchive() (int64, error) {
	if s.store == nil {
		return 0, nil
	}
	gen, err := s.store.DetachArchive()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	s.life.mu.Lock()
	s.holdDrops, s.life.reach = false, nil
	s.life.mu.Unlock()
	return gen, nil
}

// SetArchiveAttached records, durably, that an archive is attached.
func (s *Store) SetArchiveAttached() error {
	if s.store == nil {
		return nil
	}
	if err := s.store.SetArchiveAttached(); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

// ArchiveAttached reports whether an archive is attached (recorded by
// SetArchiveAttached since the last DetachArchive).
func (s *Store) ArchiveAttached() (bool, error) {
	if s.store == nil {
		return false, nil
	}
	ok, err := s.store.ArchiveAttached()
	if err != nil {
		return false, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return ok, nil
}

// ArchiveGeneration returns how many archives were detached from the
// store: an archive attached now is bound to this generation.
func (s *Store) ArchiveGeneration() (int64, error) {
	if s.store == nil {
		return 0, nil
	}
	gen, err := s.store.ArchiveGeneration()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return gen, nil
}

// Archived returns the record SetArchived made (ok false: none).
func (s *Store) Archived() (next int64, ok bool, err error) {
	if s.store == nil {
		return 0, false, nil
	}
	next, ok, err = s.store.Archived()
	if err != nil {
		return 0, false, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return next, ok, nil
}
