package pebble

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// ErrSealed reports a write into a partition the store has sealed. It never
// happens to an engine that writes at its persisted clock; it is the store's
// own check that a sealed partition's description stays true.
var ErrSealed = errors.New("pebble: write into a sealed partition")

// Seal records that a partition is closed: it lies before the partition of
// the persisted clock, so no record is written in it again, and a file the
// engine keeps describes it (the partition's Bloom filter). The store does
// not read the file; it keeps what identifies it, so that the engine trusts
// a file only while the store holds the matching seal.
type Seal struct {
	// ID is random, chosen for this seal and written into the file.
	ID uint64
	// Sum is the file's checksum and Size its length in bytes.
	Sum  uint32
	Size int64
}

// Seal records, one per sealed partition: meta ‖ "sp" ‖ partition (u32 big
// endian) → ID u64 ‖ sum u32 ‖ size u64, little endian. Drop deletes them
// with their partitions' records.
const sealLen = 8 + 4 + 8

func sealKey(partition int64) []byte {
	return binary.BigEndian.AppendUint32([]byte{spaceMeta, 's', 'p'}, uint32(min(max(partition, 0), MaxPartition)))
}

// SealPartition records seal for partition p, synced. It refuses a
// partition at or after the persisted clock's (HighWater): records may
// still be written there. From then on the Store refuses writes into p and
// every partition before it (ErrSealed).
func (s *Store) SealPartition(p int64, seal Seal) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	hw, err := s.HighWater()
	if err != nil {
		return s.fail(err)
	}
	if length := int64(s.layout.Partition); p < 0 || p > MaxPartition || length <= 0 || p >= hw/length {
		return fmt.Errorf("%w: partition %d is not before the persisted clock's", ErrOptions, p)
	}
	v := binary.LittleEndian.AppendUint64(nil, seal.ID)
	v = binary.LittleEndian.AppendUint32(v, seal.Sum)
	v = binary.LittleEndian.AppendUint64(v, uint64(seal.Size))
	if err := s.set(sealKey(p), v); err != nil {
		return err
	}
	for {
		cur := s.sealed.Load()
		if p <= cur || s.sealed.CompareAndSwap(cur, p) {
			break
		}
	}
	s.wakeMover()
	return nil
}

// Seals returns the seal of every partition at or after from.
func (s *Store) Seals(from int64) (seals map[int64]Seal, err error) {
	if err := s.usable(); err != nil {
		return nil, err
	}
	defer s.guard(&err)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: sealKey(from), UpperBound: []byte{spaceMeta, 's', 'q'}})
	if err != nil {
		return nil, s.fail(err)
	}
	defer it.Close()
	seals = make(map[int64]Seal)
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != 7 || len(v) != sealLen {
			return nil, s.fail(fmt.Errorf("%w: seal record of %d and %d bytes", ErrCorrupt, len(k), len(v)))
		}
		seals[int64(binary.BigEndian.Uint32(k[3:]))] = Seal{
			ID:   binary.LittleEndian.Uint64(v),
			Sum:  binary.LittleEndian.Uint32(v[8:]),
			Size: int64(binary.LittleEndian.Uint64(v[12:])),
		}
	}
	if err := it.Error(); err != nil {
		return nil, s.fail(err)
	}
	return seals, nil
}

// loadSealed sets the highest sealed partition at Open.
func (s *Store) loadSealed() error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: sealKey(0), UpperBound: []byte{spaceMeta, 's', 'q'}})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer it.Close()
	s.sealed.Store(-1)
	if it.Last() {
		if k := it.Key(); len(k) == 7 {
			s.sealed.Store(int64(binary.BigEndian.Uint32(k[3:])))
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return nil
}
