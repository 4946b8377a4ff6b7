package pebble

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/shard"
)

// The journal (Options.Journal) lets the filters of the open partitions be
// restored after a crash without scanning them: every batch that writes
// records also writes, in the same batch, one journal entry holding the
// fingerprints of its keys, under the store's secret, in the journal
// generation the batch read. A filter checkpoint (SaveFilterCheckpoint)
// names a generation G: every key of an entry in generation G or before is
// in the checkpoint's files, and those entries are deleted in the batch
// that records it. After a crash the checkpoint's files, plus the entries
// after G, are the filters of the partitions it covers.
//
// Journal entries: 0x03 ‖ generation (u64 big endian) ‖ sequence (u64 big
// endian) → partition (u32 little endian) ‖ 16-byte fingerprints (Hi, Lo,
// little endian). The checkpoint record: meta ‖ "ck" → see
// encodeCheckpoint. A new store records an empty checkpoint (generation 0,
// covering every partition), so its journal alone restores it; a store
// from before the journal has no record, and its filters are rebuilt by a
// scan until its first checkpoint.
const spaceJournal byte = 0x03

// spaceLast is the last keyspace (Compact compacts up to it).
const spaceLast = spaceJournal

var keyCheckpoint = []byte{spaceMeta, 'c', 'k'}

const journalKeyLen = 1 + 8 + 8

func journalKey(gen, seq uint64) []byte {
	k := make([]byte, 0, journalKeyLen)
	k = append(k, spaceJournal)
	k = binary.BigEndian.AppendUint64(k, gen)
	return binary.BigEndian.AppendUint64(k, seq)
}

// FilterCheckpoint is a saved checkpoint of the filters of the partitions
// that were open (unsealed) when it was taken.
type FilterCheckpoint struct {
	// Gen is the journal generation it covers: every key journaled in Gen
	// or before is in its files.
	Gen uint64
	// Current is the engine's partition when it was taken: no key of a
	// later partition was journaled in Gen or before, so a later partition
	// is restored from the journal alone.
	Current int64
	// Parts are the files of the partitions it holds, each as a seal
	// names a sealed partition's file.
	Parts map[int64]Seal
}

// Covers reports whether partition p's filter is restored by the
// checkpoint and the journal after it.
func (c *FilterCheckpoint) Covers(p int64) bool {
	_, ok := c.Parts[p]
	return ok || p > c.Current
}

// Checkpoint record: gen u64 ‖ current i64 ‖ n u32 ‖ n × (partition u32 ‖
// seal as sealLen), little endian.
func encodeCheckpoint(c FilterCheckpoint) []byte {
	b := binary.LittleEndian.AppendUint64(nil, c.Gen)
	b = binary.LittleEndian.AppendUint64(b, uint64(c.Current))
	b = binary.LittleEndian.AppendUint32(b, uint32(len(c.Parts)))
	for p, s := range c.Parts {
		b = binary.LittleEndian.AppendUint32(b, uint32(p))
		b = binary.LittleEndian.AppendUint64(b, s.ID)
		b = binary.LittleEndian.AppendUint32(b, s.Sum)
		b = binary.LittleEndian.AppendUint64(b, uint64(s.Size))
	}
	return b
}

func decodeCheckpoint(b []byte) (FilterCheckpoint, error) {
	if len(b) < 20 {
		return FilterCheckpoint{}, fmt.Errorf("%w: checkpoint record of %d bytes", ErrCorrupt, len(b))
	}
	c := FilterCheckpoint{Gen: binary.LittleEndian.Uint64(b), Current: int64(binary.LittleEndian.Uint64(b[8:])), Parts: map[int64]Seal{}}
	n, rest := int(binary.LittleEndian.Uint32(b[16:])), b[20:]
	if len(rest) != n*(4+sealLen) {
		return FilterCheckpoint{}, fmt.Errorf("%w: checkpoint record of %d partitions in %d bytes", ErrCorrupt, n, len(b))
	}
	for range n {
		c.Parts[int64(binary.LittleEndian.Uint32(rest))] = Seal{
			ID:   binary.LittleEndian.Uint64(rest[4:]),
			Sum:  binary.LittleEndian.Uint32(rest[12:]),
			Size: int64(binary.LittleEndian.Uint64(rest[16:])),
		}
		rest = rest[4+sealLen:]
	}
	return c, nil
}

// initJournal sets the journal's generation at Open: after every
// generation written and the checkpoint's, so no entry of this process
// overwrites one of an earlier. A new store records its empty checkpoint;
// one opened without the journal deletes its checkpoint.
func (s *Store) initJournal() error {
	switch {
	case s.journal && s.fresh:
		if err := s.set(keyCheckpoint, encodeCheckpoint(FilterCheckpoint{Current: -1})); err != nil {
			return err
		}
	case !s.journal:
		b := s.db.NewBatch()
		defer b.Close()
		_ = b.Delete(keyCheckpoint, nil) // a batch's writes fail only when it is committing
		return s.apply(b, pebble.Sync)
	}
	gen := uint64(0)
	if c, ok, err := s.LoadFilterCheckpoint(); err != nil {
		return err
	} else if ok {
		gen = c.Gen
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{spaceJournal}, UpperBound: []byte{spaceJournal + 1}})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer it.Close()
	if it.Last() {
		if k := it.Key(); len(k) == journalKeyLen {
			gen = max(gen, binary.BigEndian.Uint64(k[1:]))
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	s.jgen.Store(gen + 1)
	return nil
}

// appendJournal adds to b the journal entry of recs (all of one batch),
// one per partition they are in. recs are sorted by partition.
func (s *Store) appendJournal(b *pebble.Batch, recs []Record) error {
	gen := s.jgen.Load()
	bp := s.buffer() // Set copies key and value into the batch
	defer s.buffers.Put(bp)
	for i := 0; i < len(recs); {
		p := recs[i].Partition
		j := i
		for j < len(recs) && recs[j].Partition == p {
			j++
		}
		v := binary.BigEndian.AppendUint64(append((*bp)[:0], spaceJournal), gen)
		v = binary.BigEndian.AppendUint64(v, s.jseq.Add(1))
		v = binary.LittleEndian.AppendUint32(v, uint32(p))
		for _, r := range recs[i:j] {
			fp := shard.Sum(s.hasher, r.NS, r.Key)
			v = binary.LittleEndian.AppendUint64(v, fp.Hi)
			v = binary.LittleEndian.AppendUint64(v, fp.Lo)
		}
		*bp = v[:0]
		if err := b.Set(v[:journalKeyLen], v[journalKeyLen:], nil); err != nil {
			return s.fail(err)
		}
		i = j
	}
	return nil
}

// NextJournalGen starts a new journal generation and returns the one
// before it: writes that begin from now on journal in a later one.
func (s *Store) NextJournalGen() uint64 { return s.jgen.Add(1) - 1 }

// ReadJournal calls fn with the fingerprints of each journal entry after
// generation after, in order; fps is valid only during the call. A read
// failure latches, as in Claim.
func (s *Store) ReadJournal(after uint64, fn func(partition int64, fps []shard.Fingerprint)) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: journalKey(after+1, 0), UpperBound: []byte{spaceJournal + 1}})
	if err != nil {
		return s.fail(err)
	}
	defer it.Close()
	var fps []shard.Fingerprint
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return s.fail(err)
		}
		if len(v) < 4 || (len(v)-4)%16 != 0 || len(it.Key()) != journalKeyLen {
			return s.fail(fmt.Errorf("%w: journal entry of %d bytes", ErrCorrupt, len(v)))
		}
		fps = fps[:0]
		for r := v[4:]; len(r) > 0; r = r[16:] {
			fps = append(fps, shard.Fingerprint{Hi: binary.LittleEndian.Uint64(r), Lo: binary.LittleEndian.Uint64(r[8:])})
		}
		fn(int64(binary.LittleEndian.Uint32(v)), fps)
	}
	if err := it.Error(); err != nil {
		return s.fail(err)
	}
	return nil
}

// SaveFilterCheckpoint records c, synced, and deletes the journal entries
// it covers (generation c.Gen and before) in the same batch. The files it
// names must be durable before; from then on only they are trusted with
// the journal after c.Gen.
func (s *Store) SaveFilterCheckpoint(c FilterCheckpoint) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(keyCheckpoint, encodeCheckpoint(c), nil) // a batch's writes fail only when it is committing
	_ = b.DeleteRange([]byte{spaceJournal}, journalKey(c.Gen+1, 0), nil)
	// Pebble's own compactions drop the deleted entries; a manual
	// compaction would rewrite the L0 files they share with records.
	return s.apply(b, pebble.Sync)
}

// LoadFilterCheckpoint returns the recorded checkpoint; false when none is
// (a store from before the journal, until its first checkpoint).
func (s *Store) LoadFilterCheckpoint() (FilterCheckpoint, bool, error) {
	v, closer, err := s.db.Get(keyCheckpoint)
	if errors.Is(err, pebble.ErrNotFound) {
		return FilterCheckpoint{}, false, nil
	}
	if err != nil {
		return FilterCheckpoint{}, false, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer closer.Close()
	c, err := decodeCheckpoint(v)
	if err != nil {
		return FilterCheckpoint{}, false, s.fail(err)
	}
	return c, true, nil
}
