package pebble

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	pebblebloom "github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// Errors returned by a Store; match them with errors.Is.
var (
	// ErrStorage wraps every failure of the underlying database: a write,
	// sync or read error, a corrupt record, or a Pebble fatal error. After
	// the first failure, read or write, the Store refuses every call that
	// reads or writes records.
	ErrStorage = errors.New("pebble: storage failure")
	// ErrLocked reports a directory another Store (in this or another
	// process) has open.
	ErrLocked = errors.New("pebble: directory is in use")
	// ErrOptions reports invalid Options.
	ErrOptions = errors.New("pebble: invalid options")
	// ErrClosed reports a call on a closed Store.
	ErrClosed = errors.New("pebble: store closed")
)

// Defaults for Options fields left zero.
const (
	// DefaultMemTableSize: a flush every ~1.5M keys. Half the 64 MiB it
	// was: the same sustained MarkBatch rate over 10M keys, and half the
	// WAL a killed process leaves to replay (docs/performance.md, warm
	// after a SIGKILL).
	DefaultMemTableSize = 32 << 20
	// DefaultCacheSize is the block cache for reads of duplicates.
	DefaultCacheSize = 64 << 20
	// diskSlowThreshold is when a disk operation is logged as slow: Pebble's
	// own default.
	diskSlowThreshold = 5 * time.Second
	// coldMemTableSize is the cold database's: it takes only Forget's
	// deletions and Drop's range deletions.
	coldMemTableSize = 4 << 20
	// filterBitsPerKey gives Pebble's SST filters a ~1 % false-positive rate,
	// so an absent key costs about one block read in a hundred.
	filterBitsPerKey = 10
)

// Options configure a Store.
type Options struct {
	// Dir is the database directory; required. One Store at a time may open
	// it.
	Dir string
	// FS is the filesystem; nil means the operating system's. Tests pass
	// in-memory or fault-injecting filesystems.
	FS vfs.FS
	// NoSync makes Write return once records reach the operating system,
	// without fsync: a process crash loses nothing, a machine crash may lose
	// the last acknowledged writes. The zero value syncs.
	NoSync bool
	// MemTableSize in bytes; zero means DefaultMemTableSize.
	MemTableSize int
	// CacheSize is the block cache in bytes; zero means DefaultCacheSize.
	CacheSize int
	// Logger receives Pebble's error logs; nil means the standard logger.
	// Informational logs are discarded.
	Logger *log.Logger
	// Partition and Window are the layout a new store records and an
	// existing one must match (see Layout); both required.
	Partition, Window time.Duration
	// Now is the time a new store records as its creation (Created), in
	// Unix nanoseconds of the caller's clock; zero means the system clock.
	Now int64
	// Journal writes each batch's fingerprints beside its records, so the
	// open partitions' filters can be restored from a checkpoint and the
	// journal after it (journal.go). A store opened without it forgets its
	// checkpoint: the journal then has a gap.
	Journal bool
	// KeepExpired says the caller keeps partitions past the window (an
	// archive that has not taken them yet): the mover then moves every
	// sealed partition its last Drop kept, instead of skipping those that
	// left the window, so every partition up to the moved one is in the
	// cold database, where reads look for it.
	KeepExpired bool
}

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: Dir is empty", ErrOptions))
	}
	if o.MemTableSize < 0 {
		errs = append(errs, fmt.Errorf("%w: MemTableSize %d is negative", ErrOptions, o.MemTableSize))
	}
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("%w: CacheSize %d is negative", ErrOptions, o.CacheSize))
	}
	if o.Partition <= 0 || o.Window <= 0 {
		errs = append(errs, fmt.Errorf("%w: Partition %v and Window %v must be positive", ErrOptions, o.Partition, o.Window))
	}
	return errors.Join(errs...)
}

// Store is an exclusively opened pair of Pebble databases of committed
// keys: the hot one, which takes every write, and the cold one of sealed
// partitions (cold.go). It is safe for concurrent use; Close must not race
// with other calls.
type Store struct {
	db        *pebble.DB
	writeOpts *pebble.WriteOptions
	broken    atomic.Pointer[error] // first storage failure, read or write; set once
	closed    atomic.Bool
	buffers   sync.Pool // *[]byte key buffers
	records   sync.Pool // *[]Record of a Commit or Release

	compactions chan compaction // ranges to compact after a drop or a move
	compacting  sync.WaitGroup  // Pebble Compact calls still running (compactRange)
	compactGate sync.RWMutex    // orders compactRange's Add before Close's Wait
	stop        context.CancelFunc
	done        chan struct{}

	// cold is the database of sealed partitions (see cold.go): every
	// partition at or before coldUpTo is read there. moveMu is held by a
	// move, and by what must not interleave with one (Forget, the cold
	// part of Drop, Checkpoint).
	cold      *pebble.DB
	coldOpts  *pebble.Options
	coldUpTo  atomic.Int64
	moveMu    sync.Mutex
	moveWake  chan struct{}
	moverDone chan struct{}
	moved     atomic.Uint64 // partitions moved since Open
	fs        vfs.FS
	moveGate  *sync.RWMutex // moveGater's, or nil
	dir       string
	logger    *log.Logger

	// The journal (Options.Journal): its generation and the sequence of
	// its entries, and the hasher of the store's secret.
	journal bool
	// keepExpired: Options.KeepExpired; droppedBefore is the last Drop's
	// bound, below which the mover moves nothing.
	keepExpired   bool
	droppedBefore atomic.Int64
	// writeFloor (guarded by writes): records are written only into
	// partitions at or after it (CloseWrites).
	writeFloor int64
	jgen, jseq atomic.Uint64
	hasher     shard.Hasher
	health     io.Closer // the disk-health checker this Store wrapped around the OS filesystem, or nil
	layout     Layout    // as recorded; set by Open
	fresh      bool      // Open created the store
	// layoutChanged is set by initLayout when the recorded layout is to
	// be updated (recordLayout), once the rest of Open has checked out.
	layoutChanged bool
	sealed        atomic.Int64 // highest sealed partition, -1 if none: writes at or before it are refused
	// writes admits one batch at a time into Pebble's commit pipeline
	// (apply). A batch whose WAL write fails stays at the head of the
	// pipeline's queue, never published, and every batch that entered
	// behind it waits for it forever: so no batch enters beside another,
	// and each checks usable once it holds writes (the failed one latched
	// before letting go). Syncs are waited for outside it, so concurrent
	// writers still share fsyncs.
	writes sync.Mutex
}

func (s *Store) closeHealth() {
	if s.health != nil {
		_ = s.health.Close()
	}
}

// Open opens or creates the store in opts.Dir.
func Open(opts *Options) (*Store, error) {
	if opts == nil {
		return nil, fmt.Errorf("%w: nil options", ErrOptions)
	}
	o := *opts
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = DefaultMemTableSize
	}
	if o.CacheSize == 0 {
		o.CacheSize = DefaultCacheSize
	}
	if o.Logger == nil {
		o.Logger = log.Default()
	}
	// Pebble wraps a nil FS in disk-health checks whose goroutine only its
	// DB.Close stops, so a failed Open (ErrLocked, say) would leak one per
	// try: the Store wraps the filesystem itself and owns the closer.
	fs, healthCloser := o.FS, io.Closer(nil)
	if fs == nil {
		l := o.Logger
		fs, healthCloser = vfs.WithDiskHealthChecks(vfs.Default, diskSlowThreshold, nil, func(info vfs.DiskSlowInfo) {
			l.Printf("tierdedup/pebble: slow disk: %s", info)
		})
	}
	fs = walFS{fs} // the WAL's disk follows what it holds (walalloc.go)
	cache := pebble.NewCache(int64(o.CacheSize))
	defer cache.Unref()
	popts, coldOpts := dbOptions(&o, fs, cache)
	db, err := openDB(o.Dir, popts)
	if err != nil {
		if healthCloser != nil {
			_ = healthCloser.Close()
		}
		if isLockError(err) {
			return nil, fmt.Errorf("%w: %s: %w", ErrLocked, o.Dir, err)
		}
		return nil, fmt.Errorf("%w: open %s: %w", ErrStorage, o.Dir, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		db:          db,
		writeOpts:   pebble.Sync,
		compactions: make(chan compaction, 16),
		stop:        cancel,
		done:        make(chan struct{}),
		health:      healthCloser,
		coldOpts:    coldOpts,
		moveWake:    make(chan struct{}, 1),
		moverDone:   make(chan struct{}),
		fs:          fs,
		moveGate:    moveGateOf(o.FS),
		dir:         o.Dir,
		logger:      o.Logger,
		journal:     o.Journal,
		keepExpired: o.KeepExpired,
	}
	if o.NoSync {
		s.writeOpts = pebble.NoSync
	}
	s.records.New = func() any { return new([]Record) }
	if err = s.load(&o, fs); err != nil {
		cancel()
		if s.cold != nil {
			_ = s.cold.Close()
		}
		_ = db.Close()
		s.closeHealth()
		return nil, err
	}
	go s.compactLoop(ctx)
	go s.moveLoop(ctx)
	s.wakeMover()
	return s, nil
}

// dbOptions are the hot and the cold database's Pebble options, over fs
// and one cache.
func dbOptions(o *Options, fs vfs.FS, cache *pebble.Cache) (popts, coldOpts *pebble.Options) {
	popts = &pebble.Options{
		FS:            fs,
		Cache:         cache,
		MemTableSize:  uint64(o.MemTableSize),
		Logger:        logger{o.Logger},
		EventListener: logger{o.Logger}.events(),
		// Excise, which takes a moved partition out of the hot database at
		// once, needs virtual tables; an older store is ratcheted up.
		FormatMajorVersion: pebble.FormatVirtualSSTables,
	}
	for i := range popts.Levels {
		popts.Levels[i].FilterPolicy = pebblebloom.FilterPolicy(filterBitsPerKey)
	}
	coldOpts = &pebble.Options{
		FS:                 fs,
		Cache:              cache,
		MemTableSize:       coldMemTableSize,
		Logger:             logger{o.Logger},
		EventListener:      logger{o.Logger}.events(),
		FormatMajorVersion: pebble.FormatVirtualSSTables,
	}
	// The cold database's tables carry no filter block (the level options'
	// default): a read reaches a sealed partition only where the engine's
	// own filter says the key may be, which for a duplicate it is, so a
	// table filter would answer "yes" after loading its whole block (about
	// 160 KiB for an 8 MiB move table, a read syscall each time the block
	// cache had evicted it). Measured: CPU per key of days 2 to 4 of
	// dedupbench run -keys 20000000 -span 96h 7 % and 22 % lower in two
	// runs, keys/s 1.05× and 1.25× (docs/performance.md). A false positive
	// of the engine's filter costs an index and a data block instead.
	coldOpts.EnsureDefaults() // the move's tables are written with them
	return popts, coldOpts
}

// load reads what the directory holds into the opened store: its layout,
// the sealed partitions, the cold database, the journal, and whether it
// must keep expired partitions for an archive.
func (s *Store) load(o *Options, fs vfs.FS) error {
	err := s.initLayout(o.Partition, o.Window, o.Now)
	if err == nil {
		err = s.loadSealed()
	}
	if err == nil {
		err = s.openCold(o.Dir, fs, s.coldOpts)
	}
	if err == nil {
		err = s.recordLayout()
	}
	if err == nil {
		s.hasher = shard.NewHasher(s.layout.Secret)
		err = s.initJournal()
	}
	if err == nil && !s.keepExpired {
		// A store with an archive attached, or that moved partitions to
		// one, keeps what expired until its owner drops it, whatever the
		// caller says: opened without that archive it is refused after
		// this Open (ErrLayout), and must still hold every partition the
		// archive does not.
		var attached, archived bool
		if attached, err = s.ArchiveAttached(); err == nil {
			_, archived, err = s.Archived()
		}
		s.keepExpired = attached || archived
	}
	return err
}

// KeepsExpired reports whether the store keeps partitions past the window
// until its owner drops them: Options.KeepExpired, or an archive attached
// (SetArchiveAttached) or holding partitions (SetArchived) when it opened.
func (s *Store) KeepsExpired() bool { return s.keepExpired }

func openDB(dir string, popts *pebble.Options) (db *pebble.DB, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = panicError(r)
		}
	}()
	return pebble.Open(dir, popts)
}

// isLockError recognises Pebble's refusal to open a directory another Store
// holds: in this process (its own message) or in another (fcntl's EAGAIN or
// EACCES on the LOCK file).
func isLockError(err error) bool {
	if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) {
		return true
	}
	return strings.Contains(err.Error(), "lock held by current process")
}

func (s *Store) buffer() *[]byte {
	if b, ok := s.buffers.Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 0, 256)
	return &b
}

// Claims reports where claims live: in the engine's memory, which fences
// them; the store keeps commits and attempt counts.
func (s *Store) Claims() tier.Where { return tier.ClaimsInEngine }

// Close stops background work and closes the database. It is idempotent.
// After a storage failure the database may be unable to close cleanly; the
// error is returned and the directory is released when the process exits.
func (s *Store) Close() (err error) {
	if !s.closed.CompareAndSwap(false, true) {
		return nil
	}
	s.compactGate.Lock() // no compactRange starts after this
	s.compactGate.Unlock()
	s.stop()
	if s.Broken() != nil {
		// Pebble's commit pipeline is unusable after a failed WAL write:
		// closing the database, or waiting for a background compaction
		// that needs the pipeline's lock, would block forever. The handle
		// and that goroutine are abandoned; the process exit releases the
		// directory.
		return s.Broken()
	}
	<-s.done
	<-s.moverDone
	s.compacting.Wait() // Pebble's Compact is never cancelled (compactRange)
	defer s.guard(&err)
	defer s.closeHealth()
	errCold := s.cold.Close()
	if err := errors.Join(s.db.Close(), errCold); err != nil {
		return fmt.Errorf("%w: close: %w", ErrStorage, err)
	}
	return nil
}
