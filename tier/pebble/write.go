package pebble

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/tier"
)

// Record is one committed key to write.
type Record struct {
	Partition int64
	NS        string
	Key       []byte
	Value     Value
}

// write stores records in one batch and returns once it is durable as
// configured. It reorders recs. On failure nothing is acknowledged and the
// Store refuses further writes.
func (s *Store) write(recs []Record) error { return s.writeWith(recs, nil) }

// writeWith is write with the caller's own records in the same batch: all
// of them become durable together, or none does.
func (s *Store) writeWith(recs []Record, user []tier.Write) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	// Sorted records let Pebble's memtable reuse each insert's skiplist
	// position for the next (measured: its inserts were 42 % of the default
	// configuration's CPU with random UUIDs in batch order).
	slices.SortFunc(recs, compareRecords)
	b := s.db.NewBatch()
	defer b.Close()
	bp := s.buffer()
	defer s.buffers.Put(bp)
	sealed := s.sealed.Load()
	for i := range recs {
		r := &recs[i]
		if r.Partition < 0 || r.Partition > MaxPartition {
			return fmt.Errorf("%w: partition %d outside [0, %d]", ErrOptions, r.Partition, MaxPartition)
		}
		if r.Partition <= sealed {
			return fmt.Errorf("%w: partition %d (sealed up to %d)", ErrSealed, r.Partition, sealed)
		}
		buf := appendRecordKey((*bp)[:0], r.Partition, r.NS, r.Key)
		n := len(buf)
		buf = appendValue(buf, r.Value)
		*bp = buf[:0]
		if err := b.Set(buf[:n], buf[n:], nil); err != nil {
			return s.fail(err)
		}
	}
	if s.journal && len(recs) > 0 {
		if err := s.appendJournal(b, recs); err != nil {
			return err
		}
	}
	for _, u := range user {
		buf := append(append((*bp)[:0], spaceUser), u.Key...)
		*bp = buf[:0]
		if err := b.Set(buf, u.Value, nil); err != nil {
			return s.fail(err)
		}
	}
	lowest := int64(-1)
	if len(recs) > 0 {
		lowest = recs[0].Partition // sorted
	}
	return s.applyAbove(s.db, b, s.writeOpts, lowest)
}

// CloseWrites refuses, from now on, every write of records into a
// partition before `before` (an error matching tier.ErrUnavailable: the
// call wrote nothing), and returns once every write it did not refuse is
// durable, or the store failed: a synced batch after them, whose sync is
// theirs too. The archiver closes a partition that left the window (and
// is never sealed) before it copies it: a call that read the time before
// the rotation can no longer add a record to it after the copy.
func (s *Store) CloseWrites(before int64) error {
	if err := s.usable(); err != nil {
		return err
	}
	s.writes.Lock()
	s.writeFloor = max(s.writeFloor, before)
	s.writes.Unlock()
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.LogData(nil, nil) // a batch's writes fail only when it is committing
	return s.apply(b, pebble.Sync)
}

// commit makes b durable as configured, unless the Store has failed; a
// failure latches.
func (s *Store) commit(b *pebble.Batch) error { return s.apply(b, s.writeOpts) }

// apply is every write of the Store: b enters Pebble's commit pipeline
// alone (see writes), then, with opts' Sync, waits for its WAL sync beside
// the batches that entered after it. A failure, or a panic inside Pebble,
// latches before the next batch may enter, so after a failed write every
// concurrent and later write returns ErrStorage instead of hanging.
func (s *Store) apply(b *pebble.Batch, opts *pebble.WriteOptions) (err error) {
	return s.applyTo(s.db, b, opts)
}

// applyTo is apply into db, the hot or the cold database: both share the
// one entry into a commit pipeline.
func (s *Store) applyTo(db *pebble.DB, b *pebble.Batch, opts *pebble.WriteOptions) (err error) {
	return s.applyAbove(db, b, opts, -1)
}

// applyAbove is applyTo of a batch whose records' lowest partition is
// lowest (-1: none), refused, as it enters the commit pipeline, when
// CloseWrites closed that partition.
func (s *Store) applyAbove(db *pebble.DB, b *pebble.Batch, opts *pebble.WriteOptions, lowest int64) (err error) {
	s.writes.Lock()
	entered := true
	defer func() {
		if entered {
			s.writes.Unlock()
		}
	}()
	defer s.guard(&err) // runs before the unlock: a panic latches first
	if err := s.usable(); err != nil {
		return err
	}
	if lowest >= 0 && lowest < s.writeFloor {
		return fmt.Errorf("%w: pebble: partition %d is closed for writes (before %d: the clock left it behind while the call ran); nothing was written", tier.ErrUnavailable, lowest, s.writeFloor)
	}
	if !opts.GetSync() {
		if err := db.Apply(b, opts); err != nil {
			return s.fail(err)
		}
		return nil
	}
	if err := db.ApplyNoSyncWait(b, opts); err != nil {
		return s.fail(err)
	}
	entered = false
	s.writes.Unlock()
	if err := b.SyncWait(); err != nil {
		return s.fail(err)
	}
	return nil
}

// set writes one key, synced, as apply does.
func (s *Store) set(key, value []byte) error {
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(key, value, nil) // a batch's Set fails only when it is committing
	return s.apply(b, pebble.Sync)
}

// Created returns when the store was first opened, in Unix nanoseconds of
// the clock Options.Now was read from.
func (s *Store) Created() (int64, error) { return s.meta(keyCreated) }

func (s *Store) meta(key []byte) (int64, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: meta value of %d bytes", ErrCorrupt, len(v))
	}
	return int64(binary.LittleEndian.Uint64(v)), nil
}

// compareRecords orders records as their storage keys sort.
func compareRecords(a, b Record) int {
	if c := cmp.Compare(a.Partition, b.Partition); c != 0 {
		return c
	}
	if c := cmp.Compare(len(a.NS), len(b.NS)); c != 0 {
		return c
	}
	if c := strings.Compare(a.NS, b.NS); c != 0 {
		return c
	}
	return bytes.Compare(a.Key, b.Key)
}

// HighWater returns the latest clock reading persisted by Drop, in Unix
// nanoseconds (zero for a new store).
func (s *Store) HighWater() (int64, error) {
	v, err := s.meta(keyHighWater)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	return v, err
}

// Drop deletes every record in partitions before `before` with one range
// deletion and records highWater, synced, in the same batch of the hot
// database, then deletes them from the cold one. The space is reclaimed
// by compactions the Store schedules in the background.
func (s *Store) Drop(before, highWater int64) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	start, end := recordPrefix(0), recordPrefix(before)
	b := s.db.NewBatch()
	defer b.Close()
	if before > 0 {
		if err := b.DeleteRange(start, end, nil); err != nil {
			return s.fail(err)
		}
		// The seals of dropped partitions go with them.
		if err := b.DeleteRange(sealKey(0), sealKey(before), nil); err != nil {
			return s.fail(err)
		}
	}
	if err := b.Set(keyHighWater, binary.LittleEndian.AppendUint64(nil, uint64(highWater)), nil); err != nil {
		return s.fail(err)
	}
	if err := s.apply(b, pebble.Sync); err != nil {
		return err
	}
	if before <= 0 {
		return nil
	}
	for {
		if cur := s.droppedBefore.Load(); before <= cur || s.droppedBefore.CompareAndSwap(cur, before) {
			break
		}
	}
	s.queueCompaction(s.db, start, end)
	// The cold database after the hot one, whose clock now says these
	// partitions left the window: a crash between leaves them in the cold
	// database, unread, until the next Drop.
	s.moveMu.Lock()
	defer s.moveMu.Unlock()
	cb := s.cold.NewBatch()
	defer cb.Close()
	_ = cb.DeleteRange(start, end, nil) // a batch's writes fail only when it is committing
	_ = cb.DeleteRange(markerKey(0), markerKey(before), nil)
	if err := s.applyTo(s.cold, cb, pebble.Sync); err != nil {
		return err
	}
	s.queueCompaction(s.cold, start, end)
	return nil
}

// keyArchived records the first partition an archive did not hold yet
// when the engine last archived one (SetArchived).
var keyArchived = []byte{spaceMeta, 'a', 'n'}

// SetArchived records, synced, that every partition before next is in the
// engine's archive; next < 0 removes the record (no archive). Open of the
// engine then refuses an archive that lost what this store dropped.
func (s *Store) SetArchived(next int64) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	if next < 0 {
		b := s.db.NewBatch()
		defer b.Close()
		_ = b.Delete(keyArchived, nil)
		return s.apply(b, pebble.Sync)
	}
	return s.set(keyArchived, binary.LittleEndian.AppendUint64(nil, uint64(next)))
}

// keyArchiveGen counts the archives detached from the store
// (DetachArchive): an archive records the generation it was attached at,
// so one detached is never taken back.
var keyArchiveGen = []byte{spaceMeta, 'a', 'g'}

// keyArchiveAttached records that an archive was attached to the store
// (SetArchiveAttached), before it took any partition.
var keyArchiveAttached = []byte{spaceMeta, 'a', 't'}

// SetArchiveAttached records, synced, that an archive is attached: from
// then on the engine refuses to open the store without it, even before
// it recorded a partition archived (a Put whose reply was lost may have
// stored one).
func (s *Store) SetArchiveAttached() (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	if _, err := s.meta(keyArchiveAttached); err == nil {
		return nil
	}
	return s.set(keyArchiveAttached, binary.LittleEndian.AppendUint64(nil, 1))
}

// ArchiveAttached reports whether SetArchiveAttached was recorded since
// the last DetachArchive.
func (s *Store) ArchiveAttached() (bool, error) {
	if err := s.usable(); err != nil {
		return false, err
	}
	_, err := s.meta(keyArchiveAttached)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// DetachArchive removes the SetArchived and SetArchiveAttached records and
// counts one more detached archive, in one synced batch, and returns the
// new count.
func (s *Store) DetachArchive() (gen int64, err error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	defer s.guard(&err)
	if gen, err = s.ArchiveGeneration(); err != nil {
		return 0, err
	}
	gen++
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Delete(keyArchived, nil)
	_ = b.Delete(keyArchiveAttached, nil)
	_ = b.Set(keyArchiveGen, binary.LittleEndian.AppendUint64(nil, uint64(gen)), nil)
	return gen, s.apply(b, pebble.Sync)
}

// ArchiveGeneration returns how many archives were detached from the
// store (DetachArchive).
func (s *Store) ArchiveGeneration() (int64, error) {
	gen, err := s.meta(keyArchiveGen)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	return gen, err
}

// Archived returns the record SetArchived made; ok is false when there is
// none.
func (s *Store) Archived() (next int64, ok bool, err error) {
	if err := s.usable(); err != nil {
		return 0, false, err
	}
	next, err = s.meta(keyArchived)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, false, nil
	}
	return next, err == nil, err
}
