package tier

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
)

// LocalBackend is a Backend whose tier lives in the engine's process, in a
// directory of its own, with the engine's Bloom filters in front of it:
// the embedded store (tier/embedded). The engine opens it with OpenLocal,
// not Open, and drives its filters, its partitions' rotation and its
// archive records through Local; it names no storage engine. Open returns
// the same store's exact tier alone, started, for the contract suite.
type LocalBackend interface {
	Backend
	// OpenLocal opens (or creates) the store exclusively (ErrLocked if
	// another holds it) and loads its filters; Start must follow before it
	// is used. With env.FiltersOnly it is the filters alone (bloom-only),
	// Local.Exact nil. Errors match ErrOptions, ErrLayout, ErrLocked,
	// ErrStorage, or ErrNoClock when env.Now is 0 and the directory holds
	// no reading.
	OpenLocal(ctx context.Context, env Env) (Local, error)
	// Path is the directory the store keeps its files in ("" for none):
	// an archive kept in files defaults to a directory beside it.
	Path() string
}

// ErrNoClock reports an Env.Now that is not a clock reading, with no
// reading recorded in the store to stand on; it matches ErrOptions.
var ErrNoClock = fmt.Errorf("%w: no clock reading, and the directory holds no earlier one", ErrOptions)

// Local is a store the engine opened in its own process (LocalBackend):
// its exact tier, the Bloom filters in front of it and the lifecycle of
// both. Open, Start and Close (or Discard) are the engine's, once each, in
// that order; the rest is safe for concurrent use between Start and
// Close.
type Local interface {
	Filters
	// Exact returns the exact tier; nil when the filters are the only tier.
	Exact() Exact
	// Secret returns the secret that keys the fingerprints: the store's,
	// or a new one when it persists none.
	Secret() shard.Secret
	// Now returns the clock reading to start from: the later of Env.Now
	// and the reading the store recorded (0 when neither is one).
	Now() int64
	// OpenedAt returns when the store was created, 0 when unknown.
	OpenedAt() int64
	// Start begins the background work, current being the engine's
	// partition and highWater its clock.
	Start(current int64, highWater func() int64)
	// Close stops the background work and closes the store, recording the
	// engine's clock highWater; no write may follow or run concurrently.
	// Errors match ErrStorage.
	Close(highWater int64) error
	// Discard closes a store that was never started, writing nothing.
	Discard()
	// Stats returns the store's figures.
	Stats() LocalStats
	// FsyncLatency returns the exact tier's fsync latency histogram over
	// the bounds want; nothing without one.
	FsyncLatency(want []float64) (bounds []float64, counts []uint64, count uint64, sum float64)
}

// Filters are the Bloom filters in front of a Local store, one a live
// partition. The store owns their lifecycle (warm, rebuilding, sealed);
// the engine asks them and feeds them. They never decide an outcome: a
// zero mask proves a key absent only when Masks says so.
type Filters interface {
	// Masks fills probes[i] for fps[i] and returns the partition bit 0
	// stands for, and whether a zero mask proves the key absent (the
	// filters are warm and have seen every key the store holds).
	Masks(fps []shard.Fingerprint, probes []Probe) (oldest int64, proves bool)
	// Add adds fps to partition p's filter; it precedes the durable write
	// that stores them.
	Add(fps []shard.Fingerprint, p int64)
	// Rotate makes p the current partition, the engine's clock having
	// read highWater: the store drops the partitions that left the window
	// (unless an archive holds them back) and records the clock, then the
	// filters drop theirs; it returns how many filters it dropped. The
	// store alone decides what it drops. An error (ErrStorage) changes
	// nothing: the partition is not made current.
	Rotate(p, highWater int64) (dropped int, err error)
	// Enter and Exit bracket every write (Enter before the time is read):
	// a closed partition is sealed only once every write that may reach
	// it has exited.
	Enter() int
	Exit(slot int)
	// Sealed reports whether partition p's filter is sealed: no write
	// reaches it any more.
	Sealed(p int64) bool
	// Observe counts the probes of keys the exact tier found absent
	// (false positives: maybes) and returns the filters this made
	// measurably over twice their target.
	Observe(oldest int64, absent int, maybes []uint64) []FilterStats
	// Overfilled reports partition p's filter when its keys put it over
	// twice its target.
	Overfilled(p int64) (FilterStats, bool)
	// Partitions returns every live filter's figures, oldest first.
	Partitions() []FilterStats
}

// ArchiveSource is a Local store that moves its closed partitions to an
// archive (ArchiveBackend) and records how far it did, so that it never
// drops a partition the archive does not hold and is never opened without
// the archive it moved partitions to.
type ArchiveSource interface {
	// ID is the store's random identity, recorded at its creation.
	ID() [16]byte
	// Archived returns the first partition not yet archived (ok false
	// when no partition was).
	Archived() (next int64, ok bool, err error)
	// SetArchived records that every partition before next is archived;
	// next < 0 removes the record.
	SetArchived(next int64) error
	// ArchiveAttached reports whether an archive was ever attached, and
	// SetArchiveAttached records it, before any partition goes to it.
	ArchiveAttached() (bool, error)
	SetArchiveAttached() error
	// ArchiveGeneration counts the archives the store let go of; an
	// archive records the generation it was attached at.
	ArchiveGeneration() (int64, error)
	// DetachArchive lets the current archive go, durably, and returns the
	// new generation.
	DetachArchive() (int64, error)
	// HoldFor gives the store the archive's reach (the first partition it
	// does not hold yet, never decreasing): the store keeps every
	// partition from there on. The archiver calls it once it has loaded,
	// before the engine starts.
	HoldFor(reach func() int64)
	// Release lets the store drop what the archive's reach now lets go;
	// the archiver calls it after moving its reach on.
	Release() error
	// OnSealed sets the function the store calls after it sealed a
	// partition (the archiver's wake-up); set before the engine starts.
	OnSealed(fn func())
	// Sealed reports a closed partition whose writes are all in (its
	// filter sealed): the archive may take it.
	Sealed(p int64) bool
	// CloseWrites refuses, from now on, every write into a partition
	// before `before` (ErrUnavailable: the call changed nothing), and
	// returns once every write into them it did not refuse is durable or
	// failed: such a partition (one that left the window is never sealed)
	// then gets no more records.
	CloseWrites(before int64) error
}

// Handoff is a Local store whose state can be copied to another process:
// Export writes a consistent copy, which the store's own package imports.
type Handoff interface {
	// ExportTarget checks dir as an export's destination and returns it
	// cleaned; a path holding anything but an export is ErrOptions.
	ExportTarget(dir string) (string, error)
	// Export writes a consistent copy of the store into dir, with the
	// caller's version of the state.
	Export(ctx context.Context, dir string, version uint64) (ExportInfo, error)
	// Compact flushes and compacts the store now.
	Compact(ctx context.Context) error
}

// ExportInfo describes an export (Handoff.Export).
type ExportInfo struct {
	// Version is the caller's version of the exported state, given to
	// Export: Import refuses an export not newer than the state it would
	// replace. A Kafka consumer uses the partition's next offset.
	Version uint64
	// Created is when the export was written, by the exporter's wall clock.
	Created time.Time
	// Files and Bytes count the files and bytes of the export.
	Files int
	Bytes int64
}

// Errors of an export's import.
var (
	// ErrNoExport reports a directory that holds no export.
	ErrNoExport = errors.New("tierdedup: no export")
	// ErrExport reports an export that must not be imported: a damaged
	// or incomplete copy, or one whose files differ from its manifest.
	ErrExport = errors.New("tierdedup: invalid export")
	// ErrStaleExport reports an export not newer than the state it would
	// replace.
	ErrStaleExport = errors.New("tierdedup: export not newer than the state it would replace")
)

// Probe is a filter's answer for one key: bit i of Maybe set means
// partition Oldest+i may hold it. Zero Maybe means no live filter holds it.
type Probe struct {
	Maybe uint64
}

// FilterStats are one live filter's figures: what it was sized for,
// what its fill implies, and what it was measured to let through.
type FilterStats struct {
	// Partition is the partition's number (Partitions).
	Partition int64
	// Keys counts the keys added to the filter (a key added twice counts
	// twice; after a restart, those of the snapshot or rebuild).
	Keys int64
	// Checked counts keys the exact tier found absent that were probed
	// against this filter (Observe); FalsePositives, those of them the
	// filter answered "maybe" for. Both are over the most recent checks,
	// in this process: a filter fills as its partition goes on, and the
	// rate that matters is the one at its fill now, not an average over
	// its life.
	Checked, FalsePositives uint64
	// TargetFP is the filter's own false-positive target (the whole-window
	// target spread over the live filters); EstimatedFP is the rate the
	// layout's formula gives for Keys keys.
	TargetFP, EstimatedFP float64
	// OverTarget reports a filter that lets through more than twice its
	// target: measured, when FalsePositives are enough to say so, else
	// estimated from Keys with no exact tier to measure against.
	OverTarget bool
	// Inherited reports a filter that grew by copying bits it took from a
	// file at a smaller size (a snapshot, sealed partition or checkpoint
	// restored before the filters reached their full size): copying does
	// not thin them, so its rate is above what Keys alone give, and a
	// larger ExpectedKeys is not what it lacks. It meets its target once
	// its partition leaves the window.
	Inherited bool
}

// MeasuredFP is FalsePositives/Checked, or zero before any check.
func (p FilterStats) MeasuredFP() float64 {
	if p.Checked == 0 {
		return 0
	}
	return float64(p.FalsePositives) / float64(p.Checked)
}

// LocalStats are a Local store's figures.
type LocalStats struct {
	// Mode is "warm" (a "no" skips the disk), "rebuilding" or "cold".
	Mode string
	// Bytes is the filters' memory: their ring (not the keys the newest
	// partition's filter logs while the ring grows, at most about a
	// sixteenth of it); TargetFP the configured false-positive rate over
	// the window; EstimatedFP the rate their fill implies.
	Bytes                 int64
	TargetFP, EstimatedFP float64
	// RebuiltKeys were added to the filters by rebuilds; Sealed partitions
	// hold a seal now, SealedLoaded were loaded from their file by Open,
	// and SealFailures sealing passes failed.
	RebuiltKeys, Sealed, SealedLoaded, SealFailures uint64
	// Checkpoints of the open partitions' filters were taken since Open,
	// CheckpointFailures failed; Open restored RestoredPartitions from a
	// checkpoint, adding JournalKeys from the journal after it.
	Checkpoints, CheckpointFailures, RestoredPartitions, JournalKeys uint64
	// Disk is the exact tier's (zero without one).
	Disk DiskUsage
}

// DiskUsage is what a Local store's exact tier occupies on disk.
type DiskUsage struct {
	// Total is every file: the parts below, the manifest and options
	// files, and compactions' outputs in progress.
	Total uint64
	// Tables are the live SSTs; ObsoleteTables those a compaction replaced
	// and that are not deleted yet.
	Tables, ObsoleteTables uint64
	// WAL is the live WAL files' size; RecycledWAL the files kept for reuse
	// (RecycledWALFiles of them), each as large as the WAL of one flushed
	// memtable; WALWritten the bytes written to the WAL since Open.
	WAL, RecycledWAL, WALWritten uint64
	RecycledWALFiles             int
	// TablesWritten is the bytes of SSTs written since Open: flushes,
	// compactions and ingests. Over WALWritten it is the write
	// amplification of the LSM.
	TablesWritten uint64
	// ColdPartitions counts the sealed partitions moved into the cold
	// database since Open.
	ColdPartitions uint64
	// Allocated is what the store's whole directory occupies as the
	// operating system counts it (the blocks allocated to its files, as
	// du counts them), by part. The figures above are Pebble's own: file
	// sizes, without the WAL's preallocation or the store's other files.
	Allocated DirUsage
}

// DirUsage is a directory's disk space as the operating system counts it
// (allocated blocks), by part. On a filesystem that is not the
// operating system's (a test's in-memory one), each file counts its size.
type DirUsage struct {
	// Total is every file under the directory.
	Total uint64
	// Tables are the SSTs of the store's hot database, ColdTables those of
	// its cold one (sealed partitions moved out of the hot LSM).
	Tables, ColdTables uint64
	// WAL is the write-ahead log: live and recycled files, with what is
	// preallocated to them.
	WAL uint64
	// Filters are the Bloom filters' files: sealed partitions,
	// checkpoints of the open ones, the snapshot a clean Close leaves.
	Filters uint64
	// Other is the rest: manifests, options, locks, files a compaction
	// has not deleted yet.
	Other uint64
}

// AllLive sets every probe to name every live partition when current is
// the newest, and returns the oldest: the masks of a store without
// filters, or of filters that cannot answer yet.
func AllLive(parts Partitions, current int64, probes []Probe) (oldest int64) {
	all := uint64(1)<<parts.Live - 1
	for j := range probes {
		probes[j] = Probe{Maybe: all}
	}
	return parts.Oldest(current)
}
