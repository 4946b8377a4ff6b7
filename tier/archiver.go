package tier

import (
	"context"
	"fmt"
	"log"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/shard"
)

// Archiver drives one archive behind one exact tier: it copies closed
// partitions into the archive (or drains a shared tier's ArchiveLog into
// it), keeps the filter of the archived keys, and answers for the history
// behind the window. The engine holds one through this interface only;
// package tier/archive implements it (OpenArchiver). Its methods are safe
// for concurrent use.
type Archiver interface {
	// Start runs the archiving loop; Poke wakes it (a partition closed);
	// Close stops it between partitions and closes the archive.
	Start()
	Poke()
	Close() error
	// Grow records in the archive the longer archive window Open found
	// (ArchiveWindowGrower), and nothing else. The engine calls it once
	// its Open has passed every check, before anything starts: an Open
	// refused after the archive opened (a binding, a need) records no
	// window, and the processes of the configuration before it still
	// open.
	Grow(ctx context.Context) error
	// Next is how far the archive reaches: the first partition not
	// archived. The exact tier may drop the partitions before it that
	// left its window, and no other.
	Next() int64
	// Shared reports an archive fed from a shared tier's log.
	Shared() bool
	// Forgetting holds archiving off while a Forget runs; the caller calls
	// done when its removal is done.
	Forgetting() (done func())
	// Find looks keys (fingerprints fps, keyed by the engine's hasher) of
	// namespace ns up in the archive at the engine's time now: one answer
	// each, Committed with the partition that holds it, or Absent.
	Find(ctx context.Context, ns string, keys [][]byte, fps []shard.Fingerprint, now int64) ([]Answer, error)
	// Forget removes keys of ns from the archive, answering what each held.
	Forget(ctx context.Context, ns string, keys [][]byte, now int64, out []Answer) error
	// WaitApplied waits until a shared tier's log is applied up to the
	// entries appended before the call.
	WaitApplied(ctx context.Context) error
	// Stats returns the archive's figures.
	Stats() *ArchiveStats
}

// ArchiverConfig is what an Archiver needs of the engine that opens it.
// Exactly one of Local (with Scanner) and Log is set: the embedded store,
// whose closed partitions are copied, or a shared tier's archive log,
// drained.
type ArchiverConfig struct {
	// Partitions are the exact tier's; Window its window (a shared tier
	// lets a key go that long after its commit); ArchiveWindow how long
	// the archive keeps a partition after it.
	Partitions    Partitions
	Window        time.Duration
	ArchiveWindow time.Duration
	// ExpectedKeys a partition, and the archive filter's false-positive
	// target.
	ExpectedKeys  int
	FalsePositive float64
	// Hasher keys the engine's fingerprints (those Find is given).
	Hasher shard.Hasher
	// Logger receives warnings; never nil.
	Logger *log.Logger
	// Skip reports a namespace whose keys are never archived (the
	// engine's own).
	Skip func(ns []byte) bool
	// Current returns the current partition; Now the engine's clock,
	// rotating partitions as it reads (the log's passes read it).
	Current func() int64
	Now     func() (int64, error)

	// The embedded store: Local records how far the archive reaches and
	// that one is attached, says which partitions are sealed, and drops
	// (HoldFor, Release); Scanner lists a closed partition's records; Hot and
	// Forgetter read and remove keys in the partitions that left the
	// window before the archive took them. OpenedAt is the store's first
	// clock reading.
	Local     ArchiveSource
	Scanner   RecordScanner
	Hot       Exact
	Forgetter Forgetter
	OpenedAt  int64

	// A shared tier: Log is its archive log, TierName its name (in
	// errors); Process names this engine for the drain lease; Binding
	// returns what every process feeding the archive must agree on, given
	// the digest of the archive's own secret.
	Log      ArchiveLog
	TierName string
	Process  string
	Binding  func(check [16]byte) string
}

// ArchiveStats are an archive's figures.
type ArchiveStats struct {
	// Name is the archive's ("files", "postgres"); Window its window.
	Name   string
	Window time.Duration
	// Held is the number of partitions the archive holds (as of its last
	// pass); Partitions archived and Keys archived since Open; Lag is the
	// number of closed partitions not archived yet; Failures counts
	// failed archiving passes.
	Held, Partitions, Keys, Lag, Failures uint64
	// Reads are keys looked up in the archive, Hits those it held;
	// LagReads keys read in the exact tier's unarchived partitions that
	// left the window.
	Reads, Hits, LagReads uint64
	// FilterBytes is the archive filter's memory.
	FilterBytes int64
	// Behind a shared tier: LogEntries are the entries of its archive log
	// not drained yet, as last read (behind Redis an entry is a removal,
	// or every commit of one call of the commit script: up to 256), and Drainer
	// says whether this engine held the drain lease at its last pass.
	// Lag is then the closed partitions not sealed yet (0 while the drain
	// keeps up).
	LogEntries uint64
	Drainer    bool
	// LogPasses counts this engine's passes over the archive log since
	// Open that read its length into LogEntries (at the pass's end, drain
	// lease held or not): LogEntries read with LogPasses two above an
	// earlier reading is of a pass that began after that reading.
	LogPasses uint64
	// DiskBytes is the space the archive's own files take as the OS
	// allocates them (what du counts of its directory): a files archive
	// (tier/pebble.ArchiveDir); 0 for one in a server (PostgreSQL: its
	// table's pg_table_size).
	DiskBytes uint64
}

// DiskUser is an Archive whose data lives in local files: DiskBytes is
// their allocated space.
type DiskUser interface {
	DiskBytes() uint64
}

// ArchiverOpener opens an Archiver of backend behind an exact tier.
type ArchiverOpener func(ctx context.Context, backend ArchiveBackend, env ArchiveEnv, c ArchiverConfig) (Archiver, error)

var archiverOpener atomic.Pointer[ArchiverOpener]

// RegisterArchiver makes open the archiver OpenArchiver uses. Package
// tier/archive registers its own when a program links it, which every
// archive backend's package makes sure of (tier/pebble's ArchiveDir,
// tier/postgres's Archive import it); an archive backend of another
// package imports tier/archive too.
func RegisterArchiver(open ArchiverOpener) { archiverOpener.Store(&open) }

var archiverCheck atomic.Pointer[func(ArchiverConfig) error]

// RegisterArchiverCheck makes check what CheckArchiver runs: the linked
// archiver's checks of a configuration that need nothing opened. Package
// tier/archive registers its own beside its opener.
func RegisterArchiverCheck(check func(ArchiverConfig) error) { archiverCheck.Store(&check) }

// CheckArchiver runs the linked archiver's checks of c that need nothing
// opened (its Partitions, windows, ExpectedKeys and FalsePositive: the
// size of its filters), so the engine refuses such a configuration before
// it opens, or writes, any tier. Nil when no archiver is linked (OpenArchiver
// refuses then).
func CheckArchiver(c ArchiverConfig) error {
	if check := archiverCheck.Load(); check != nil {
		return (*check)(c)
	}
	return nil
}

// OpenArchiver opens the archiver of backend (ErrOptions when no archiver
// is linked: see RegisterArchiver).
func OpenArchiver(ctx context.Context, backend ArchiveBackend, env ArchiveEnv, c ArchiverConfig) (Archiver, error) {
	open := archiverOpener.Load()
	if open == nil {
		return nil, fmt.Errorf("%w: archive %q: no archiver is linked into the program (import github.com/tierdedup/tierdedup/tier/archive)", ErrOptions, backend.Name())
	}
	return (*open)(ctx, backend, env, c)
}
