package bloom

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"

	bitsbloom "github.com/bits-and-blooms/bloom/v3"

	"github.com/tierdedup/tierdedup/tier"
)

// ReadSnapshotHeader reads and checks a snapshot's header (size bytes
// long): magic, version and the size its filter count implies. It does not
// verify the checksum; ReadSnapshot does, before it loads anything.
func ReadSnapshotHeader(r io.ReaderAt, size int64) (SnapshotHeader, int, error) {
	var h [headerSize]byte
	if size < headerSize+4 {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: %d bytes is shorter than a header", ErrSnapshot, size)
	}
	if _, err := r.ReadAt(h[:], 0); err != nil {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: header: %w", ErrSnapshot, err)
	}
	if string(h[:8]) != snapshotMagic {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: bad magic", ErrSnapshot)
	}
	if v := binary.LittleEndian.Uint32(h[8:]); v != snapshotVersion {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: version %d, want %d", ErrSnapshotVersion, v, snapshotVersion)
	}
	hd := SnapshotHeader{
		K:               int(binary.LittleEndian.Uint32(h[12:])),
		M:               binary.LittleEndian.Uint64(h[16:]),
		PartitionLength: int64(binary.LittleEndian.Uint64(h[24:])),
		Live:            int(binary.LittleEndian.Uint32(h[32:])),
		Newest:          int64(binary.LittleEndian.Uint64(h[40:])),
	}
	count := int(binary.LittleEndian.Uint32(h[36:]))
	hd.Kind = SnapshotKind(h[48])
	copy(hd.StoreID[:], h[56:72])
	hd.Epoch = binary.LittleEndian.Uint64(h[72:])
	copy(hd.Secret[:], h[80:96])
	hd.HighWater = int64(binary.LittleEndian.Uint64(h[96:]))
	if hd.M == 0 || hd.M%64 != 0 || (count > 0 && hd.M/8 > uint64(size)) || hd.M > 1<<48 || hd.Live < 1 || hd.Live > tier.MaxLive || count > hd.Live || hd.PartitionLength <= 0 {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: header m=%d live=%d count=%d partition=%d", ErrSnapshot, hd.M, hd.Live, count, hd.PartitionLength)
	}
	if want := headerSize + int64(count)*recordSize(hd.M) + 4; size != want {
		return SnapshotHeader{}, 0, fmt.Errorf("%w: %d bytes, want %d for %d filters", ErrSnapshot, size, want, count)
	}
	return hd, count, nil
}

// ReadSnapshot replaces the filters with those in r (size bytes long). It
// verifies the header and the checksum, then calls accept (if not nil) with
// the header, then checks the filter parameters (ErrSnapshotParams), and
// only then allocates filters; on any error, accept's included, it changes
// nothing. The newest partition becomes the later of the current one and
// the snapshot's.
func (f *Filters) ReadSnapshot(r io.ReaderAt, size int64, accept func(SnapshotHeader) error) error {
	hd, loaded, err := f.read(r, size, accept)
	if err != nil {
		return err
	}
	step, _ := f.stepOf(hd.M)
	next := &ring{newest: hd.Newest, lay: &f.steps[step], step: step, slots: make([]*filter, f.parts.Live)}
	next = f.placeAll(next, loaded)
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.cur.Load()
	f.publish(cur.marker()) // adds wait, then start again on next
	f.publish(next)
	f.rotateLocked(cur.newest)
	return nil
}

// CheckSnapshot verifies a snapshot as MergeSnapshot does (header,
// checksum, accept, parameters, and each record's head: its filter's
// parameters, its partition inside the window and not repeated, its add
// count) without decoding or loading its filters' bits, which any value
// of passes.
func (f *Filters) CheckSnapshot(r io.ReaderAt, size int64, accept func(SnapshotHeader) error) error {
	_, err := f.verify(r, size, accept, func(io.Reader, recordHeadFields) error { return nil })
	return err
}

// checkParams refuses a snapshot of other parameters: its filters' size
// must be one of the steps (the full size when the filters do not grow).
func (f *Filters) checkParams(hd SnapshotHeader) error {
	if _, ok := f.stepOf(hd.M); !ok || hd.K != f.lay.k || hd.PartitionLength != f.parts.Length || hd.Live != f.parts.Live {
		return fmt.Errorf("%w: m=%d k=%d partition=%d live=%d, want m=%d (or a step of growth) k=%d partition=%d live=%d",
			ErrSnapshotParams, hd.M, hd.K, hd.PartitionLength, hd.Live, f.lay.m, f.lay.k, f.parts.Length, f.parts.Live)
	}
	return nil
}

// read verifies a snapshot and decodes its filters.
func (f *Filters) read(r io.ReaderAt, size int64, accept func(SnapshotHeader) error) (SnapshotHeader, []record, error) {
	var loaded []record
	hd, err := f.verify(r, size, accept, func(body io.Reader, h recordHeadFields) error {
		rec, err := f.decodeRecord(body, h)
		if err == nil {
			loaded = append(loaded, rec)
		}
		return err
	})
	if err != nil {
		return hd, nil, err
	}
	return hd, loaded, nil
}

// verify checks a snapshot's header, checksum, accept and parameters, then
// each record's head (checkRecordHead), in order, passing the record's
// head and the rest of the record to each.
func (f *Filters) verify(r io.ReaderAt, size int64, accept func(SnapshotHeader) error, each func(io.Reader, recordHeadFields) error) (SnapshotHeader, error) {
	hd, count, err := ReadSnapshotHeader(r, size)
	if err != nil {
		return hd, err
	}
	if hd.Sum, err = verifyChecksum(r, size); err != nil {
		return hd, err
	}
	if accept != nil {
		if err := accept(hd); err != nil {
			return hd, err
		}
	}
	if err := f.checkParams(hd); err != nil {
		return hd, err
	}
	seen := make(map[int64]bool, count)
	for i := int64(0); i < int64(count); i++ {
		sr := io.NewSectionReader(r, headerSize+i*recordSize(hd.M), recordSize(hd.M))
		var head [recordHead]byte
		if _, err := io.ReadFull(sr, head[:]); err != nil {
			return hd, fmt.Errorf("%w: record: %w", ErrSnapshot, err)
		}
		h, err := f.checkRecordHead(head, hd.M)
		if err != nil {
			return hd, err
		}
		if h.part > hd.Newest || h.part < f.parts.Oldest(hd.Newest) || seen[h.part] {
			return hd, fmt.Errorf("%w: partition %d outside the window or repeated", ErrSnapshot, h.part)
		}
		seen[h.part] = true
		if err := each(io.MultiReader(bytes.NewReader(head[16:]), sr), h); err != nil {
			return hd, err
		}
	}
	return hd, nil
}

func verifyChecksum(r io.ReaderAt, size int64) (uint32, error) {
	crc := crc32.New(castagnoli)
	if _, err := io.Copy(crc, io.NewSectionReader(r, 0, size-4)); err != nil {
		return 0, fmt.Errorf("%w: %w", ErrSnapshot, err)
	}
	var t [4]byte
	if _, err := r.ReadAt(t[:], size-4); err != nil {
		return 0, fmt.Errorf("%w: trailer: %w", ErrSnapshot, err)
	}
	got, want := crc.Sum32(), binary.LittleEndian.Uint32(t[:])
	if got != want {
		return 0, fmt.Errorf("%w: checksum %08x, want %08x", ErrSnapshot, got, want)
	}
	return want, nil
}

// record is one filter of a snapshot: its partition, its count of adds and
// its bits in position order.
type record struct {
	part, adds int64
	step       int // the step of its filter's size (Filters.steps)
	col        []uint64
}

// recordHeadFields is what a record's head says: its partition and add
// count, and its filter's bits (m, one of the steps; its other parameters are checked).
type recordHeadFields struct {
	part, adds int64
	m          uint64
}

// checkRecordHead checks a record's head: the inner bits-and-blooms header
// must agree with the envelope before its decoder allocates anything, and
// the add count must not be negative.
func (f *Filters) checkRecordHead(head [recordHead]byte, want uint64) (recordHeadFields, error) {
	if m, k, n := binary.BigEndian.Uint64(head[16:]), binary.BigEndian.Uint64(head[24:]), binary.BigEndian.Uint64(head[32:]); m != want || k != uint64(f.lay.k) || n != want {
		return recordHeadFields{}, fmt.Errorf("%w: filter header m=%d k=%d bits=%d", ErrSnapshot, m, k, n)
	}
	h := recordHeadFields{part: int64(binary.LittleEndian.Uint64(head[:])), adds: int64(binary.LittleEndian.Uint64(head[8:])), m: want}
	if h.adds < 0 {
		return recordHeadFields{}, fmt.Errorf("%w: filter of %d adds", ErrSnapshot, h.adds)
	}
	return h, nil
}

// decodeRecord decodes a record's filter from body, the bits-and-blooms
// encoding that starts with the inner header checkRecordHead checked.
func (f *Filters) decodeRecord(body io.Reader, h recordHeadFields) (record, error) {
	bf := &bitsbloom.BloomFilter{}
	if _, err := bf.ReadFrom(body); err != nil {
		return record{}, fmt.Errorf("%w: filter: %w", ErrSnapshot, err)
	}
	step, _ := f.stepOf(h.m) // checked by checkParams
	rec := record{part: h.part, adds: h.adds, step: step, col: bf.BitSet().Words()}
	if uint64(len(rec.col))*64 != h.m {
		return record{}, fmt.Errorf("%w: filter has %d words", ErrSnapshot, len(rec.col))
	}
	return rec, nil
}
