package promdedup_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/promdedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// scrape fetches url and parses the text exposition format.
func scrape(t testing.TB, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// value is the value of the family's metric with the given label pairs.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.Metric {
		for i := 0; i < len(labels); i += 2 {
			found := false
			for _, l := range m.Label {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("no %s%v", name, labels)
	return 0
}

// TestScrape: the collector, registered in a pedantic registry (which
// checks every metric against its description), served over HTTP and
// scraped with the real client: every value is the engine's Stats.
func TestScrape(t *testing.T) {
	ctx := context.Background()
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(promdedup.New(e, prometheus.Labels{"engine": "t"}))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()

	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("a")}
	out := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	if err := e.CommitBatch(ctx, out[:2], nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, out[2]); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "d"} {
		if _, err := e.MarkIfAbsent(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Lookup(ctx, []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Forget(ctx, []byte("b")); err != nil {
		t.Fatal(err)
	}

	fams := scrape(t, srv.URL)
	s := e.Stats()
	checks := []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tierdedup_claims_total", []string{"outcome", "new"}, float64(s.Calls.New)},
		{"tierdedup_claims_total", []string{"outcome", "duplicate"}, float64(s.Calls.Duplicates)},
		{"tierdedup_claims_total", []string{"outcome", "in_flight"}, float64(s.Calls.InFlight)},
		{"tierdedup_commits_total", nil, float64(s.Calls.Commits)},
		{"tierdedup_releases_total", nil, float64(s.Calls.Releases)},
		{"tierdedup_tier_lookups_total", []string{"tier", "memory", "result", "hit"}, float64(s.Memory.Hits)},
		{"tierdedup_tier_lookups_total", []string{"tier", "memory", "result", "miss"}, float64(s.Memory.Misses)},
		{"tierdedup_tier_lookups_total", []string{"tier", "bloom", "result", "negative"}, float64(s.Bloom.Negatives)},
		{"tierdedup_commit_groups_total", nil, float64(s.Queue.Groups)},
		{"tierdedup_commit_batch_seconds", nil, float64(s.Queue.Latency.Count)},
		{"tierdedup_lookups_total", nil, float64(s.Calls.Lookups)},
		{"tierdedup_forgets_total", nil, float64(s.Calls.Forgets)},
		{"tierdedup_bloom_state", []string{"state", "warm"}, 1},
		{"tierdedup_window_seconds", nil, s.Window.Seconds()},
		{"tierdedup_memory_entries", []string{"kind", "committed"}, float64(s.Memory.Entries)},
	}
	for _, c := range checks {
		if got := value(t, fams, c.name, append([]string{"engine", "t"}, c.labels...)...); got != c.want {
			t.Errorf("%s%v = %v, Stats says %v", c.name, c.labels, got, c.want)
		}
	}
	// Nothing above is zero by accident: the workload made each of them.
	if s.Calls.New != 4 || s.Calls.Duplicates != 2 || s.Calls.InFlight != 1 || s.Calls.Commits != 3 || s.Calls.Releases != 1 || s.Calls.Lookups != 1 || s.Calls.Forgets != 1 || s.Queue.Groups == 0 {
		t.Errorf("Stats after the workload: %+v", s)
	}
	if fsyncs := value(t, fams, "tierdedup_wal_fsync_seconds", "engine", "t"); fsyncs == 0 || fsyncs > float64(s.Store.FsyncLatency.Count) {
		t.Errorf("%v fsyncs scraped, %d in Stats after", fsyncs, s.Store.FsyncLatency.Count)
	}
	if disk := value(t, fams, "tierdedup_disk_bytes", "engine", "t", "kind", "total"); disk <= 0 {
		t.Errorf("disk bytes %v", disk)
	}
}

// BenchmarkScrape measures one scrape of the default configuration's
// metrics: Stats (Pebble's metrics included), collection and encoding.
func BenchmarkScrape(b *testing.B) {
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(b.TempDir()), ExpectedKeys: 1000, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(promdedup.New(e, nil))
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	req := httptest.NewRequest("GET", "/metrics", nil)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatal(w.Code)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "scrapes/s")
}

// stepClock is a clock a test moves by hand.
type stepClock struct{ t atomic.Int64 }

func (c *stepClock) Now() time.Time { return time.Unix(0, c.t.Load()) }

// TestScrapeArchive: with an archive, its partitions, lag, keys, reads
// (hits and misses) and filter are scraped as Stats reports them.
func TestScrapeArchive(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clock := &stepClock{}
	clock.t.Store(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "s")), Clock: clock, Window: 2 * time.Hour, Partition: time.Hour,
		ExpectedKeys: 1000, Archive: pebble.ArchiveDir{Dir: filepath.Join(dir, "a")}, ArchiveWindow: 10 * time.Hour,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for h := 0; h < 5; h++ {
		for i := 0; i < 10; i++ {
			if _, err := e.MarkIfAbsent(ctx, fmt.Appendf(nil, "h%d-%d", h, i)); err != nil {
				t.Fatal(err)
			}
		}
		clock.t.Add(int64(time.Hour))
	}
	if _, err := e.MarkIfAbsent(ctx, []byte("now")); err != nil { // rotates into the last hour
		t.Fatal(err)
	}
	// Until the five closed hours are archived and Held, the partitions
	// the archive held as the archiver last listed them, counts them: the
	// scrape and Stats below must see the same figures.
	for deadline := time.Now().Add(20 * time.Second); e.Stats().Archive.Lag > 0 || e.Stats().Archive.Held < 5; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("archive lags: %+v", e.Stats().Archive)
		}
	}
	for i := 0; i < 10; i++ { // hour 0: past the window, in the archive
		if o, err := e.MarkIfAbsent(ctx, fmt.Appendf(nil, "h0-%d", i)); err != nil || o != engine.Duplicate {
			t.Fatalf("an archived key: %v, %v", o, err)
		}
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(promdedup.New(e, nil))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	fams := scrape(t, srv.URL)
	a := e.Stats().Archive
	if a.Hits < 10 || a.Held < 5 || a.Keys < 50 || a.FilterBytes == 0 {
		t.Fatalf("archive stats after the workload: %+v", a)
	}
	for _, c := range []struct {
		name   string
		labels []string
		want   float64
	}{
		{"tierdedup_archive_partitions", nil, float64(a.Held)},
		{"tierdedup_archive_lag_partitions", nil, float64(a.Lag)},
		{"tierdedup_archive_keys_total", nil, float64(a.Keys)},
		{"tierdedup_archive_reads_total", []string{"result", "hit"}, float64(a.Hits)},
		{"tierdedup_archive_reads_total", []string{"result", "miss"}, float64(a.Reads - a.Hits)},
		{"tierdedup_archive_lag_reads_total", nil, float64(a.LagReads)},
		{"tierdedup_archive_failures_total", nil, float64(a.Failures)},
		{"tierdedup_archive_filter_bytes", nil, float64(a.FilterBytes)},
		{"tierdedup_archive_log_entries", nil, 0}, // the embedded store keeps no log
		{"tierdedup_archive_drainer", nil, 0},
		{"tierdedup_archive_log_passes_total", nil, 0},
	} {
		if got := value(t, fams, c.name, c.labels...); got != c.want {
			t.Errorf("%s%v = %v, Stats says %v", c.name, c.labels, got, c.want)
		}
	}
}
