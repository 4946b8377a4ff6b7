package oteldedup_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/oteldedup"
	"github.com/tierdedup/tierdedup/integrations/promdedup"
	"github.com/tierdedup/tierdedup/internal/statsmetrics"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

// fixedClock is a clock that stands still: the window's coverage does not
// move between two reads.
type fixedClock struct{ t atomic.Int64 }

func (c *fixedClock) Now() time.Time { return time.Unix(0, c.t.Load()) }

// openEngine opens an embedded engine with an archive: every metric of
// the set has a point.
func openEngine(t testing.TB) *engine.Engine {
	t.Helper()
	dir := t.TempDir()
	clock := &fixedClock{}
	clock.t.Store(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(filepath.Join(dir, "s")), ExpectedKeys: 1000, Clock: clock, Logger: quietEngine,
		Window: 2 * time.Hour, Partition: time.Hour,
		Archive: pebble.ArchiveDir{Dir: filepath.Join(dir, "a")}, ArchiveWindow: 10 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	return e
}

// workload makes the engine count claims of each kind, commits,
// duplicates, releases, lookups and forgets.
func workload(t *testing.T, e *engine.Engine) {
	t.Helper()
	ctx := context.Background()
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
	for _, k := range []string{"a", "b", "d", "e"} {
		if _, err := e.MarkIfAbsent(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if o, err := e.Do(ctx, []byte("a"), func(context.Context) error { return nil }); err != nil || o != engine.Duplicate {
		t.Fatalf("Do of a committed key: %v, %v", o, err)
	}
	if _, err := e.Do(ctx, []byte("f"), func(context.Context) error { return errors.New("no") }); err == nil {
		t.Fatal("a failing handler's Do returned nil")
	}
	for _, k := range []string{"a", "zz"} {
		if _, err := e.Lookup(ctx, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := e.Forget(ctx, []byte("b")); err != nil {
		t.Fatal(err)
	}
}

// point names one value: an instrument (OpenTelemetry's name) and its
// attributes, sorted.
type point struct{ name, attrs string }

func (p point) String() string { return p.name + "{" + p.attrs + "}" }

func attrString(kvs []string) string {
	sort.Strings(kvs)
	return strings.Join(kvs, ",")
}

// fromPrometheus gathers reg and names every value by the instrument
// OpenTelemetry exports it as, going through the shared table: a
// histogram gives its sum and its count.
func fromPrometheus(t *testing.T, reg *prometheus.Registry) (map[point]float64, map[string]bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range fams {
		byName[f.GetName()] = f
	}
	got, seen := map[point]float64{}, map[string]bool{}
	for _, m := range statsmetrics.Metrics {
		f, ok := byName["tierdedup_"+m.Name]
		if !ok {
			continue
		}
		seen[m.Name] = true
		delete(byName, "tierdedup_"+m.Name)
		for _, pm := range f.Metric {
			var kvs []string
			for _, l := range pm.Label {
				kvs = append(kvs, l.GetName()+"="+l.GetValue())
			}
			attrs := attrString(kvs)
			switch m.Kind {
			case statsmetrics.Counter:
				got[point{m.OTel, attrs}] = pm.GetCounter().GetValue()
			case statsmetrics.Gauge:
				got[point{m.OTel, attrs}] = pm.GetGauge().GetValue()
			case statsmetrics.Histogram:
				got[point{m.OTel + ".sum", attrs}] = pm.GetHistogram().GetSampleSum()
				got[point{m.OTel + ".count", attrs}] = float64(pm.GetHistogram().GetSampleCount())
			}
		}
	}
	for name := range byName {
		t.Errorf("Prometheus exports %s, which the table does not hold", name)
	}
	return got, seen
}

// instrument is what OpenTelemetry says of one instrument.
type instrument struct {
	description, unit, kind string
}

// fromOTel collects reader and returns every value of this package's
// scope, and each instrument's description, unit and kind.
func fromOTel(t *testing.T, reader *sdkmetric.ManualReader) (map[point]float64, map[string]instrument) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got, insts := map[point]float64{}, map[string]instrument{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != oteldedup.ScopeName {
			t.Errorf("scope %q", sm.Scope.Name)
			continue
		}
		for _, m := range sm.Metrics {
			add := func(kind string, set attribute.Set, v float64) {
				var kvs []string
				for _, kv := range set.ToSlice() {
					kvs = append(kvs, string(kv.Key)+"="+kv.Value.Emit())
				}
				got[point{m.Name, attrString(kvs)}] = v
				insts[m.Name] = instrument{m.Description, m.Unit, kind}
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
					t.Errorf("%s: monotonic %v, temporality %v", m.Name, d.IsMonotonic, d.Temporality)
				}
				for _, dp := range d.DataPoints {
					add("int counter", dp.Attributes, float64(dp.Value))
				}
			case metricdata.Sum[float64]:
				if !d.IsMonotonic || d.Temporality != metricdata.CumulativeTemporality {
					t.Errorf("%s: monotonic %v, temporality %v", m.Name, d.IsMonotonic, d.Temporality)
				}
				for _, dp := range d.DataPoints {
					add("float counter", dp.Attributes, dp.Value)
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					add("gauge", dp.Attributes, dp.Value)
				}
			default:
				t.Errorf("%s: data %T", m.Name, m.Data)
			}
		}
	}
	return got, insts
}

// TestSameAsPrometheus: on one engine, after a workload, every value the
// Prometheus collector exports is an OpenTelemetry instrument's point
// (same attributes, same value), and every point is one of them; each
// instrument has its metric's help and unit. It goes through the shared
// table, so a metric added to it later is checked too: and every metric
// of the table has a point in this configuration.
func TestSameAsPrometheus(t *testing.T) {
	e := openEngine(t)
	workload(t, e)

	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(promdedup.New(e, prometheus.Labels{"engine": "t"}))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	r, err := oteldedup.Register(e, mp, oteldedup.WithAttributes(attribute.String("engine", "t")))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unregister()

	// The engine is idle and its clock stands still, but Pebble may still
	// finish background work (a file's blocks as the OS counts them change
	// while it is written): compare a collection made between two equal
	// scrapes, trying again while a value moved between them.
	var prom, otel map[point]float64
	var seen map[string]bool
	var insts map[string]instrument
	for try := 0; ; try++ {
		var again map[point]float64
		prom, seen = fromPrometheus(t, reg)
		otel, insts = fromOTel(t, reader)
		again, _ = fromPrometheus(t, reg)
		if fmt.Sprint(prom) == fmt.Sprint(again) && samePoints(prom, otel) {
			break
		}
		if try == 50 {
			if fmt.Sprint(prom) != fmt.Sprint(again) {
				t.Fatalf("the engine's Stats never stood still:\n%v\n%v", prom, again)
			}
			break // the differences are reported below
		}
		time.Sleep(20 * time.Millisecond)
	}

	t.Logf("%d values compared", len(prom))
	for _, m := range statsmetrics.Metrics {
		if !seen[m.Name] {
			t.Errorf("tierdedup_%s has no point in this configuration: make the test's engine have one", m.Name)
		}
		want := map[string]instrument{m.OTel: {m.Help, m.Unit, "gauge"}}
		switch m.Kind {
		case statsmetrics.Counter:
			want[m.OTel] = instrument{m.Help, m.Unit, "int counter"}
		case statsmetrics.Histogram:
			want = map[string]instrument{
				m.OTel + ".sum":   {m.Help + " Sum of the observations.", m.Unit, "float counter"},
				m.OTel + ".count": {m.Help + " Count of the observations.", m.CountUnit, "int counter"},
			}
		}
		for name, w := range want {
			if got, ok := insts[name]; !ok || got != w {
				t.Errorf("instrument %s is %+v, want %+v", name, got, w)
			}
		}
	}
	for p, v := range prom {
		got, ok := otel[p]
		switch {
		case !ok:
			t.Errorf("%v: %v in Prometheus, no OpenTelemetry point", p, v)
		case got != v:
			t.Errorf("%v: %v in Prometheus, %v in OpenTelemetry", p, v, got)
		}
	}
	for p, v := range otel {
		if _, ok := prom[p]; !ok {
			t.Errorf("%v: %v in OpenTelemetry, not in Prometheus", p, v)
		}
	}
	// The workload made the values compared: not zeros on both sides.
	for _, c := range []struct {
		p    point
		want float64
	}{
		{point{"tierdedup.claims", "engine=t,outcome=new"}, 6},
		{point{"tierdedup.claims", "engine=t,outcome=duplicate"}, 3},
		{point{"tierdedup.claims", "engine=t,outcome=in_flight"}, 1},
		{point{"tierdedup.releases", "engine=t"}, 2},
		{point{"tierdedup.lookups", "engine=t"}, 2},
		{point{"tierdedup.forgets", "engine=t"}, 1},
		{point{"tierdedup.bloom.state", "engine=t,state=warm"}, 1},
		{point{"tierdedup.window.duration", "engine=t"}, 7200},
	} {
		if got := otel[c.p]; got != c.want {
			t.Errorf("%v = %v, want %v", c.p, got, c.want)
		}
	}
	for _, name := range []string{"tierdedup.commits", "tierdedup.commit.batch.duration.count", "tierdedup.commit.batch.duration.sum", "tierdedup.wal.fsync.duration.count"} {
		if otel[point{name, "engine=t"}] <= 0 {
			t.Errorf("%s = %v after commits", name, otel[point{name, "engine=t"}])
		}
	}
}

// TestDocMapping: the package documentation's table names every metric
// with its instrument and unit.
func TestDocMapping(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(strings.TrimPrefix(line, "//"))
		if len(f) >= 3 && strings.HasPrefix(f[0], "tierdedup_") {
			name, _, _ := strings.Cut(f[0], "{")
			if len(f) == 4 { // a histogram's (sum) or (count)
				name += " " + f[1]
				f = slices.Delete(f, 1, 2)
			}
			rows[name] = f
		}
	}
	for _, m := range statsmetrics.Metrics {
		labels := ""
		if len(m.Labels) > 0 {
			labels = "{" + strings.Join(m.Labels, ",") + "}"
		}
		want := map[string][]string{"tierdedup_" + m.Name: {"tierdedup_" + m.Name + labels, m.OTel, m.Unit}}
		if m.Kind == statsmetrics.Histogram {
			want = map[string][]string{
				"tierdedup_" + m.Name + " (sum)":   {"tierdedup_" + m.Name, m.OTel + ".sum", m.Unit},
				"tierdedup_" + m.Name + " (count)": {"tierdedup_" + m.Name, m.OTel + ".count", m.CountUnit},
			}
		}
		for row, w := range want {
			if got := rows[row]; !slices.Equal(got, w) {
				t.Errorf("doc.go's row of %s is %q, want %q", row, got, w)
			}
			delete(rows, row)
		}
	}
	for row := range rows {
		t.Errorf("doc.go has a row of %s, which the table does not hold", row)
	}
}

// TestUnregister: after Unregister, a collection reports nothing of the
// engine; a second Unregister is harmless. A nil provider registers
// nothing.
func TestUnregister(t *testing.T) {
	e := openEngine(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	r, err := oteldedup.Register(e, mp)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := fromOTel(t, reader); len(got) == 0 {
		t.Fatal("no points while registered")
	}
	if err := r.Unregister(); err != nil {
		t.Fatal(err)
	}
	if err := r.Unregister(); err != nil {
		t.Fatal(err)
	}
	if got, _ := fromOTel(t, reader); len(got) != 0 {
		t.Errorf("%d points after Unregister", len(got))
	}

	r, err = oteldedup.Register(e, nil)
	if err != nil || r.Unregister() != nil {
		t.Fatalf("a nil provider: %v", err)
	}
	if _, err := oteldedup.Register(nil, mp); err == nil {
		t.Error("Register of a nil engine succeeded")
	}
}

// BenchmarkCollect measures one collection of the default
// configuration's metrics: Stats (Pebble's metrics included) and
// observing every instrument.
func BenchmarkCollect(b *testing.B) {
	e := openEngine(b)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	if _, err := oteldedup.Register(e, mp); err != nil {
		b.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	b.ReportAllocs()
	for b.Loop() {
		if err := reader.Collect(context.Background(), &rm); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "collections/s")
}

// samePoints reports whether a and b hold the same points with the same
// values.
func samePoints(a, b map[point]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for p, v := range a {
		if w, ok := b[p]; !ok || w != v {
			return false
		}
	}
	return true
}
