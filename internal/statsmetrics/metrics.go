package statsmetrics

import (
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// Kind is how a metric's points are read.
type Kind uint8

// Kinds.
const (
	// Counter: a count since the engine opened, only ever growing
	// (Point.Count).
	Counter Kind = iota + 1
	// Gauge: a value now, which may go down (Point.Value).
	Gauge
	// Histogram: a distribution since the engine opened (Point.Histogram).
	Histogram
)

// String returns the kind's name.
func (k Kind) String() string {
	switch k {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	case Histogram:
		return "histogram"
	}
	return "Kind(?)"
}

// Metric is one metric of the set.
type Metric struct {
	// Name is the Prometheus name after "tierdedup_" ("claims_total").
	Name string
	// OTel is the OpenTelemetry instrument name ("tierdedup.claims"); a
	// Histogram's is the stem of its two instruments (OTel.sum, OTel.count).
	OTel string
	// Kind says which of Point's fields holds a point's value.
	Kind Kind
	// Unit is the value's unit, as OpenTelemetry spells it (UCUM: "s",
	// "By", "1", or a count of things in braces, "{key}"); a Histogram's
	// is its observations' (their sum's) unit.
	Unit string
	// CountUnit is a Histogram's count's unit: what each observation is.
	CountUnit string
	// Labels are the names of the label (attribute) values each point has.
	Labels []string
	// Help says what the metric counts or measures.
	Help string
}

// Metrics is the metric set. A metric is added here and to Each; its
// names, once published, are never changed.
var Metrics = []Metric{
	{Name: "claims_total", OTel: "tierdedup.claims", Kind: Counter, Unit: "{key}", Labels: []string{"outcome"},
		Help: "Keys claimed (and entities advanced), by the outcome they were answered."},
	{Name: "commits_total", OTel: "tierdedup.commits", Kind: Counter, Unit: "{claim}",
		Help: "Claims committed."},
	{Name: "releases_total", OTel: "tierdedup.releases", Kind: Counter, Unit: "{claim}",
		Help: "Claims released."},
	{Name: "lease_expiries_total", OTel: "tierdedup.lease.expiries", Kind: Counter, Unit: "{claim}",
		Help: "Claims taken over after their lease ended."},
	{Name: "lease_lost_total", OTel: "tierdedup.lease.lost", Kind: Counter, Unit: "{call}",
		Help: "Commits and releases refused because their claim had lost its lease."},
	{Name: "tier_lookups_total", OTel: "tierdedup.tier.lookups", Kind: Counter, Unit: "{key}", Labels: []string{"tier", "result"},
		Help: "Keys each tier answered, by result: memory hit or miss, bloom negative (proved new) or false_positive (a maybe the store overturned), store hit or miss."},
	{Name: "errors_total", OTel: "tierdedup.errors", Kind: Counter, Unit: "{call}",
		Help: "Calls that failed in a tier, or were refused because the embedded store had failed."},
	{Name: "fail_open_total", OTel: "tierdedup.fail_open", Kind: Counter, Unit: "{key}",
		Help: "Keys answered New, or commits acknowledged, while the shared tier was unavailable (FailOpen)."},
	{Name: "done_panics_total", OTel: "tierdedup.done_panics", Kind: Counter, Unit: "{call}",
		Help: "CommitAsync dones that panicked (recovered and logged; the others were delivered)."},
	{Name: "commit_groups_total", OTel: "tierdedup.commit.groups", Kind: Counter, Unit: "{group}",
		Help: "Durable writes of the commit queue."},
	{Name: "commit_queue_depth", OTel: "tierdedup.commit.queue.depth", Kind: Gauge, Unit: "{call}",
		Help: "Commit calls waiting in the commit queue."},
	{Name: "commit_batch_seconds", OTel: "tierdedup.commit.batch.duration", Kind: Histogram, Unit: "s", CountUnit: "{group}",
		Help: "Time each commit group took to become durable."},
	{Name: "wal_fsync_seconds", OTel: "tierdedup.wal.fsync.duration", Kind: Histogram, Unit: "s", CountUnit: "{fsync}",
		Help: "Time each WAL fsync took (embedded store)."},
	{Name: "lookups_total", OTel: "tierdedup.lookups", Kind: Counter, Unit: "{key}",
		Help: "Keys looked up with Lookup."},
	{Name: "forgets_total", OTel: "tierdedup.forgets", Kind: Counter, Unit: "{key}",
		Help: "Keys whose commit or attempt count Forget removed."},
	{Name: "memory_entries", OTel: "tierdedup.memory.entries", Kind: Gauge, Unit: "{entry}", Labels: []string{"kind"},
		Help: "Entries of the memory tier, by kind: claims in flight, committed keys cached."},
	{Name: "bloom_state", OTel: "tierdedup.bloom.state", Kind: Gauge, Unit: "1", Labels: []string{"state"},
		Help: "1 for the filters' current state (warm: a no skips the store; rebuilding; cold), 0 for the others."},
	{Name: "bloom_bytes", OTel: "tierdedup.bloom.size", Kind: Gauge, Unit: "By",
		Help: "Memory of the Bloom filters."},
	{Name: "bloom_estimated_false_positive_ratio", OTel: "tierdedup.bloom.estimated_false_positive_ratio", Kind: Gauge, Unit: "1",
		Help: "False-positive rate of the filters at their current fill."},
	{Name: "bloom_partition_false_positive_ratio", OTel: "tierdedup.bloom.partition.false_positive_ratio", Kind: Gauge, Unit: "1", Labels: []string{"partition", "kind"},
		Help: "Each live partition's filter (by its start, RFC 3339): measured (the share of recent new keys it answered maybe for: a store read for nothing), estimated (its formula at its keys) and target."},
	{Name: "bloom_partition_keys", OTel: "tierdedup.bloom.partition.keys", Kind: Gauge, Unit: "{key}", Labels: []string{"partition"},
		Help: "Keys added to each live partition's filter (by its start, RFC 3339)."},
	{Name: "bloom_recommended_expected_keys", OTel: "tierdedup.bloom.recommended_expected_keys", Kind: Gauge, Unit: "{key}",
		Help: "The ExpectedKeys a filter measured over twice its target asks for (its keys projected to its partition's end); 0 while none is."},
	{Name: "bloom_over_target_total", OTel: "tierdedup.bloom.over_target", Kind: Counter, Unit: "{filter}",
		Help: "Filters found over twice their false-positive target (measured; bloom-only, estimated), each logged once with the ExpectedKeys that would restore it."},
	{Name: "refreshes_total", OTel: "tierdedup.refreshes", Kind: Counter, Unit: "{key}",
		Help: "Duplicates of sliding namespaces that refreshed their key (NamespaceOptions.Sliding), each one record."},
	{Name: "window_seconds", OTel: "tierdedup.window.duration", Kind: Gauge, Unit: "s",
		Help: "The retention window."},
	{Name: "window_coverage_ratio", OTel: "tierdedup.window.coverage", Kind: Gauge, Unit: "1",
		Help: "Share of the window the engine holds: since its store was created (Default) or it opened."},
	{Name: "archive_partitions", OTel: "tierdedup.archive.partitions", Kind: Gauge, Unit: "{partition}",
		Help: "Partitions the archive holds (Options.Archive)."},
	{Name: "archive_lag_partitions", OTel: "tierdedup.archive.lag", Kind: Gauge, Unit: "{partition}",
		Help: "Closed partitions not archived yet."},
	{Name: "archive_keys_total", OTel: "tierdedup.archive.keys", Kind: Counter, Unit: "{key}",
		Help: "Keys archived since the engine opened."},
	{Name: "archive_reads_total", OTel: "tierdedup.archive.reads", Kind: Counter, Unit: "{key}", Labels: []string{"result"},
		Help: "Keys looked up in the archive, by result: hit or miss."},
	{Name: "archive_lag_reads_total", OTel: "tierdedup.archive.lag_reads", Kind: Counter, Unit: "{key}",
		Help: "Keys read in partitions that left the window before the archive took them."},
	{Name: "archive_failures_total", OTel: "tierdedup.archive.failures", Kind: Counter, Unit: "{pass}",
		Help: "Archiving passes that failed (the archive was unreachable or refused a write)."},
	{Name: "archive_filter_bytes", OTel: "tierdedup.archive.filter.size", Kind: Gauge, Unit: "By",
		Help: "Memory of the archive's filter."},
	{Name: "archive_log_entries", OTel: "tierdedup.archive.log.entries", Kind: Gauge, Unit: "{entry}",
		Help: "Entries of the shared tier's archive log not drained yet (behind Redis; an entry holds a call's commits, up to 256, or a removal)."},
	{Name: "archive_drainer", OTel: "tierdedup.archive.drainer", Kind: Gauge, Unit: "1",
		Help: "1 while this engine holds the drain lease of the shared tier's archive log."},
	{Name: "archive_log_passes_total", OTel: "tierdedup.archive.log.passes", Kind: Counter, Unit: "{pass}",
		Help: "Passes of this engine over the shared tier's archive log that read its length (archive_log_entries): a counter that stops means no pass runs."},
	{Name: "disk_bytes", OTel: "tierdedup.disk.usage", Kind: Gauge, Unit: "By", Labels: []string{"kind"},
		Help: "Disk space of the embedded store's directory as the OS allocates it (what du counts), by kind: total, tables, cold_tables, wal (preallocation included), filters, other; and archive, the files archive's own directory (not in total)."},
}

// byName finds a metric of Metrics by its Name.
var byName = func() map[string]*Metric {
	m := make(map[string]*Metric, len(Metrics))
	for i := range Metrics {
		m[Metrics[i].Name] = &Metrics[i]
	}
	return m
}()

// Point is one value of a metric: one set of label values.
type Point struct {
	Metric *Metric
	// Labels are the values of Metric.Labels, in their order.
	Labels []string
	// Count is a Counter's value.
	Count uint64
	// Value is a Gauge's value.
	Value float64
	// Histogram is a Histogram's distribution.
	Histogram engine.Histogram
}

// Each calls f with every point of s, in the order of Metrics. A metric
// the configuration does not have (the WAL's fsyncs and the disk without
// the embedded store, the Bloom filters without filters, the archive
// without one, the coverage without a window) has no point.
func Each(s *engine.Stats, f func(Point)) {
	counter := func(name string, v uint64, labels ...string) {
		f(Point{Metric: byName[name], Labels: labels, Count: v})
	}
	gauge := func(name string, v float64, labels ...string) {
		f(Point{Metric: byName[name], Labels: labels, Value: v})
	}
	histogram := func(name string, h engine.Histogram) {
		f(Point{Metric: byName[name], Histogram: h})
	}
	for _, o := range []struct {
		label string
		n     uint64
	}{{"new", s.Calls.New}, {"duplicate", s.Calls.Duplicates}, {"in_flight", s.Calls.InFlight}, {"conflict", s.Calls.Conflicts}, {"poison", s.Calls.Poisoned}, {"stale", s.Calls.Stale}} {
		counter("claims_total", o.n, o.label)
	}
	counter("commits_total", s.Calls.Commits)
	counter("releases_total", s.Calls.Releases)
	counter("lease_expiries_total", s.Calls.LeaseExpiries)
	counter("lease_lost_total", s.Calls.LeaseLost)
	for _, l := range []struct {
		tier, result string
		n            uint64
	}{
		{"memory", "hit", s.Memory.Hits}, {"memory", "miss", s.Memory.Misses},
		{"bloom", "negative", s.Bloom.Negatives}, {"bloom", "false_positive", s.Bloom.FalsePositives},
		{"store", "hit", s.Store.Hits}, {"store", "miss", s.Store.Reads - min(s.Store.Hits, s.Store.Reads)},
	} {
		counter("tier_lookups_total", l.n, l.tier, l.result)
	}
	counter("errors_total", s.Calls.Errors)
	counter("fail_open_total", s.Calls.FailOpen)
	counter("done_panics_total", s.Calls.DonePanics)
	counter("commit_groups_total", s.Queue.Groups)
	gauge("commit_queue_depth", float64(s.Queue.Pending))
	histogram("commit_batch_seconds", s.Queue.Latency)
	if s.Config == engine.Default.String() {
		histogram("wal_fsync_seconds", s.Store.FsyncLatency)
	}
	counter("lookups_total", s.Calls.Lookups)
	counter("forgets_total", s.Calls.Forgets)
	gauge("memory_entries", float64(s.Memory.Claims), "claims")
	gauge("memory_entries", float64(s.Memory.Entries), "committed")
	if s.Bloom.Mode != "" {
		for _, st := range []string{"warm", "rebuilding", "cold"} {
			v := 0.0
			if s.Bloom.Mode == st {
				v = 1
			}
			gauge("bloom_state", v, st)
		}
		gauge("bloom_bytes", float64(s.Bloom.Bytes))
		gauge("bloom_estimated_false_positive_ratio", s.Bloom.EstimatedFP)
		for _, b := range s.Bloom.Partitions {
			part := b.Start.UTC().Format(time.RFC3339)
			if b.Checked > 0 {
				gauge("bloom_partition_false_positive_ratio", b.MeasuredFP, part, "measured")
			}
			gauge("bloom_partition_false_positive_ratio", b.EstimatedFP, part, "estimated")
			gauge("bloom_partition_false_positive_ratio", b.TargetFP, part, "target")
			gauge("bloom_partition_keys", float64(b.Keys), part)
		}
		gauge("bloom_recommended_expected_keys", float64(s.Bloom.RecommendedExpectedKeys))
		counter("bloom_over_target_total", s.Bloom.OverTarget)
	}
	counter("refreshes_total", s.Calls.Refreshes)
	gauge("window_seconds", s.Window.Seconds())
	if s.Window > 0 {
		gauge("window_coverage_ratio", float64(s.Coverage)/float64(s.Window))
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
		counter("archive_log_passes_total", a.LogPasses)
	}
	if s.Config == engine.Default.String() || s.Config == engine.BloomOnly.String() {
		d := s.Store.Disk
		for _, p := range []struct {
			kind string
			n    uint64
		}{{"total", d.Total}, {"tables", d.Tables}, {"cold_tables", d.ColdTables}, {"wal", d.WAL}, {"filters", d.Filters}, {"other", d.Other}} {
			gauge("disk_bytes", float64(p.n), p.kind)
		}
	}
	if a := s.Archive; a != nil && a.DiskBytes > 0 {
		gauge("disk_bytes", float64(a.DiskBytes), "archive")
	}
}
