package embedded

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// Checkpoints of the open partitions. A sealed partition's filter is saved
// once, when it closes; the open partition's changes with every write, so
// after a crash it was rebuilt by scanning it in Pebble, which at hundreds
// of millions of keys is minutes of reads from disk for every claim. A
// checkpoint instead saves the filters of the unsealed live partitions,
// every so many keys, bound to a generation of the Pebble store's journal
// (pebble.Store's journal: each batch's fingerprints, written in the
// batch), and the next Open restores them from the checkpoint's files and
// the journal after it.
//
// Taking one (checkpoint, under sealMu, only while warm):
//
//  1. the store starts a new journal generation; G is the one before;
//  2. the write gate drains: every write that journaled in G or before
//     has written, and its keys were added to the filters before
//     (invariant 2);
//  3. each unsealed live partition's filter is saved to its file (durably,
//     through a temporary file), named by partition and G;
//  4. the store records the checkpoint (G, the current partition, each
//     file's random ID, checksum and size), synced, and deletes the
//     journal up to G in the same batch;
//  5. the files of earlier checkpoints are removed.
//
// What makes a checkpoint invalid, and who checks (Open, restore): a file
// the store's record does not name (another generation, a crash before
// step 4), or of another store, partition, ID, checksum, size or filter
// parameters: its partition is rebuilt by a scan, exact but slow. So is a
// partition the checkpoint does not cover (one closed before it whose
// sealed file is damaged), and every partition of a store that was opened
// without the journal since (its record is deleted then). The journal
// itself is in the store's batches, so it is as durable as the records.
const (
	checkpointSuffix = ".ckpt"
	// minCheckpointKeys is the fewest keys between two checkpoints: below
	// it a checkpoint costs more than the journal it trims.
	minCheckpointKeys = 1 << 20
)

func checkpointName(p int64, gen uint64) string {
	return sealedPrefix + strconv.FormatInt(p, 10) + ".g" + strconv.FormatUint(gen, 10) + checkpointSuffix
}

// checkpointEvery is how many keys the filters take between two
// checkpoints: as many as make the journal four times as large as the
// open partition's filter (16 bytes a key), so checkpoints write a quarter
// of the bytes the journal does, and a restore reads at most four
// filters' size of journal. (One filter's size cost the sustained
// MarkBatch about a tenth of its rate: go test -bench
// 'Mark/tier=default/batch=256' -benchtime 10000000x -cpu 2 ./bench/.)
func (s *Store) checkpointEvery() uint64 {
	if n := hooks.CheckpointKeys.Load(); n > 0 {
		return uint64(n)
	}
	per := uint64(s.bloom.Bytes()) / uint64(max(s.parts.Live, 1)) // as the filters are now: they grow
	return max(minCheckpointKeys, per/4)
}

// noteAdded counts n keys added to the filters and wakes the checkpointer
// when enough have been since the last checkpoint.
func (s *Store) noteAdded(n int) {
	if s.ckptWake == nil {
		return
	}
	if s.sinceCkpt.Add(uint64(n)) >= s.ckptEvery.Load() {
		s.checkpointWakeup()
	}
}

// checkpointWakeup asks the checkpointer to take a checkpoint.
func (s *Store) checkpointWakeup() { wake(s.ckptWake) }

// checkpointPass takes a checkpoint; a failure is counted and logged (the
// previous checkpoint stays the one a crash restores from).
func (s *Store) checkpointPass(ctx context.Context) {
	if f := hooks.BeforeCheckpoint.Load(); f != nil {
		(*f)()
	}
	if err := s.checkpoint(ctx); err != nil && ctx.Err() == nil {
		s.ckptFailures.Add(1)
		s.logger.Printf("tierdedup: checkpoint of the open partitions' bloom filters: %v", err)
	}
}

// checkpoint takes a checkpoint (steps 1 to 5 above).
func (s *Store) checkpoint(ctx context.Context) error {
	s.sealMu.Lock()
	defer s.sealMu.Unlock()
	s.sinceCkpt.Store(0)
	s.ckptEvery.Store(s.checkpointEvery()) // the filters may have grown
	if !s.warm.Load() {
		return nil // the filters lack keys the store holds: the rebuild's end wakes this
	}
	gen := s.store.NextJournalGen()
	if err := s.gate.wait(ctx); err != nil {
		return err
	}
	cur := s.current.Load()
	ck := pebble.FilterCheckpoint{Gen: gen, Current: cur, Parts: map[int64]pebble.Seal{}}
	for p := max(s.parts.Oldest(cur), s.sealFrom); p <= cur; p++ {
		if s.isSealed(p) {
			continue
		}
		seal, err := s.savePartition(checkpointName(p, gen), p)
		if errors.Is(err, bloom.ErrNotLive) {
			continue // a rotation dropped it
		}
		if err != nil {
			return fmt.Errorf("partition %d: %w", p, err)
		}
		ck.Parts[p] = seal
	}
	if f := hooks.InCheckpoint.Load(); f != nil {
		(*f)()
	}
	if err := s.store.SaveFilterCheckpoint(ck); err != nil {
		return err
	}
	s.checkpoints.Add(1)
	return s.removeStaleCheckpoints(&ck)
}

// removeStaleCheckpoints removes every checkpoint file ck does not name
// (nil: every one), and temporary ones.
func (s *Store) removeStaleCheckpoints(ck *pebble.FilterCheckpoint) error {
	fs := s.sealedDir.fs
	names, err := fs.List(s.sealedDir.dir)
	if err != nil {
		return nil // no directory: nothing saved yet
	}
	keep := map[string]bool{}
	if ck != nil {
		for p := range ck.Parts {
			keep[checkpointName(p, ck.Gen)] = true
		}
	}
	var errs []error
	removed := false
	for _, n := range names {
		if strings.HasPrefix(n, sealedPrefix) && (strings.HasSuffix(n, checkpointSuffix) || strings.HasSuffix(n, checkpointSuffix+".tmp")) && !keep[n] {
			errs = append(errs, fs.Remove(fs.PathJoin(s.sealedDir.dir, n)))
			removed = true
		}
	}
	if removed {
		errs = append(errs, s.sealedDir.syncDir())
	}
	return errors.Join(errs...)
}

// restore restores, after an unclean shutdown, the filters of the
// partitions of rebuild that the recorded checkpoint covers, from its
// files and the journal after it, and returns the partitions left to
// rebuild by a scan.
func (s *Store) restore(rebuild []int64) (left []int64, err error) {
	if hooks.NoRestore.Load() {
		return rebuild, nil
	}
	ck, ok, err := s.store.LoadFilterCheckpoint()
	if err != nil || !ok {
		return rebuild, err
	}
	defer func() {
		if err == nil {
			err = s.removeStaleCheckpoints(&ck)
		}
	}()
	restored := map[int64]bool{}
	var files []partitionFile
	for _, p := range rebuild {
		if p < s.sealFrom {
			continue // before the store was created: nothing to restore
		}
		if !ck.Covers(p) {
			left = append(left, p)
			continue
		}
		if seal, ok := ck.Parts[p]; ok {
			files = append(files, partitionFile{checkpointName(p, ck.Gen), p, seal})
			continue
		}
		restored[p] = true // covered, and held no key at the checkpoint
	}
	for i, err := range s.loadPartitions(files) {
		p := files[i].p
		if err != nil {
			s.logger.Printf("tierdedup: checkpoint of partition %d's bloom filter not used, rebuilding it from Pebble: %v", p, err)
			left = append(left, p)
			continue
		}
		restored[p] = true
	}
	slices.Sort(left)
	if len(restored) == 0 {
		return left, nil
	}
	var n uint64
	err = s.store.ReadJournal(ck.Gen, func(p int64, fps []shard.Fingerprint) {
		if restored[p] {
			s.bloom.Add(fps, p)
			n += uint64(len(fps))
		}
	})
	if err != nil {
		return rebuild, err
	}
	s.restoredParts.Add(uint64(len(restored)))
	s.journalKeys.Add(n)
	return left, nil
}
