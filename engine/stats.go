package engine

import (
	"sync/atomic"
	"time"
)

// Stats is a snapshot of an Engine's counters since Open.
type Stats struct {
	// Tiers is the configuration's Tiers (Default also with a Backend).
	Tiers Tiers
	// Config names the configuration: Tiers.String(), or "memory+" and
	// the Backend's name ("memory+redis").
	Config string
	// BloomMode is "warm" (a "no" skips the disk), "rebuilding" (every
	// check reads Pebble while the filters refill) or "cold" (rebuild
	// failed: every check reads Pebble), or "" without filters.
	BloomMode string
	// Archive is the archive's figures (Options.Archive); nil without one.
	Archive *ArchiveStats

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
	// CommitGroups counts the durable writes of the commit queue: commit
	// calls (Commit, Do, CommitAsync...) enqueued together are written as
	// one group. CommitsPending is how many calls wait in it now.
	CommitGroups   uint64
	CommitsPending int
	// CommitLatency is the time each group of the commit queue took to
	// become durable (the exact tier's write: a synced Pebble batch, a
	// Redis pipeline). FsyncLatency is the WAL's fsyncs (Default; Bounds
	// are Pebble's own histogram's, nearest below the engine's).
	CommitLatency, FsyncLatency Histogram
	// Lookups counts the keys looked up; Forgets, the keys whose commit
	// or attempt count Forget removed.
	Lookups, Forgets uint64
	// Refreshes counts the duplicates of sliding namespaces that
	// re-committed their key (NamespaceOptions.Sliding): each one write.
	Refreshes uint64

	// MemoryHits counts keys answered from memory as committed;
	// MemoryMisses, keys that memory did not know.
	MemoryHits, MemoryMisses uint64
	// MemoryClaims and MemoryEntries are the claims in flight and the
	// committed keys cached now.
	MemoryClaims, MemoryEntries int

	// BloomNegatives counts keys the filters proved new (no disk read).
	// BloomFalsePositives counts filter "maybe" answers that Pebble
	// overturned: the measured false positives.
	BloomNegatives, BloomFalsePositives uint64
	// BloomBytes is the memory of the filters; BloomTargetFP the configured
	// whole-window rate and BloomEstimatedFP the rate at the current fill.
	BloomBytes                         int64
	BloomTargetFP, BloomEstimatedFP    float64
	BloomRebuiltKeys, PartitionDropped uint64
	// BloomPartitions is each live partition's filter, oldest first: its
	// measured false-positive rate beside its target.
	// BloomRecommendedExpectedKeys is the largest ExpectedKeys a filter
	// over twice its target recommends (zero when none is), and
	// BloomOverTarget counts the filters found so since Open (each logged
	// once, with the ExpectedKeys that would restore it).
	BloomPartitions              []BloomPartition
	BloomRecommendedExpectedKeys int
	BloomOverTarget              uint64
	// BloomSealed is the live closed partitions whose filter is saved with
	// a seal the store holds; BloomSealedLoaded, those whose saved filter
	// this Open loaded after an unclean shutdown instead of rebuilding
	// them from Pebble; BloomSealFailures, failed attempts to save one.
	BloomSealed, BloomSealedLoaded, BloomSealFailures uint64
	// BloomCheckpoints counts the checkpoints of the open partitions'
	// filters taken since Open (BloomCheckpointFailures failed);
	// BloomRestored, the partitions this Open restored from one after an
	// unclean shutdown instead of scanning them, with BloomJournalKeys
	// read from the journal after it.
	BloomCheckpoints, BloomCheckpointFailures, BloomRestored, BloomJournalKeys uint64
	// ColdPartitions counts the sealed partitions moved into the store's
	// cold database since Open.
	ColdPartitions uint64

	// StoreReads counts keys looked up in the durable tier (Pebble or
	// Redis); StoreHits, those found committed.
	StoreReads, StoreHits uint64
	// DiskBytes is Pebble's size on disk: live SSTs (TableBytes), live WAL
	// (WALBytes), recycled WAL files kept for reuse (WALRecycledBytes, in
	// WALRecycledFiles files), files a compaction has not yet deleted, the
	// manifest. WALWrittenBytes counts the bytes written to the WAL since
	// Open, TableWrittenBytes those written to SSTs (flushes, compactions,
	// moves of sealed partitions): their ratio is the write amplification.
	DiskBytes, TableBytes, WALBytes   uint64
	WALRecycledBytes, WALWrittenBytes uint64
	TableWrittenBytes                 uint64
	WALRecycledFiles                  int

	// Window is the retention window; Coverage how much of it the engine
	// holds: since the store was created (Default) or the engine opened.
	Window, Coverage time.Duration
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
		Claims: c.claims.Load(), New: c.fresh.Load(), Duplicates: c.dups.Load(),
		InFlight: c.inflight.Load(), Conflicts: c.conflicts.Load(), Poisoned: c.poisoned.Load(), Stale: c.stale.Load(),
		Commits: c.commits.Load(), Releases: c.releases.Load(),
		LeaseExpiries: c.leaseExpiries.Load(), LeaseLost: c.leaseLost.Load(), Errors: c.errors.Load(),
		FailOpen: c.failOpen.Load(), DonePanics: c.donePanics.Load(), CommitGroups: c.commitGroups.Load(),
		Lookups: c.lookups.Load(), Forgets: c.forgets.Load(), Refreshes: c.refreshes.Load(),
		MemoryHits: c.memHits.Load(), MemoryMisses: c.memMisses.Load(),
		BloomNegatives: c.bloomNegatives.Load(), BloomFalsePositives: c.bloomFalsePositives.Load(),
		PartitionDropped: c.partitionsDropped.Load(),
		StoreReads:       c.storeReads.Load(), StoreHits: c.storeHits.Load(),
		Window: time.Duration(e.window),
	}
	s.MemoryClaims, s.MemoryEntries = e.mem.Len()
	if e.queue != nil {
		s.CommitsPending = e.queue.pending()
	}
	s.CommitLatency = c.commitLatency.snapshot()
	if e.arch != nil {
		s.Archive = e.arch.Stats()
	}
	if e.local != nil {
		l := e.local.Stats()
		s.BloomMode, s.BloomBytes, s.BloomTargetFP, s.BloomEstimatedFP = l.Mode, l.Bytes, l.TargetFP, l.EstimatedFP
		s.BloomRebuiltKeys, s.BloomSealed, s.BloomSealedLoaded, s.BloomSealFailures = l.RebuiltKeys, l.Sealed, l.SealedLoaded, l.SealFailures
		now := e.reading()
		for _, p := range e.local.Partitions() {
			bp := e.bloomPartition(p, now)
			s.BloomPartitions = append(s.BloomPartitions, bp)
			s.BloomRecommendedExpectedKeys = max(s.BloomRecommendedExpectedKeys, bp.RecommendedExpectedKeys)
		}
		s.BloomOverTarget = c.bloomOverTarget.Load()
		s.BloomCheckpoints, s.BloomCheckpointFailures = l.Checkpoints, l.CheckpointFailures
		s.BloomRestored, s.BloomJournalKeys = l.RestoredPartitions, l.JournalKeys
		s.ColdPartitions = l.Disk.ColdPartitions
		if e.exact != nil {
			h := &s.FsyncLatency
			h.Bounds, h.Counts, h.Count, h.Sum = e.local.FsyncLatency(latencyBounds)
			d := l.Disk
			s.DiskBytes, s.TableBytes, s.WALBytes = d.Total, d.Tables, d.WAL
			s.WALRecycledBytes, s.WALWrittenBytes, s.WALRecycledFiles = d.RecycledWAL, d.WALWritten, d.RecycledWALFiles
			s.TableWrittenBytes = d.TablesWritten
		}
	}
	s.Coverage = min(time.Duration(e.highWater.Load()-e.openedAt), s.Window)
	return s
}
