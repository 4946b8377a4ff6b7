package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
	// The archiver (filters, copying, the log drain) that drives every
	// archive backend: linked wherever an archive backend is.
	_ "github.com/tierdedup/tierdedup/tier/archive"
)

// The embedded archive is a Pebble database of its own directory that
// holds whole partitions as immutable tables: each partition is written
// once, in key order, into sorted tables (checksummed block by block, as
// every Pebble table) with a marker table naming it, and ingested in one
// atomic, durable Ingest into the bottom level, where no compaction
// rewrites it. Forget writes deletions; Drop takes expired partitions out
// whole (Excise). Filter blobs are files of the blobs directory, written
// beside and renamed into place.
//
// What makes it invalid, and who checks (Open, ErrLayout): a recorded
// layout of another format version, partition length, owner or secret
// check, or a longer window than the one asked for (keys were promised
// it). Records of a partition without its marker cannot be read (Lookup
// reads only marked partitions), and Open takes out records before the
// oldest marked partition (a Drop a crash interrupted). Blob files are
// checked by their reader (a Bloom snapshot carries its checksum).

// ArchiveDir is the embedded archive backend (tier.ArchiveBackend): the
// archived partitions of one engine in Dir, a directory no other process
// uses.
type ArchiveDir struct {
	// Dir is the archive's directory; required, and not the store's own.
	Dir string
	// FS is the filesystem; nil means the operating system's.
	FS vfs.FS
	// CacheSize is the block cache in bytes; zero means 16 MiB: the
	// archive is read only for keys the filters say it may hold.
	CacheSize int
}

// archiveFormat is the archive's layout version.
const archiveFormat = 1

var (
	keyArchiveLayout = []byte{spaceMeta, 'a', 'l'}
	// blobsSubdir holds the archive's blobs.
	blobsSubdir   = "blobs"
	putTmpSuffix  = ".put-tmp"
	blobTmpSuffix = ".tmp"
)

// Name returns "files".
func (a ArchiveDir) Name() string { return "files" }

// Validate refuses an empty Dir or a negative CacheSize.
func (a ArchiveDir) Validate(env tier.ArchiveEnv) error {
	var errs []error
	if a.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: ArchiveDir.Dir is empty", tier.ErrOptions))
	}
	if a.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("%w: ArchiveDir.CacheSize %d is negative", tier.ErrOptions, a.CacheSize))
	}
	if env.Partitions.Length <= 0 || env.Window <= 0 {
		errs = append(errs, fmt.Errorf("%w: archive partitions %+v, window %v", tier.ErrOptions, env.Partitions, env.Window))
	}
	if env.Log {
		// A directory is one machine's: processes sharing a tier need an
		// archive they share, which takes keys as they come.
		errs = append(errs, fmt.Errorf("%w: an archive directory keeps the embedded store's partitions; behind a shared tier use postgres.Archive", tier.ErrOptions))
	}
	if a.Dir != "" && env.Dir != "" && dirsOverlap(a.Dir, env.Dir) {
		errs = append(errs, fmt.Errorf("%w: ArchiveDir.Dir %q overlaps the store's directory %q: give the archive a directory of its own", tier.ErrOptions, a.Dir, env.Dir))
	}
	return errors.Join(errs...)
}

// dirsOverlap reports whether one directory is the other or inside it.
func dirsOverlap(a, b string) bool {
	a, errA := filepath.Abs(a)
	b, errB := filepath.Abs(b)
	if errA != nil || errB != nil {
		return a == b
	}
	inside := func(x, y string) bool { // x is y or below it
		rel, err := filepath.Rel(y, x)
		return err == nil && (rel == "." || rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)))
	}
	return inside(a, b) || inside(b, a)
}

// Open opens or creates the archive in Dir.
func (a ArchiveDir) Open(ctx context.Context, env tier.ArchiveEnv) (tier.Archive, error) {
	if err := a.Validate(env); err != nil {
		return nil, err
	}
	fs := a.FS
	if fs == nil {
		fs = vfs.Default
	}
	if err := fs.MkdirAll(a.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	if err := removeSuffixed(fs, a.Dir, putTmpSuffix); err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	cacheSize := a.CacheSize
	if cacheSize == 0 {
		cacheSize = 16 << 20
	}
	lg := env.Logger
	if lg == nil {
		lg = log.Default()
	}
	cache := pebble.NewCache(int64(cacheSize))
	defer cache.Unref()
	opts := &pebble.Options{
		FS:                 fs,
		Cache:              cache,
		MemTableSize:       coldMemTableSize,
		Logger:             logger{lg},
		EventListener:      logger{lg}.events(),
		FormatMajorVersion: pebble.FormatVirtualSSTables,
	}
	opts.EnsureDefaults()
	db, err := openDB(a.Dir, opts)
	if err != nil {
		if isLockError(err) {
			return nil, fmt.Errorf("%w: %s: %w", tier.ErrLocked, a.Dir, err)
		}
		return nil, fmt.Errorf("%w: open %s: %w", tier.ErrStorage, a.Dir, err)
	}
	ar := &archive{db: db, fs: fs, dir: a.Dir, blobs: fs.PathJoin(a.Dir, blobsSubdir), opts: opts}
	if err := ar.init(env); err != nil {
		_ = db.Close()
		return nil, err
	}
	return ar, nil
}

// archive is an opened ArchiveDir.
type archive struct {
	db    *pebble.DB
	fs    vfs.FS
	dir   string
	blobs string
	opts  *pebble.Options

	putMu  sync.Mutex              // one Put at a time
	held   atomic.Pointer[[]int64] // the marked partitions, ascending
	dropMu sync.Mutex              // serialises Drop with itself
	closed atomic.Bool
	grow   []byte // the layout with a longer window than recorded, for GrowWindow (nil: none)
}

// GrowWindow records the longer window init found
// (tier.ArchiveWindowGrower), synced.
func (ar *archive) GrowWindow(context.Context) error {
	if ar.grow == nil {
		return nil
	}
	if err := ar.db.Set(keyArchiveLayout, ar.grow, pebble.Sync); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	ar.grow = nil
	return nil
}

// archiveLayout encoding: format u32 ‖ partition i64 ‖ window i64 ‖ check
// [16] ‖ owner bytes.
func (ar *archive) init(env tier.ArchiveEnv) error {
	want := binary.LittleEndian.AppendUint32(nil, archiveFormat)
	want = binary.LittleEndian.AppendUint64(want, uint64(env.Partitions.Length))
	want = binary.LittleEndian.AppendUint64(want, uint64(env.Window))
	want = append(want, env.Check[:]...)
	want = append(want, env.Owner...)
	raw, closer, err := ar.db.Get(keyArchiveLayout)
	switch {
	case errors.Is(err, pebble.ErrNotFound) && env.Existing:
		return fmt.Errorf("%w: archive %s is new, and %s moved partitions to another archive before", tier.ErrLayout, ar.dir, env.Owner)
	case errors.Is(err, pebble.ErrNotFound):
		if err := ar.db.Set(keyArchiveLayout, want, pebble.Sync); err != nil {
			return fmt.Errorf("%w: %w", tier.ErrStorage, err)
		}
	case err != nil:
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	default:
		stored := bytes.Clone(raw)
		closer.Close()
		if err := checkArchiveLayout(stored, want); err != nil {
			return fmt.Errorf("%w: archive %s: %w", tier.ErrLayout, ar.dir, err)
		}
		if !bytes.Equal(stored, want) {
			ar.grow = want // a longer window: recorded by GrowWindow, once the engine's Open passed
		}
	}
	held, err := ar.markers()
	if err != nil {
		return err
	}
	ar.held.Store(&held)
	if len(held) > 0 && held[0] > 0 {
		// Records before the oldest marked partition are a Drop's that a
		// crash interrupted between its markers and its records.
		if err := ar.db.Excise(context.Background(), pebble.KeyRange{Start: recordPrefix(0), End: recordPrefix(held[0])}); err != nil {
			return fmt.Errorf("%w: %w", tier.ErrStorage, err)
		}
	}
	return nil
}

func checkArchiveLayout(stored, want []byte) error {
	if len(stored) < 36 {
		return fmt.Errorf("layout of %d bytes", len(stored))
	}
	if v := binary.LittleEndian.Uint32(stored); v != archiveFormat {
		return fmt.Errorf("format version %d, want %d", v, archiveFormat)
	}
	if a, b := binary.LittleEndian.Uint64(stored[4:]), binary.LittleEndian.Uint64(want[4:]); a != b {
		return fmt.Errorf("partition length %v, want %v", time.Duration(a), time.Duration(b))
	}
	if a, b := time.Duration(binary.LittleEndian.Uint64(stored[12:])), time.Duration(binary.LittleEndian.Uint64(want[12:])); b < a {
		return fmt.Errorf("archive window %v recorded, %v asked (a window may grow, never shrink)", a, b)
	}
	if !bytes.Equal(stored[20:36], want[20:36]) {
		return errors.New("written under another fingerprint secret")
	}
	if !bytes.Equal(stored[36:], want[36:]) {
		return fmt.Errorf("of store %x, not %x", stored[36:], want[36:])
	}
	return nil
}

// markers reads the marked partitions.
func (ar *archive) markers() ([]int64, error) {
	it, err := ar.db.NewIter(&pebble.IterOptions{LowerBound: markerKey(0), UpperBound: markersEnd})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	defer it.Close()
	var held []int64
	for ok := it.First(); ok; ok = it.Next() {
		k := it.Key()
		if len(k) != 7 {
			return nil, fmt.Errorf("%w: %w: archive marker of %d bytes", tier.ErrStorage, ErrCorrupt, len(k))
		}
		held = append(held, int64(binary.BigEndian.Uint32(k[3:])))
	}
	if err := it.Error(); err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return held, nil
}

func (ar *archive) usable() error {
	if ar.closed.Load() {
		return fmt.Errorf("%w: archive closed", tier.ErrStorage)
	}
	return nil
}

// Archived returns the marked partitions.
func (ar *archive) Archived(context.Context) ([]int64, error) {
	if err := ar.usable(); err != nil {
		return nil, err
	}
	return slices.Clone(*ar.held.Load()), nil
}

func (ar *archive) has(p int64) bool {
	_, ok := slices.BinarySearch(*ar.held.Load(), p)
	return ok
}

// Put writes partition p's records into tables and ingests them with the
// partition's marker. The records must come in key order (namespace
// length, namespace, key: a partitioned tier's ScanRecords order).
func (ar *archive) Put(ctx context.Context, p int64, scan func(func(*tier.Record) error) error) (err error) {
	if err := ar.usable(); err != nil {
		return err
	}
	if p < 0 || p > MaxPartition {
		return fmt.Errorf("%w: partition %d", tier.ErrOptions, p)
	}
	ar.putMu.Lock()
	defer ar.putMu.Unlock()
	if ar.has(p) {
		return nil
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %w", tier.ErrStorage, panicError(r))
		}
	}()
	t := &tableSet{fs: ar.fs, dir: ar.dir, name: "p" + strconv.FormatInt(p, 10), suffix: putTmpSuffix,
		opts: ar.opts.MakeWriterOptions(len(ar.opts.Levels)-1, ar.db.TableFormat())}
	defer func() {
		_ = t.closeTable()
		for _, path := range t.paths {
			_ = ar.fs.Remove(path)
		}
	}()
	var n uint64
	var k, v, last []byte
	err = scan(func(r *tier.Record) error {
		if n%4096 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		if len(r.NS) > 255 {
			return fmt.Errorf("%w: namespace of %d bytes", tier.ErrOptions, len(r.NS))
		}
		k = appendRecordKey(k[:0], p, string(r.NS), r.Key)
		if n > 0 && bytes.Compare(k, last) <= 0 {
			return fmt.Errorf("%w: archive records out of key order", tier.ErrOptions)
		}
		last = append(last[:0], k...)
		v = appendValue(v[:0], Value{State: StateCommitted, Digest: r.Digest, At: r.At, Result: r.Result})
		n++
		return t.set(k, v)
	})
	if err == nil {
		err = t.finish(markerKey(p), binary.LittleEndian.AppendUint64(nil, n))
	}
	if err != nil {
		if errors.Is(err, tier.ErrOptions) || ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("%w: archive put: %w", tier.ErrStorage, err)
	}
	if err := ar.db.Ingest(ctx, t.paths); err != nil {
		return fmt.Errorf("%w: archive ingest: %w", tier.ErrStorage, err)
	}
	t.paths = nil // ingested: they are the database's now
	held := append(slices.Clone(*ar.held.Load()), p)
	slices.Sort(held)
	ar.held.Store(&held)
	return nil
}

// Drop deletes the markers of partitions before `before`, synced, then
// takes their records out whole.
func (ar *archive) Drop(ctx context.Context, before int64) error {
	if err := ar.usable(); err != nil {
		return err
	}
	if before <= 0 {
		return nil
	}
	ar.dropMu.Lock()
	defer ar.dropMu.Unlock()
	ar.putMu.Lock()
	held := *ar.held.Load()
	i, _ := slices.BinarySearch(held, before)
	if i == 0 {
		ar.putMu.Unlock()
		return nil
	}
	if err := ar.db.DeleteRange(markerKey(0), markerKey(before), pebble.Sync); err != nil {
		ar.putMu.Unlock()
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	rest := slices.Clone(held[i:])
	ar.held.Store(&rest)
	ar.putMu.Unlock()
	if err := ar.db.Excise(ctx, pebble.KeyRange{Start: recordPrefix(0), End: recordPrefix(before)}); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}

// Close closes the database.
func (ar *archive) Close() error {
	if ar.closed.Swap(true) {
		return nil
	}
	ar.putMu.Lock()
	defer ar.putMu.Unlock()
	if err := ar.db.Close(); err != nil {
		return fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	return nil
}
