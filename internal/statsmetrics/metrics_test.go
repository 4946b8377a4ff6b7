package statsmetrics

import (
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestTable: every metric has both names (each unique), a kind, a unit
// and help; a histogram also its count's unit.
func TestTable(t *testing.T) {
	names, otel := map[string]bool{}, map[string]bool{}
	for _, m := range Metrics {
		if m.Name == "" || names[m.Name] || !strings.HasPrefix(m.OTel, "tierdedup.") || otel[m.OTel] {
			t.Errorf("%q / %q: a name missing or repeated", m.Name, m.OTel)
		}
		names[m.Name], otel[m.OTel] = true, true
		if m.Kind < Counter || m.Kind > Histogram || m.Unit == "" || m.Help == "" || (m.Kind == Histogram) != (m.CountUnit != "") {
			t.Errorf("%s: %+v", m.Name, m)
		}
		if m.Kind == Counter != strings.HasSuffix(m.Name, "_total") {
			t.Errorf("%s is a %v", m.Name, m.Kind)
		}
	}
}

// TestEach: the Stats of a configuration with everything (the embedded
// store, filters, an archive, a window) give a point of every metric,
// each with its metric's labels, the values taken from the right fields.
func TestEach(t *testing.T) {
	s := engine.Stats{Config: engine.Default.String(), Archive: &engine.ArchiveStats{Reads: 5, Hits: 2, Drainer: true},
		Calls: engine.CallStats{New: 7}, Store: engine.StoreStats{Reads: 3, Hits: 1, DiskBytes: 1000, Disk: engine.DiskParts{Total: 1000, WAL: 700, Filters: 300}},
		Memory: engine.MemoryStats{Claims: 4}, Window: time.Hour, Coverage: 15 * time.Minute,
		Queue: engine.QueueStats{Latency: engine.Histogram{Count: 9, Sum: 0.5}},
		Bloom: engine.BloomStats{Mode: "rebuilding", Partitions: []engine.BloomPartition{{Start: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC), Keys: 10, Checked: 100, FalsePositives: 2, MeasuredFP: 0.02, TargetFP: 0.001, EstimatedFP: 0.003}}}}
	points := map[string][]Point{}
	Each(&s, func(p Point) {
		if p.Metric == nil {
			t.Fatalf("a point of no metric: %+v", p)
		}
		if len(p.Labels) != len(p.Metric.Labels) {
			t.Errorf("%s: labels %v for %v", p.Metric.Name, p.Labels, p.Metric.Labels)
		}
		points[p.Metric.Name] = append(points[p.Metric.Name], p)
	})
	for _, m := range Metrics {
		if len(points[m.Name]) == 0 {
			t.Errorf("%s has no point", m.Name)
		}
	}
	find := func(name string, labels ...string) Point {
		for _, p := range points[name] {
			if strings.Join(p.Labels, ",") == strings.Join(labels, ",") {
				return p
			}
		}
		t.Fatalf("no %s%v", name, labels)
		return Point{}
	}
	for _, c := range []struct {
		got, want float64
	}{
		{float64(find("claims_total", "new").Count), 7},
		{float64(find("tier_lookups_total", "store", "miss").Count), 2},
		{find("memory_entries", "claims").Value, 4},
		{find("bloom_state", "rebuilding").Value, 1},
		{find("bloom_state", "warm").Value, 0},
		{find("window_coverage_ratio").Value, 0.25},
		{float64(find("archive_reads_total", "miss").Count), 3},
		{find("archive_drainer").Value, 1},
		{find("disk_bytes", "total").Value, 1000},
		{find("disk_bytes", "wal").Value, 700},
		{find("disk_bytes", "filters").Value, 300},
		{float64(find("commit_batch_seconds").Histogram.Count), 9},
		{find("bloom_partition_false_positive_ratio", "2026-12-03T00:00:00Z", "measured").Value, 0.02},
		{find("bloom_partition_false_positive_ratio", "2026-12-03T00:00:00Z", "target").Value, 0.001},
		{find("bloom_partition_keys", "2026-12-03T00:00:00Z").Value, 10},
	} {
		if c.got != c.want {
			t.Errorf("got %v, want %v", c.got, c.want)
		}
	}

	// Without the embedded store, filters or an archive: none of theirs.
	points = map[string][]Point{}
	Each(&engine.Stats{Config: "memory+redis"}, func(p Point) { points[p.Metric.Name] = append(points[p.Metric.Name], p) })
	for _, name := range []string{"wal_fsync_seconds", "disk_bytes", "bloom_state", "archive_partitions", "window_coverage_ratio"} {
		if len(points[name]) != 0 {
			t.Errorf("%s without its part: %+v", name, points[name])
		}
	}
}
