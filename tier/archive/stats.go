package archive

import "github.com/tierdedup/tierdedup/tier"

// Stats are the archive's figures (tier.ArchiveStats).
type Stats = tier.ArchiveStats

// Stats returns the archive's figures.
func (a *Archiver) Stats() *Stats {
	cur := a.c.Current()
	var disk uint64
	if d, ok := a.store.(tier.DiskUser); ok {
		disk = d.DiskBytes()
	}
	passes := a.passes.Load() // before logLag: its value is of that pass or a later one
	return &Stats{DiskBytes: disk,
		Name: a.name, Window: a.c.ArchiveWindow, Held: uint64(max(0, a.held.Load())),
		Partitions: a.archived.Load(), Keys: a.keys.Load(), Lag: uint64(max(0, cur-a.next.Load())), Failures: a.failures.Load(),
		Reads: a.reads.Load(), Hits: a.hits.Load(), LagReads: a.lagReads.Load(), FilterBytes: a.filters.Bytes(),
		LogEntries: uint64(max(0, a.logLag.Load())), Drainer: a.holder.Load(), LogPasses: passes,
	}
}
