package archive

import "time"

// Stats are the archive's figures.
type Stats struct {
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
	// not drained yet (commits and removals, as last read), and Drainer
	// says whether this engine held the drain lease at its last pass.
	// Lag is then the closed partitions not sealed yet (0 while the drain
	// keeps up).
	LogEntries uint64
	Drainer    bool
}

// Stats returns the archive's figures.
func (a *Archiver) Stats() *Stats {
	cur := a.c.Current()
	return &Stats{
		Name: a.name, Window: a.c.ArchiveWindow, Held: uint64(max(0, a.held.Load())),
		Partitions: a.archived.Load(), Keys: a.keys.Load(), Lag: uint64(max(0, cur-a.next.Load())), Failures: a.failures.Load(),
		Reads: a.reads.Load(), Hits: a.hits.Load(), LagReads: a.lagReads.Load(), FilterBytes: a.filters.Bytes(),
		LogEntries: uint64(max(0, a.logLag.Load())), Drainer: a.holder.Load(),
	}
}
