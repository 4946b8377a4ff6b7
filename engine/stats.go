package engine

import (
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// Stats is a snapshot of an Engine's counters since Open, grouped by what
// they describe: the calls, the commit queue, and each tier.
type Stats struct {
	// Tiers is the configuration's Tiers (Default also with a Backend).
	Tiers Tiers
	// Config names the configuration: Tiers.String(), or "memory+" and
	// the Backend's name ("memory+redis").
	Config string
	// Window is the retention window; Coverage how much of it the engine
	// holds: since the store was created (Default) or the engine opened.
	Window, Coverage time.Duration

	// Calls counts the answers and settlements of every call.
	Calls CallStats
	// Queue is the commit queue's figures.
	Queue QueueStats
	// Memory is the memory tier's figures.
	Memory MemoryStats
	// Bloom is the filters' figures (the embedded store's; zero without
	// filters).
	Bloom BloomStats
	// Store is the exact tier's figures (reads; the embedded store's disk).
	Store StoreStats
	// Archive is the archive's figures (Options.Archive); nil without one.
	Archive *ArchiveStats
}

// CallStats counts the engine's answers and settlements.
type CallStats struct {
	Claims, New, Duplicates, InFlight, Conflicts, Poisoned uint64
	// Stale counts Advance answers Stale (Claims and the others count
	// Advance's answers too).
	Stale             uint64
	Commits, Releases uint64
	// LeaseExpiries counts claims taken over after their lease ended;
	// LeaseLost counts Commit and Release calls refused for that reason.
	LeaseExpiries, LeaseLost uint64
	// Errors counts calls that failed in a tier, or were refused because
	// the embedded store had failed.
	Errors uint64
	// FailOpen counts keys answered New, or commits acknowledged, while
	// the shared tier was unavailable (Options.FailOpen).
	FailOpen uint64
	// DonePanics counts CommitAsync dones that panicked. The engine
	// recovers each, logs it with its stack (Options.Logger), and goes on
	// delivering the other dones in order: one caller's bug must not stop
	// every other caller's acknowledgements.
	DonePanics uint64
	// Lookups counts the keys looked up; Forgets, the keys whose commit
	// or attempt count Forget removed.
	Lookups, Forgets uint64
	// Refreshes counts the duplicates of sliding namespaces that
	// re-committed their key (NamespaceOptions.Sliding): each one record (in MarkBatch, written with the batch's commits).
	Refreshes uint64
}

// QueueStats is the commit queue's figures: commit calls (Commit, Do,
// CommitAsync...) enqueued together are written as one group.
type QueueStats struct {
	// Groups counts the queue's durable writes; Pending is how many calls
	// wait in it now.
	Groups  uint64
	Pending int
	// Latency is the time each group took to become durable (the exact
	// tier's write: a synced Pebble batch, a Redis pipeline).
	Latency Histogram
}

// MemoryStats is the memory tier's figures.
type MemoryStats struct {
	// Hits counts keys answered from memory as committed; Misses, keys
	// that memory did not know.
	Hits, Misses uint64
	// Claims and Entries are the claims in flight and the committed keys
	// cached now.
	Claims, Entries int
}

// BloomStats is the filters' figures.
type BloomStats struct {
	// Mode is "warm" (a "no" skips the disk), "rebuilding" (every check
	// reads Pebble while the filters refill) or "cold" (rebuild failed:
	// every check reads Pebble), or "" without filters.
	Mode string
	// Negatives counts keys the filters proved new (no disk read).
	// FalsePositives counts filter "maybe" answers that Pebble
	// overturned: the measured false positives.
	Negatives, FalsePositives uint64
	// Bytes is the memory of the filters; TargetFP the configured
	// whole-window rate and EstimatedFP the rate at the current fill.
	Bytes                 int64
	TargetFP, EstimatedFP float64
	// RebuiltKeys counts the keys scanned back into filters since Open.
	RebuiltKeys uint64
	// Partitions is each live partition's filter, oldest first: its
	// measured false-positive rate beside its target.
	// RecommendedExpectedKeys is the largest ExpectedKeys a filter over
	// twice its target recommends (zero when none is), and OverTarget
	// counts the filters found so since Open (each logged once, with the
	// ExpectedKeys that would restore it).
	Partitions              []BloomPartition
	RecommendedExpectedKeys int
	OverTarget              uint64
	// Sealed is the live closed partitions whose filter is saved with a
	// seal the store holds; SealedLoaded, those whose saved filter this
	// Open loaded after an unclean shutdown instead of rebuilding them
	// from Pebble; SealFailures, failed attempts to save one.
	Sealed, SealedLoaded, SealFailures uint64
	// Checkpoints counts the checkpoints of the open partitions' filters
	// taken since Open (CheckpointFailures failed); Restored, the
	// partitions this Open restored from one after an unclean shutdown
	// instead of scanning them, with JournalKeys read from the journal
	// after it.
	Checkpoints, CheckpointFailures, Restored, JournalKeys uint64
}

// DiskParts is a directory's disk space as the operating system counts
// it, by part (Stats.Store.Disk).
type DiskParts = tier.DirUsage

// StoreStats is the exact tier's figures.
type StoreStats struct {
	// Reads counts keys looked up in the exact tier (Pebble, Redis or
	// PostgreSQL); Hits, those found committed.
	Reads, Hits uint64
	// PartitionsDropped counts the partitions dropped since Open;
	// ColdPartitions, the sealed partitions moved into the embedded
	// store's cold database.
	PartitionsDropped, ColdPartitions uint64
	// DiskBytes is what the embedded store's directory occupies as the
	// operating system counts it (the blocks allocated to its files, what
	// du reports): Disk.Total, split by part in Disk. It includes what
	// Pebble's own figures below leave out: the WAL's preallocation, the
	// Bloom filters' files (sealed partitions, checkpoints), the store's
	// other files.
	DiskBytes uint64
	Disk      DiskParts
	// TableBytes and WALBytes are Pebble's own sizes of its live SSTs and
	// live WAL files, WALRecycledBytes those of the WAL files kept for
	// reuse (WALRecycledFiles of them). WALWrittenBytes counts the bytes
	// written to the WAL since Open, TableWrittenBytes those written to
	// SSTs (flushes, compactions, moves of sealed partitions): their ratio
	// is the write amplification.
	TableBytes, WALBytes              uint64
	WALRecycledBytes, WALWrittenBytes uint64
	TableWrittenBytes                 uint64
	WALRecycledFiles                  int
	// FsyncLatency is the WAL's fsyncs (Default; Bounds are Pebble's own
	// histogram's, nearest below the engine's).
	FsyncLatency Histogram
}

// counters are the engine's live counters, added once per batch.
type counters struct {
	claims, fresh, dups, inflight, conflicts, poisoned atomic.Uint64
	stale                                              atomic.Uint64
	commits, releases                                  atomic.Uint64
	leaseExpiries, leaseLost, errors                   atomic.Uint64
	memHits, memMisses                                 atomic.Uint64
	bloomNegatives, bloomFalsePositives                atomic.Uint64
	storeReads, storeHits                              atomic.Uint64
	partitionsDropped, failOpen                        atomic.Uint64
	commitGroups, donePanics                           atomic.Uint64
	lookups, forgets                                   atomic.Uint64
	bloomOverTarget, refreshes                         atomic.Uint64
	commitLatency                                      latency
}

// tally counts one call's events before they are added to the counters.
type tally struct {
	claims, fresh, dups, inflight, conflicts, poisoned uint64
	stale                                              uint64
	leaseExpiries, errors, commits                     uint64
	memHits, memMisses                                 uint64
	bloomNegatives, bloomFalsePositives                uint64
	storeReads, storeHits                              uint64
}

func (t *tally) count(o Outcome) {
	switch o {
	case New:
		t.fresh++
	case Duplicate:
		t.dups++
	case InFlight:
		t.inflight++
	case Conflict:
		t.conflicts++
	case Poison:
		t.poisoned++
	case Stale:
		t.stale++
	}
}

func (c *counters) add(t *tally) {
	for _, p := range [...]struct {
		dst *atomic.Uint64
		n   uint64
	}{
		{&c.claims, t.claims}, {&c.fresh, t.fresh}, {&c.dups, t.dups}, {&c.inflight, t.inflight},
		{&c.conflicts, t.conflicts}, {&c.poisoned, t.poisoned}, {&c.stale, t.stale}, {&c.leaseExpiries, t.leaseExpiries}, {&c.errors, t.errors}, {&c.commits, t.commits},
		{&c.memHits, t.memHits}, {&c.memMisses, t.memMisses}, {&c.bloomNegatives, t.bloomNegatives},
		{&c.bloomFalsePositives, t.bloomFalsePositives}, {&c.storeReads, t.storeReads}, {&c.storeHits, t.storeHits},
	} {
		if p.n != 0 {
			p.dst.Add(p.n)
		}
	}
}

// Stats returns the current counters.
func (e *Engine) Stats() Stats {
	c := &e.stats
	s := Stats{
		Tiers:  e.tiers,
		Config: e.name,
		Window: time.Duration(e.window),
		Calls: CallStats{
			Claims: c.claims.Load(), New: c.fresh.Load(), Duplicates: c.dups.Load(),
			InFlight: c.inflight.Load(), Conflicts: c.conflicts.Load(), Poisoned: c.poisoned.Load(), Stale: c.stale.Load(),
			Commits: c.commits.Load(), Releases: c.releases.Load(),
			LeaseExpiries: c.leaseExpiries.Load(), LeaseLost: c.leaseLost.Load(), Errors: c.errors.Load(),
			FailOpen: c.failOpen.Load(), DonePanics: c.donePanics.Load(),
			Lookups: c.lookups.Load(), Forgets: c.forgets.Load(), Refreshes: c.refreshes.Load(),
		},
		Queue:  QueueStats{Groups: c.commitGroups.Load()},
		Memory: MemoryStats{Hits: c.memHits.Load(), Misses: c.memMisses.Load()},
		Bloom:  BloomStats{Negatives: c.bloomNegatives.Load(), FalsePositives: c.bloomFalsePositives.Load()},
		Store:  StoreStats{Reads: c.storeReads.Load(), Hits: c.storeHits.Load(), PartitionsDropped: c.partitionsDropped.Load()},
	}
	s.Memory.Claims, s.Memory.Entries = e.mem.Len()
	if e.queue != nil {
		s.Queue.Pending = e.queue.pending()
	}
	s.Queue.Latency = c.commitLatency.snapshot()
	if e.arch != nil {
		s.Archive = e.arch.Stats()
	}
	if e.local != nil {
		l := e.local.Stats()
		s.Bloom.Mode, s.Bloom.Bytes, s.Bloom.TargetFP, s.Bloom.EstimatedFP = l.Mode, l.Bytes, l.TargetFP, l.EstimatedFP
		s.Bloom.RebuiltKeys, s.Bloom.Sealed, s.Bloom.SealedLoaded, s.Bloom.SealFailures = l.RebuiltKeys, l.Sealed, l.SealedLoaded, l.SealFailures
		now := e.reading()
		for _, p := range e.local.Partitions() {
			bp := e.bloomPartition(p, now)
			s.Bloom.Partitions = append(s.Bloom.Partitions, bp)
			s.Bloom.RecommendedExpectedKeys = max(s.Bloom.RecommendedExpectedKeys, bp.RecommendedExpectedKeys)
		}
		s.Bloom.OverTarget = c.bloomOverTarget.Load()
		s.Bloom.Checkpoints, s.Bloom.CheckpointFailures = l.Checkpoints, l.CheckpointFailures
		s.Bloom.Restored, s.Bloom.JournalKeys = l.RestoredPartitions, l.JournalKeys
		s.Store.ColdPartitions = l.Disk.ColdPartitions
		s.Store.Disk, s.Store.DiskBytes = l.Disk.Allocated, l.Disk.Allocated.Total
		if e.exact != nil {
			h := &s.Store.FsyncLatency
			h.Bounds, h.Counts, h.Count, h.Sum = e.local.FsyncLatency(latencyBounds)
			d := l.Disk
			s.Store.TableBytes, s.Store.WALBytes = d.Tables, d.WAL
			s.Store.WALRecycledBytes, s.Store.WALWrittenBytes, s.Store.WALRecycledFiles = d.RecycledWAL, d.WALWritten, d.RecycledWALFiles
			s.Store.TableWrittenBytes = d.TablesWritten
		}
	}
	s.Coverage = min(time.Duration(e.highWater.Load()-e.openedAt), s.Window)
	return s
}
