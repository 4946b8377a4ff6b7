package embedded

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// Sealed partitions. When the clock moves to a new partition, the previous
// one is closed: no record is written in it again (every write is in the
// partition of the engine's clock, which never runs back and is persisted
// before the rotation). Its Bloom filter is then saved to a file of its own
// and the store records a seal naming the file (a random ID, the file's
// checksum and size), synced, after the file is. After a crash, Open loads
// each sealed partition's file that its seal vouches for and rebuilds from
// Pebble only the partitions without one: the open partition, and any that
// closed while the filters were not warm.
//
// What makes a sealed file invalid, and who checks: a file with no seal in
// the store (a crash between the two writes, a partition dropped since) or
// another seal's ID, another store's ID, another checksum or size, other
// filter parameters (Options.ExpectedKeys or FalsePositive changed) is not
// loaded by Open and is removed; its partition is rebuilt from Pebble. The
// store refuses writes into a sealed partition (pebble.ErrSealed), so a seal
// cannot come to describe fewer keys than the store holds. Drop deletes
// seals with their partitions.

// sealedPrefix and sealedSuffix frame a sealed partition's file name in
// sealedSubdir, a directory of Dir of their own, whose entries only the
// engine changes and syncs (Pebble's own syncs of Dir do not make a
// removal durable there by chance).
const (
	sealedSubdir = "tierdedup-sealed"
	sealedPrefix = "tierdedup-bloom.p"
	sealedSuffix = ".sealed"
)

func sealedName(p int64) string { return sealedPrefix + strconv.FormatInt(p, 10) + sealedSuffix }

// sealedPartition parses a sealed file's name.
func sealedPartition(name string) (int64, bool) {
	s, ok := strings.CutPrefix(name, sealedPrefix)
	if !ok {
		return 0, false
	}
	if s, ok = strings.CutSuffix(s, sealedSuffix); !ok {
		return 0, false
	}
	p, err := strconv.ParseInt(s, 10, 64)
	return p, err == nil && strconv.FormatInt(p, 10) == s
}

// writeGate tells when every write that may be in a closed partition has
// ended. A write enters before it reads the engine's time and exits when it
// has written. wait flips the generation new writes enter under and waits
// for the old one to drain, twice: a write that entered before wait began
// read a generation at most the current one, so one of the two drains
// covers it, and a write that enters later reads the time after the
// rotation that wait follows, so it writes in a later partition.
type writeGate struct {
	gen atomic.Uint64
	n   [2]atomic.Int64
}

func (g *writeGate) enter() int {
	i := int(g.gen.Load() & 1)
	g.n[i].Add(1)
	return i
}

func (g *writeGate) exit(i int) { g.n[i].Add(-1) }

// wait returns once every write that entered before it has exited, or ctx
// ended.
func (g *writeGate) wait(ctx context.Context) error {
	for range 2 {
		i := (g.gen.Add(1) - 1) & 1
		for g.n[i].Load() != 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(200 * time.Microsecond):
			}
		}
	}
	return nil
}

// sealRetry is how long a failed sealing pass waits to try again.
const sealRetry = time.Second

// sealWakeup asks the sealer to look for closed partitions to seal.
func (s *Store) sealWakeup() { wake(s.sealWake) }

// wake asks the worker that waits on ch (nil: none) to run, without
// waiting: a wake-up already pending covers this one.
func wake(ch chan struct{}) {
	if ch != nil {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// work runs a background worker of the Store: pass each time ch is woken,
// until ctx ends. The sealer and the checkpointer are two.
func (s *Store) work(ctx context.Context, ch <-chan struct{}, pass func(context.Context)) {
	defer s.workers.Done()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		pass(ctx)
	}
}

// savePartition saves partition p's filter to the file name in the sealed
// directory (durably) under a new random ID, and returns what names that
// file: a seal, or a checkpoint's entry.
func (s *Store) savePartition(name string, p int64) (pebble.Seal, error) {
	var b [8]byte
	_, _ = rand.Read(b[:])
	meta := bloom.SnapshotMeta{Kind: bloom.SnapshotPartition, StoreID: s.store.Layout().ID, Epoch: binary.LittleEndian.Uint64(b[:]), HighWater: s.highWater()}
	sum, size, err := s.sealedDir.saveAs(name, func(w io.Writer) (uint32, error) {
		return s.bloom.WritePartition(w, p, meta)
	})
	return pebble.Seal{ID: meta.Epoch, Sum: sum, Size: size}, err
}

// partitionFile is a partition's filter file in the sealed directory and
// the seal (or checkpoint entry) that names it.
type partitionFile struct {
	name string
	p    int64
	seal pebble.Seal
}

// loadPartitions merges into the filters each partition's file that its
// seal (or checkpoint entry) names (sealedAccept), all together (one copy
// of the filters for all of them, none into empty filters), with one error
// for each: a file refused changes nothing, and the others load.
func (s *Store) loadPartitions(files []partitionFile) []error {
	id := s.store.Layout().ID
	errs := make([]error, len(files))
	var srcs []bloom.SnapshotSource
	var at []int // at[j]: the file of srcs[j]
	for i, pf := range files {
		f, err := s.sealedDir.openAs(pf.name, pf.seal.Size)
		if err != nil {
			errs[i] = err
			continue
		}
		defer f.Close()
		srcs = append(srcs, bloom.SnapshotSource{R: f, Size: pf.seal.Size, Accept: func(h bloom.SnapshotHeader) error {
			return sealedAccept(h, id, pf.p, pf.seal)
		}})
		at = append(at, i)
	}
	for j, err := range s.bloom.MergeSnapshots(srcs) {
		errs[at[j]] = err
	}
	return errs
}

// seal runs a sealing pass; a failure is counted and logged. The partition
// stays unsealed (a crash rebuilds it from Pebble); the sealer tries again
// a second later (sealRetry), and at the next rotation or Close.
//
// A pass that sealed a partition calls onSealed (the archiver's wake-up:
// a sealed partition is one it may take), even when a later partition of
// the pass failed.
func (s *Store) seal(ctx context.Context) {
	n, err := s.sealClosed(ctx)
	if err != nil && ctx.Err() == nil {
		s.sealFailures.Add(1)
		s.logger.Printf("tierdedup: sealing a closed partition's bloom filter: %v", err)
		// Tried again without waiting for the next rotation: the archive
		// waits for this seal. Not once the store has failed: every call
		// fails then, and the pass would only log again each second.
		if s.store == nil || s.store.Broken() == nil {
			time.AfterFunc(sealRetry, s.sealWakeup)
		}
	}
	if n > 0 && s.onSealed != nil {
		s.onSealed()
	}
}

// sealClosed saves the filter of every live partition before the current
// one that has no seal yet, then removes sealed files nothing vouches for.
// The filters must be warm: only then do they hold every key of the store.
// It returns how many partitions it sealed.
func (s *Store) sealClosed(ctx context.Context) (n int, err error) {
	s.sealMu.Lock()
	defer s.sealMu.Unlock()
	if !s.warm.Load() {
		return 0, nil
	}
	cur := s.current.Load()
	// Writes that read the time before the rotation to cur may still be
	// writing in an older partition: wait for them.
	if err := s.gate.wait(ctx); err != nil {
		return 0, err
	}
	// Partitions before the store's creation hold nothing: sealing them
	// would only write. (A crash rebuilds them, empty, with the open one;
	// if the recorded creation is late, a partition left unsealed here is
	// rebuilt too: never trusted without a seal.)
	for p := max(s.parts.Oldest(cur), s.sealFrom); p < cur; p++ {
		if s.isSealed(p) || p < s.parts.Oldest(s.current.Load()) {
			continue // sealed, or dropped by a rotation since cur was read
		}
		seal, err := s.savePartition(sealedName(p), p)
		if err == nil {
			err = s.store.SealPartition(p, seal)
		}
		if errors.Is(err, bloom.ErrNotLive) {
			continue // a rotation dropped it since it was checked
		}
		if err != nil {
			return n, fmt.Errorf("partition %d: %w", p, err)
		}
		s.setSealed(p)
		n++
	}
	return n, s.removeStaleSealed(s.parts.Oldest(cur))
}

// isSealed reports whether partition p's filter is saved with a seal the
// store holds.
func (s *Store) isSealed(p int64) bool {
	s.sealedMu.Lock()
	defer s.sealedMu.Unlock()
	return s.sealed[p]
}

// setSealed records partition p's filter as saved with a seal the store
// holds.
func (s *Store) setSealed(p int64) {
	s.sealedMu.Lock()
	defer s.sealedMu.Unlock()
	s.sealed[p] = true
}

// removeStaleSealed removes the sealed files of partitions before oldest or
// without a seal this engine trusts, and forgets dropped partitions.
func (s *Store) removeStaleSealed(oldest int64) error {
	s.sealedMu.Lock()
	for p := range s.sealed {
		if p < oldest {
			delete(s.sealed, p)
		}
	}
	s.sealedN.Store(uint64(len(s.sealed)))
	s.sealedMu.Unlock()
	names, err := s.sealedDir.fs.List(s.sealedDir.dir)
	if err != nil {
		return nil // no directory: no file has been sealed yet
	}
	var errs []error
	removed := false
	for _, n := range names {
		p, ok := sealedPartition(n)
		// A temporary file is a save a crash interrupted.
		if ok && !s.isSealed(p) || strings.HasPrefix(n, sealedPrefix) && strings.HasSuffix(n, sealedSuffix+".tmp") {
			errs = append(errs, s.sealedDir.fs.Remove(s.sealedDir.fs.PathJoin(s.sealedDir.dir, n)))
			removed = true
		}
	}
	if removed {
		// Durably: a crash must not bring back what nothing vouches for.
		errs = append(errs, s.sealedDir.syncDir())
	}
	return errors.Join(errs...)
}

// loadSealed loads, after an unclean shutdown, every sealed partition's
// filter its seal vouches for, and returns the partitions left to rebuild
// from Pebble: every live one up to current without a loaded filter.
func (s *Store) loadSealed(current int64) (rebuild []int64, err error) {
	oldest := s.parts.Oldest(current)
	seals, err := s.store.Seals(oldest)
	if err != nil {
		return nil, err
	}
	var files []partitionFile
	for p := oldest; p <= current; p++ {
		seal, ok := seals[p]
		if !ok || p == current {
			rebuild = append(rebuild, p)
			continue
		}
		files = append(files, partitionFile{sealedName(p), p, seal})
	}
	for i, err := range s.loadPartitions(files) {
		p := files[i].p
		if err != nil {
			s.logger.Printf("tierdedup: sealed bloom filter of partition %d not used, rebuilding it from Pebble: %v", p, err)
			rebuild = append(rebuild, p)
			continue
		}
		s.setSealed(p)
		s.sealedLoaded.Add(1)
	}
	slices.Sort(rebuild)
	return rebuild, s.removeStaleSealed(oldest)
}

// sealedAccept accepts the header of partition p's sealed file only if it
// is a sealed partition's, written for store id, for partition p, and is
// the file seal names (its random ID and checksum).
func sealedAccept(h bloom.SnapshotHeader, id [16]byte, p int64, seal pebble.Seal) error {
	switch {
	case h.Kind != bloom.SnapshotPartition:
		return fmt.Errorf("snapshot kind %d is not a sealed partition's", h.Kind)
	case h.StoreID != id:
		return errors.New("sealed partition of another store")
	case h.Newest != p:
		return fmt.Errorf("the file of partition %d holds partition %d", p, h.Newest)
	case h.Epoch != seal.ID || h.Sum != seal.Sum:
		return errors.New("not the file the store's seal names")
	}
	return nil
}

// keepSealed marks as sealed, when the filters are warm at Open, the
// partitions whose file its seal vouches for (verified as loadSealed
// would, without loading it: the filters hold its keys already); the
// sealer writes the others again.
func (s *Store) keepSealed(current int64) error {
	oldest := s.parts.Oldest(current)
	seals, err := s.store.Seals(oldest)
	if err != nil {
		return err
	}
	id := s.store.Layout().ID
	for p, seal := range seals {
		if p >= current {
			continue
		}
		err := s.sealedDir.loadAs(sealedName(p), seal.Size, func(r io.ReaderAt, size int64) error {
			return s.bloom.CheckSnapshot(r, size, func(h bloom.SnapshotHeader) error { return sealedAccept(h, id, p, seal) })
		})
		if err == nil {
			s.setSealed(p)
		}
	}
	return s.removeStaleSealed(oldest)
}

// spans groups ascending partitions into runs [from, to).
func spans(parts []int64) [][2]int64 {
	var out [][2]int64
	slices.Sort(parts)
	for _, p := range parts {
		if n := len(out); n > 0 && out[n-1][1] == p {
			out[n-1][1] = p + 1
			continue
		}
		out = append(out, [2]int64{p, p + 1})
	}
	return out
}
