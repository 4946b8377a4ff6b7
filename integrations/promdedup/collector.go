package promdedup

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tierdedup/tierdedup/engine"
)

// Collector is a prometheus.Collector of one Engine's Stats.
type Collector struct {
	e     *engine.Engine
	descs map[string]*prometheus.Desc
}

// New returns a Collector of e's Stats; constLabels (may be nil) are added
// to every metric, to tell engines of one process apart (for example
// {"engine": "payments"}).
func New(e *engine.Engine, constLabels prometheus.Labels) *Collector {
	c := &Collector{e: e, descs: map[string]*prometheus.Desc{}}
	for _, m := range metrics {
		c.descs[m.name] = prometheus.NewDesc("tierdedup_"+m.name, m.help, m.labels, constLabels)
	}
	return c
}

// metric is one exported metric: its name (after "tierdedup_"), help and
// variable labels.
type metric struct {
	name, help string
	labels     []string
}

var metrics = []metric{
	{"claims_total", "Keys claimed (and entities advanced), by the outcome they were answered.", []string{"outcome"}},
	{"commits_total", "Claims committed.", nil},
	{"releases_total", "Claims released.", nil},
	{"lease_expiries_total", "Claims taken over after their lease ended.", nil},
	{"lease_lost_total", "Commits and releases refused because their claim had lost its lease.", nil},
	{"tier_lookups_total", "Keys each tier answered, by result: memory hit or miss, bloom negative (proved new) or false_positive (a maybe the store overturned), store hit or miss.", []string{"tier", "result"}},
	{"errors_total", "Calls that failed in a tier, or were refused because the embedded store had failed.", nil},
	{"fail_open_total", "Keys answered New, or commits acknowledged, while the shared tier was unavailable (FailOpen).", nil},
	{"done_panics_total", "CommitAsync dones that panicked (recovered and logged; the others were delivered).", nil},
	{"commit_groups_total", "Durable writes of the commit queue.", nil},
	{"commit_queue_depth", "Commit calls waiting in the commit queue.", nil},
	{"commit_batch_seconds", "Time each commit group took to become durable.", nil},
	{"wal_fsync_seconds", "Time each WAL fsync took (embedded store).", nil},
	{"lookups_total", "Keys looked up with Lookup.", nil},
	{"forgets_total", "Keys whose commit or attempt count Forget removed.", nil},
	{"memory_entries", "Entries of the memory tier, by kind: claims in flight, committed keys cached.", []string{"kind"}},
	{"bloom_state", "1 for the filters' current state (warm: a no skips the store; rebuilding; cold), 0 for the others.", []string{"state"}},
	{"bloom_bytes", "Memory of the Bloom filters.", nil},
	{"bloom_estimated_false_positive_ratio", "False-positive rate of the filters at their current fill.", nil},
	{"window_seconds", "The retention window.", nil},
	{"window_coverage_ratio", "Share of the window the engine holds: since its store was created (Default) or it opened.", nil},
	{"archive_partitions", "Partitions the archive holds (Options.Archive).", nil},
	{"archive_lag_partitions", "Closed partitions not archived yet.", nil},
	{"archive_keys_total", "Keys archived since the engine opened.", nil},
	{"archive_reads_total", "Keys looked up in the archive, by result: hit or miss.", []string{"result"}},
	{"archive_lag_reads_total", "Keys read in partitions that left the window before the archive took them.", nil},
	{"archive_failures_total", "Archiving passes that failed (the archive was unreachable or refused a write).", nil},
	{"archive_filter_bytes", "Memory of the archive's filter.", nil},
	{"archive_log_entries", "Entries of the shared tier's archive log not drained yet (behind Redis).", nil},
	{"archive_drainer", "1 while this engine holds the drain lease of the shared tier's archive log.", nil},
	{"disk_bytes", "Size on disk of the embedded store, by kind: total, tables, wal, wal_recycled.", []string{"kind"}},
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect reads Stats once and sends every metric.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.e.Stats()
	counter := func(name string, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	histogram := func(name string, h engine.Histogram) {
		buckets := make(map[float64]uint64, len(h.Bounds))
		for i, b := range h.Bounds {
			buckets[b] = h.Counts[i]
		}
		ch <- prometheus.MustNewConstHistogram(c.descs[name], h.Count, h.Sum, buckets)
	}
	for _, o := range []struct {
		label string
		n     uint64
	}{{"new", s.New}, {"duplicate", s.Duplicates}, {"in_flight", s.InFlight}, {"conflict", s.Conflicts}, {"poison", s.Poisoned}, {"stale", s.Stale}} {
		counter("claims_total", o.n, o.label)
	}
	counter("commits_total", s.Commits)
	counter("releases_total", s.Releases)
	counter("lease_expiries_total", s.LeaseExpiries)
	counter("lease_lost_total", s.LeaseLost)
	for _, l := range []struct {
		tier, result string
		n            uint64
	}{
		{"memory", "hit", s.MemoryHits}, {"memory", "miss", s.MemoryMisses},
		{"bloom", "negative", s.BloomNegatives}, {"bloom", "false_positive", s.BloomFalsePositives},
		{"store", "hit", s.StoreHits}, {"store", "miss", s.StoreReads - min(s.StoreHits, s.StoreReads)},
	} {
		counter("tier_lookups_total", l.n, l.tier, l.result)
	}
	counter("errors_total", s.Errors)
	counter("fail_open_total", s.FailOpen)
	counter("done_panics_total", s.DonePanics)
	counter("commit_groups_total", s.CommitGroups)
	gauge("commit_queue_depth", float64(s.CommitsPending))
	histogram("commit_batch_seconds", s.CommitLatency)
	if s.Config == engine.Default.String() {
		histogram("wal_fsync_seconds", s.FsyncLatency)
		for _, d := range []struct {
			kind string
			n    uint64
		}{{"total", s.DiskBytes}, {"tables", s.TableBytes}, {"wal", s.WALBytes}, {"wal_recycled", s.WALRecycledBytes}} {
			gauge("disk_bytes", float64(d.n), d.kind)
		}
	}
	counter("lookups_total", s.Lookups)
	counter("forgets_total", s.Forgets)
	gauge("memory_entries", float64(s.MemoryClaims), "claims")
	gauge("memory_entries", float64(s.MemoryEntries), "committed")
	if s.BloomMode != "" {
		for _, st := range []string{"warm", "rebuilding", "cold"} {
			v := 0.0
			if s.BloomMode == st {
				v = 1
			}
			gauge("bloom_state", v, st)
		}
		gauge("bloom_bytes", float64(s.BloomBytes))
		gauge("bloom_estimated_false_positive_ratio", s.BloomEstimatedFP)
	}
	if a := s.Archive; a != nil {
		gauge("archive_partitions", float64(a.Held))
		gauge("archive_lag_partitions", float64(a.Lag))
		counter("archive_keys_total", a.Keys)
		counter("archive_reads_total", a.Hits, "hit")
		counter("archive_reads_total", a.Reads-min(a.Hits, a.Reads), "miss")
		counter("archive_lag_reads_total", a.LagReads)
		counter("archive_failures_total", a.Failures)
		gauge("archive_filter_bytes", float64(a.FilterBytes))
		gauge("archive_log_entries", float64(a.LogEntries))
		drainer := 0.0
		if a.Drainer {
			drainer = 1
		}
		gauge("archive_drainer", drainer)
	}
	gauge("window_seconds", s.Window.Seconds())
	if s.Window > 0 {
		gauge("window_coverage_ratio", float64(s.Coverage)/float64(s.Window))
	}
}
