package bloom

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/bits"
	"runtime"
	"slices"
	"sync"

	bitsbloom "github.com/bits-and-blooms/bloom/v3"
)

// ErrSnapshot reports a snapshot that is corrupt, truncated, oversized or
// written for other parameters. Nothing is loaded when it is returned.
var ErrSnapshot = errors.New("bloom: unusable snapshot")

// ErrNotLive reports a partition outside the window of live filters.
var ErrNotLive = errors.New("bloom: partition not live")

// ErrSnapshotParams is the ErrSnapshot of a sound snapshot written for other
// filter parameters (bits, hashes, partition length or count).
var ErrSnapshotParams = fmt.Errorf("%w: written for other parameters", ErrSnapshot)

// SnapshotKind says what a snapshot's filters stand for.
type SnapshotKind uint8

// Snapshot kinds.
const (
	// SnapshotCache filters are a cache of a durable store: valid only for
	// the store named by StoreID in the state named by Epoch.
	SnapshotCache SnapshotKind = 1
	// SnapshotState filters are the only state there is (bloom-only): they
	// carry their own fingerprint secret and clock.
	SnapshotState SnapshotKind = 2
	// SnapshotPartition holds one closed partition's filter
	// (WritePartition), a cache of a durable store like SnapshotCache:
	// valid only while the store named by StoreID holds the seal whose ID
	// is Epoch.
	SnapshotPartition SnapshotKind = 3
	// SnapshotArchive holds one slot of an archive's filter ring
	// (WritePartition), saved in the archive it describes: Secret is a
	// check of the fingerprint secret (not the secret), Epoch the newest
	// partition whose keys it holds.
	SnapshotArchive SnapshotKind = 4
)

// SnapshotMeta is what a snapshot records about the state it describes.
// Filters neither interprets nor checks it: the engine does.
type SnapshotMeta struct {
	Kind SnapshotKind
	// StoreID and Epoch name the store state a SnapshotCache was taken of.
	StoreID [16]byte
	Epoch   uint64
	// Secret is the fingerprint secret the filters were built under.
	Secret [16]byte
	// HighWater is the highest clock reading of the writer, Unix ns.
	HighWater int64
}

// SnapshotHeader is a snapshot's meta and the parameters of its filters.
type SnapshotHeader struct {
	SnapshotMeta
	M               uint64 // bits per filter
	K               int    // hashes per key
	PartitionLength int64  // ns
	Live            int
	Newest          int64 // newest partition
	// Sum is the snapshot's checksum, verified (set for accept, not by
	// ReadSnapshotHeader).
	Sum uint32
}

// ErrSnapshotVersion is the ErrSnapshot of a snapshot written in another
// version of the format, whose bits are at other positions: version 2 put a
// key's bits where a classic filter does, version 3 in two blocks
// (layout).
var ErrSnapshotVersion = fmt.Errorf("%w: written in another format version", ErrSnapshot)

// Snapshot layout, version 3, little endian unless noted:
//
//	header  [112]byte: magic "tdbloom\x00", version u32, k u32, m u64,
//	        partition length i64, live u32, count u32, newest i64,
//	        kind u8 + 7 reserved, store ID [16], epoch u64, secret [16],
//	        high water i64, reserved u64
//	count × record: partition i64, adds i64, then the bits-and-blooms
//	        encoding (m, k and bit length as big-endian u64, then m/64
//	        big-endian words) of the filter's positions in order (layout)
//	trailer crc32c u32 of everything before it
//
// bits-and-blooms' own encoding has no magic, version or checksum, so it is
// only ever read inside this envelope, after the envelope is verified.
// Versions 1 (no meta, unkeyed fingerprints) and 2 (a classic filter's
// positions) are refused with ErrSnapshotVersion.
const (
	snapshotMagic   = "tdbloom\x00"
	snapshotVersion = 3
	headerSize      = 112
	recordHead      = 16 + 24
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func recordSize(m uint64) int64 { return recordHead + int64(m/8) }

// WriteSnapshot writes every allocated filter to w, with meta, and returns
// the snapshot's checksum. Rotation waits while it runs; keys added
// concurrently may or may not be in the snapshot, so the engine takes it
// when no more keys can arrive.
func (f *Filters) WriteSnapshot(w io.Writer, meta SnapshotMeta) (sum uint32, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.cur.Load()
	return f.write(w, meta, r.newest, r, r.valid)
}

// WritePartition writes partition p's filter alone (none if p has no keys)
// to w, with meta, and returns the snapshot's checksum; MergeSnapshot reads
// it back. It fails if p is not live. The engine writes a partition once no
// key can be added to it any more; rotation does not wait for it.
func (f *Filters) WritePartition(w io.Writer, p int64, meta SnapshotMeta) (sum uint32, err error) {
	r := f.cur.Load()
	if p > r.newest || p < f.parts.Oldest(r.newest) {
		return 0, fmt.Errorf("%w: partition %d (newest %d)", ErrNotLive, p, r.newest)
	}
	var one uint64
	if r.filter(f, p) != nil {
		one = 1 << f.slot(p)
	}
	return f.write(w, meta, p, r, one)
}

func (f *Filters) write(w io.Writer, meta SnapshotMeta, newest int64, r *ring, slots uint64) (uint32, error) {
	crc := crc32.New(castagnoli)
	// The checksum sees each buffer before w does: a writer may reuse or
	// scribble on a buffer once Write returns (Pebble's MemFS does so in
	// race builds, to catch callers that rely on it).
	bw := bufio.NewWriterSize(io.MultiWriter(crc, w), 1<<16)
	var h [headerSize]byte
	copy(h[:8], snapshotMagic)
	binary.LittleEndian.PutUint32(h[8:], snapshotVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(f.lay.k))
	binary.LittleEndian.PutUint64(h[16:], r.lay.m)
	binary.LittleEndian.PutUint64(h[24:], uint64(f.parts.Length))
	binary.LittleEndian.PutUint32(h[32:], uint32(f.parts.Live))
	binary.LittleEndian.PutUint32(h[36:], uint32(bits.OnesCount64(slots)))
	binary.LittleEndian.PutUint64(h[40:], uint64(newest))
	h[48] = byte(meta.Kind)
	copy(h[56:72], meta.StoreID[:])
	binary.LittleEndian.PutUint64(h[72:], meta.Epoch)
	copy(h[80:96], meta.Secret[:])
	binary.LittleEndian.PutUint64(h[96:], uint64(meta.HighWater))
	if _, err := bw.Write(h[:]); err != nil {
		return 0, err
	}
	col := make([]uint64, r.lay.m/64)
	for s := range uint64(f.parts.Live) {
		if slots&(1<<s) == 0 {
			continue
		}
		fl := r.slots[s]
		var rec [16]byte
		binary.LittleEndian.PutUint64(rec[:], uint64(fl.part))
		binary.LittleEndian.PutUint64(rec[8:], uint64(fl.adds.Load()))
		if _, err := bw.Write(rec[:]); err != nil {
			return 0, err
		}
		// The slot's bits, gathered from the interleaved words in position
		// order, are encoded as a bits-and-blooms filter of their own.
		r.lay.column(r.words, s, col)
		if _, err := bitsbloom.FromWithM(col, uint(r.lay.m), uint(f.lay.k)).WriteTo(bw); err != nil {
			return 0, err
		}
	}
	if err := bw.Flush(); err != nil {
		return 0, err
	}
	sum := crc.Sum32()
	var t [4]byte
	binary.LittleEndian.PutUint32(t[:], sum)
	_, err := w.Write(t[:])
	return sum, err
}

// marker returns a copy of r that makes adds wait for the writer holding
// mu (see ring.copying).
func (r *ring) marker() *ring {
	return &ring{newest: r.newest, lay: r.lay, step: r.step, words: r.words, slots: r.slots, valid: r.valid, copying: true}
}

// place returns r with rec's bits set in its slot; r's words must not be
// shared yet. A record of a larger step grows r first; one of a smaller
// step is copied up to r's (see growth.go).
func (f *Filters) place(r *ring, rec record) *ring {
	if rec.step > r.step {
		r = f.grown(r, rec.step)
	}
	s := f.slot(rec.part)
	if r.slots[s] == nil || r.slots[s].part != rec.part {
		fl := &filter{part: rec.part}
		r = f.assign(r, fl) // allocates the words on first use
	}
	r.slots[s].placed() // its bits now include the record's, whose keys are not known
	if rec.step == r.step {
		r.lay.scatter(r.words, uint64(s), rec.col)
	} else {
		r.slots[s].inherited.Store(true) // a file's bits copied up, as a growth would
		small := &f.steps[rec.step]
		words := make([]uint64, len64(*small))
		small.scatter(words, uint64(s), rec.col)
		for i, w := range small.copyUp(words, r.lay) {
			r.words[i] |= w
		}
	}
	r.slots[s].adds.Add(rec.adds)
	return r
}

// placeAll places recs into r (not shared) as place does one after
// another, and returns the ring: grown first to the largest step among
// them, then the bits of the records at its step scattered in parallel,
// each goroutine over its own range of words for every record (a word
// holds a bit of every slot, so two records never write a word at once
// from two goroutines).
func (f *Filters) placeAll(r *ring, recs []record) *ring {
	if len(recs) == 0 {
		return r
	}
	top := r.step
	for _, rec := range recs {
		top = max(top, rec.step)
	}
	if top > r.step {
		r = f.grown(r, top)
	}
	var same []record
	for _, rec := range recs {
		if rec.step < r.step {
			r = f.place(r, rec) // copied up: rare (a file of a smaller step)
			continue
		}
		s := f.slot(rec.part)
		if r.slots[s] == nil || r.slots[s].part != rec.part {
			r = f.assign(r, &filter{part: rec.part}) // allocates the words on first use
		}
		r.slots[s].placed()
		r.slots[s].adds.Add(rec.adds)
		same = append(same, rec)
	}
	if len(same) == 0 {
		return r
	}
	// Chunks of at least 64k words, several a core: a core busy with
	// something else (an Open's compactions) leaves its chunks to the
	// others instead of holding up the merge.
	words := r.words
	chunks := max(1, min(8*runtime.GOMAXPROCS(0), len(words)/(1<<16)))
	per := (len(words) + chunks - 1) / chunks
	per = (per + 63) / 64 * 64 // whole 64-word runs: a byte of a column is 8 words at 8 lanes
	slots, cols := make([]uint64, len(same)), make([][]uint64, len(same))
	for i, rec := range same {
		slots[i], cols[i] = uint64(f.slot(rec.part)), rec.col
	}
	parallel(chunks, func(c int) {
		lo, hi := c*per, min((c+1)*per, len(words))
		r.lay.scatterMany(words, slots, cols, lo, hi)
	})
	return r
}

// parallel runs fn(0) to fn(n-1), up to GOMAXPROCS at once, and returns
// when all have.
func parallel(n int, fn func(i int)) {
	if n <= 1 {
		for i := range n {
			fn(i)
		}
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			fn(i)
		}()
	}
	wg.Wait()
}

// MergeSnapshot adds the filters in r (size bytes long) to the current
// ones, checked as ReadSnapshot checks them: each becomes the union of
// itself and the snapshot's filter of its partition. A union keeps every
// key either side holds, so merging never loses one. Filters of partitions
// that are not live now are ignored. On any error it changes nothing.
//
// The merge writes into a copy of the ring's words, then publishes it:
// probes meanwhile read the words as they were, and adds that overlap the
// copy repeat into the new words (Add). The copy costs, briefly, the
// memory of a second ring; it is taken because setting a partition's bits
// in shared words would need an atomic operation per word (measured: 5.5 ns
// a word against 0.4 for a plain copy, an Open restoring seven partitions of
// the default size spending 0.7 s in it instead of 0.1 s). Merging several
// files, use MergeSnapshots: one copy for all of them.
func (f *Filters) MergeSnapshot(r io.ReaderAt, size int64, accept func(SnapshotHeader) error) error {
	return f.MergeSnapshots([]SnapshotSource{{R: r, Size: size, Accept: accept}})[0]
}

// SnapshotSource is one snapshot for MergeSnapshots: Size bytes of R, and
// the Accept MergeSnapshot would be given (nil accepts any).
type SnapshotSource struct {
	R      io.ReaderAt
	Size   int64
	Accept func(SnapshotHeader) error
}

// MergeSnapshots merges each of srcs as MergeSnapshot does, and returns
// one error for each (nil: merged): a snapshot refused for any reason
// changes nothing, and the others are merged all the same. All of them
// share one copy of the ring's words, and none is made while no filter has
// been written yet (an Open merging its sealed files into new filters):
// copying a ring sized for hundreds of millions of keys once for every file
// was most of an Open's time to warm (BenchmarkMergeSealed). Their bits
// are scattered in one pass over the ring, in parallel over its ranges
// (placeAll).
func (f *Filters) MergeSnapshots(srcs []SnapshotSource) []error {
	errs := make([]error, len(srcs))
	// The files are read one after another: a source's reader and its
	// Accept need not be safe to use beside another's (an archive's
	// accepts write one map).
	var loaded []record
	for i, src := range srcs {
		_, recs, err := f.read(src.R, src.Size, src.Accept)
		if err != nil {
			errs[i] = err
			continue
		}
		loaded = append(loaded, recs...)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.cur.Load()
	var keep []record
	for _, rec := range loaded {
		if rec.part <= cur.newest && rec.part >= f.parts.Oldest(cur.newest) {
			keep = append(keep, rec)
		}
	}
	if len(keep) == 0 {
		return errs
	}
	f.publish(cur.marker()) // no add writes cur.words while they are copied
	next := &ring{newest: cur.newest, lay: cur.lay, step: cur.step, slots: slices.Clone(cur.slots), valid: cur.valid}
	if cur.words != nil {
		// No add writes cur.words now (the marker's publish waited for
		// them), and rotation needs mu: a plain copy.
		next.words = slices.Clone(cur.words)
	}
	next = f.placeAll(next, keep)
	f.publish(next)
	return errs
}
