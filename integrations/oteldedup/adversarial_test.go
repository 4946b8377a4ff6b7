package oteldedup_test

// Adversarial tests of oteldedup: each would fail if a promise of the
// package documentation (or engine.Tracer's) were broken.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/oteldedup"
	"github.com/tierdedup/tierdedup/integrations/promdedup"
)

// TestAdvSameAsPrometheusUnderLoad: collections of both exporters run
// while eight goroutines claim, commit, release, mark and Do on the
// engine (no race, no error); every counter point only grows from one
// OpenTelemetry collection to the next; once the load stops, every value
// of one exporter is the other's.
func TestAdvSameAsPrometheusUnderLoad(t *testing.T) {
	e := openEngine(t)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(promdedup.New(e, nil))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	r, err := oteldedup.Register(e, mp)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Unregister()

	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var ops atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k := []byte(fmt.Sprint("k-", g, "-", i%200))
				switch i % 4 {
				case 0:
					c, err := e.Claim(ctx, k)
					if err == nil && c.Outcome == engine.New {
						if i%8 == 0 {
							e.Release(ctx, c)
						} else {
							e.Commit(ctx, c)
						}
					}
				case 1:
					e.MarkIfAbsent(ctx, k)
				case 2:
					e.Do(ctx, k, func(context.Context) error { return nil })
				default:
					e.Lookup(ctx, k)
				}
				ops.Add(1)
			}
		}(g)
	}
	prev := map[point]float64{}
	kinds := map[string]string{}
	for c := 0; c < 40; c++ {
		got, insts := fromOTel(t, reader)
		for name, in := range insts {
			kinds[name] = in.kind
		}
		for p, v := range got {
			if k := kinds[p.name]; k != "gauge" && v < prev[p] {
				t.Errorf("collection %d: counter %v went back from %v to %v", c, p, prev[p], v)
			}
		}
		prev = got
		fromPrometheus(t, reg)
		time.Sleep(5 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	t.Logf("%d operations during 40 collections", ops.Load())

	var prom, otel map[point]float64
	for try := 0; ; try++ {
		prom, _ = fromPrometheus(t, reg)
		otel, _ = fromOTel(t, reader)
		again, _ := fromPrometheus(t, reg)
		if fmt.Sprint(prom) == fmt.Sprint(again) {
			break
		}
		if try == 50 {
			t.Fatal("the engine's Stats never stood still")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for p, v := range prom {
		if got, ok := otel[p]; !ok || got != v {
			t.Errorf("%v: %v in Prometheus, %v (%v) in OpenTelemetry", p, v, got, ok)
		}
	}
	for p, v := range otel {
		if _, ok := prom[p]; !ok {
			t.Errorf("%v: %v in OpenTelemetry, not in Prometheus", p, v)
		}
	}
	if prom[point{"tierdedup.claims", "outcome=new"}] == 0 {
		t.Error("the load claimed nothing")
	}
}

// TestAdvRegisterAroundClose: a collection after the engine closed, and a
// Register made after it, neither panic nor fail; Unregister twice is
// harmless.
func TestAdvRegisterAroundClose(t *testing.T) {
	e := openEngine(t)
	workload(t, e)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	r, err := oteldedup.Register(e, mp)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := fromOTel(t, reader)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := fromOTel(t, reader)
	if after[point{"tierdedup.claims", "outcome=new"}] != before[point{"tierdedup.claims", "outcome=new"}] {
		t.Errorf("claims{new} %v before Close, %v after", before[point{"tierdedup.claims", "outcome=new"}], after[point{"tierdedup.claims", "outcome=new"}])
	}
	if err := r.Unregister(); err != nil {
		t.Fatal(err)
	}
	if err := r.Unregister(); err != nil {
		t.Fatal(err)
	}
	r2, err := oteldedup.Register(e, mp)
	if err != nil {
		t.Fatalf("Register after Close: %v", err)
	}
	got, _ := fromOTel(t, reader)
	if got[point{"tierdedup.claims", "outcome=new"}] == 0 {
		t.Errorf("Register after Close reports no claims: %v", len(got))
	}
	r2.Unregister()
}

// lastSpan returns the last of the n spans ended, failing unless exactly n ended.
func lastSpan(t *testing.T, sr *tracetest.SpanRecorder, n int) sdktrace.ReadOnlySpan {
	t.Helper()
	ended := sr.Ended()
	if len(ended) != n {
		t.Fatalf("%d spans ended, want %d", len(ended), n)
	}
	return ended[n-1]
}

// TestAdvSpanEachOutcome: a span per Do/DoResult with the outcome the
// call returned, for every outcome Do can return: new, duplicate,
// in-flight, poison; and a call refused before a claim (a key too long)
// has no outcome, ran false and status Error.
func TestAdvSpanEachOutcome(t *testing.T) {
	ctx := context.Background()
	e, sr := tracedEngine(t, 1)
	ns, _ := e.Namespace("orders")
	ok := func(context.Context) error { return nil }
	n := 0
	check := func(what string, o engine.Outcome, err error, want string, ran bool, failed bool) {
		t.Helper()
		n++
		s := lastSpan(t, sr, n)
		a := attrs(s)
		got, has := a[oteldedup.AttrOutcome]
		if want == "" && has {
			t.Errorf("%s: outcome attribute %v, want none", what, got.Emit())
		}
		if want != "" && got.AsString() != want {
			t.Errorf("%s: outcome attribute %q, want %q (Do returned %v, %v)", what, got.AsString(), want, o, err)
		}
		if a[oteldedup.AttrRan].AsBool() != ran {
			t.Errorf("%s: ran %v, want %v", what, a[oteldedup.AttrRan].AsBool(), ran)
		}
		if a[oteldedup.AttrNamespace].AsString() != "orders" {
			t.Errorf("%s: namespace %q", what, a[oteldedup.AttrNamespace].AsString())
		}
		if (s.Status().Code == codes.Error) != failed {
			t.Errorf("%s: status %v, want error %v", what, s.Status(), failed)
		}
	}
	o, err := ns.Do(ctx, []byte("a"), ok)
	check("new", o, err, "new", true, false)
	o, err = ns.Do(ctx, []byte("a"), ok)
	check("duplicate", o, err, "duplicate", false, false)
	held, err := ns.Claim(ctx, []byte("b"))
	if err != nil || held.Outcome != engine.New {
		t.Fatal(err)
	}
	o, err = ns.Do(ctx, []byte("b"), ok)
	check("in-flight", o, err, "in-flight", false, false)
	e.Release(ctx, held) // MaxAttempts 1: b is now poison
	o, err = ns.Do(ctx, []byte("b"), ok)
	check("poison", o, err, "poison", false, false)
	boom := errors.New("boom")
	o, err = ns.Do(ctx, []byte("c"), func(context.Context) error { return boom })
	check("failing handler", o, err, "new", true, true)
	o, err = ns.Do(ctx, make([]byte, 1<<20), ok)
	if err == nil {
		t.Fatal("a 1 MiB key was accepted")
	}
	check("refused key", o, err, "", false, true)
}

// TestAdvSpanPanickingHandler: a handler that panics inside Do with a
// Tracer: the panic reaches the caller unchanged, the claim is given back
// (the key is New again), and the span ends exactly once, saying the claim
// answered new and the handler ran, and that the call did not succeed.
func TestAdvSpanPanickingHandler(t *testing.T) {
	ctx := context.Background()
	e, sr := tracedEngine(t, 0)
	var rec any
	func() {
		defer func() { rec = recover() }()
		e.Do(ctx, []byte("p"), func(context.Context) error { panic("handler bug") })
	}()
	if rec != "handler bug" {
		t.Fatalf("recovered %v, want the handler's panic", rec)
	}
	s := lastSpan(t, sr, 1)
	a := attrs(s)
	t.Logf("span after a panic: attributes %v, status %v, events %d", s.Attributes(), s.Status(), len(s.Events()))
	if a[oteldedup.AttrOutcome].AsString() != "new" {
		t.Errorf("outcome attribute %q, want \"new\": the claim answered New before the handler ran", a[oteldedup.AttrOutcome].AsString())
	}
	if !a[oteldedup.AttrRan].AsBool() {
		t.Error("ran false for a handler that ran")
	}
	if s.Status().Code != codes.Error {
		t.Errorf("status %v for a call that panicked, want Error", s.Status())
	}
	if o, err := e.Do(ctx, []byte("p"), func(context.Context) error { return nil }); err != nil || o != engine.New {
		t.Errorf("after the panic: %v, %v, want New (the claim given back)", o, err)
	}
	if n := len(sr.Ended()); n != 2 {
		t.Errorf("%d spans ended after two calls", n)
	}
}

// TestAdvSpanConcurrentDo: many goroutines Do the same keys with a Tracer:
// one span per call, each ended once, and exactly one "new" with ran
// true per key.
func TestAdvSpanConcurrentDo(t *testing.T) {
	ctx := context.Background()
	e, sr := tracedEngine(t, 0)
	const goroutines, per = 8, 200
	var wg sync.WaitGroup
	var runs atomic.Int64
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < per; i++ {
				e.Do(ctx, []byte(fmt.Sprint("k", i%50)), func(context.Context) error { runs.Add(1); return nil })
			}
		}()
	}
	wg.Wait()
	ended := sr.Ended()
	if len(ended) != goroutines*per {
		t.Fatalf("%d spans for %d calls", len(ended), goroutines*per)
	}
	ranTrue := 0
	for _, s := range ended {
		a := attrs(s)
		if a[oteldedup.AttrRan].AsBool() {
			ranTrue++
			if a[oteldedup.AttrOutcome].AsString() != "new" {
				t.Errorf("ran with outcome %q", a[oteldedup.AttrOutcome].AsString())
			}
		}
	}
	if int64(ranTrue) != runs.Load() || ranTrue != 50 {
		t.Errorf("%d spans say ran, %d handlers ran, want 50", ranTrue, runs.Load())
	}
}
