package oteldedup_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/oteldedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// attrs returns a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestSpans: Do (New, its handler's span a child; Duplicate; a failing
// handler), DoResult (New, Duplicate), a namespace's Do and a call that
// fails before a claim each end one span, named for the call, with its
// namespace, outcome and whether the handler ran; a failure has status
// Error and the error recorded.
func TestSpans(t *testing.T) {
	ctx := context.Background()
	e, sr := tracedEngine(t, 0)

	var inner trace.SpanContext
	if _, err := e.Do(ctx, []byte("a"), func(ctx context.Context) error {
		_, s := trace.SpanFromContext(ctx).TracerProvider().Tracer("handler").Start(ctx, "charge")
		inner = s.SpanContext()
		s.End()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if o, err := e.Do(ctx, []byte("a"), func(context.Context) error { t.Error("a duplicate ran"); return nil }); err != nil || o != engine.Duplicate {
		t.Fatalf("%v, %v", o, err)
	}
	boom := errors.New("card declined")
	if _, err := e.Do(ctx, []byte("b"), func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if _, _, err := e.DoResult(ctx, []byte("c"), func(context.Context) ([]byte, error) { return []byte("r"), nil }); err != nil {
		t.Fatal(err)
	}
	if o, r, err := e.DoResult(ctx, []byte("c"), func(context.Context) ([]byte, error) { return nil, nil }); err != nil || o != engine.Duplicate || string(r) != "r" {
		t.Fatalf("%v %q %v", o, r, err)
	}
	ns, err := e.Namespace("orders")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ns.Do(ctx, []byte("a"), func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Do(ctx, nil, func(context.Context) error { return nil }); err == nil {
		t.Fatal("an empty key was claimed")
	}

	type want struct {
		name, ns, outcome string
		ran, failed       bool
	}
	wants := []want{
		{"tierdedup.Do", "", "new", true, false},
		{"tierdedup.Do", "", "duplicate", false, false},
		{"tierdedup.Do", "", "new", true, true},
		{"tierdedup.DoResult", "", "new", true, false},
		{"tierdedup.DoResult", "", "duplicate", false, false},
		{"tierdedup.Do", "orders", "new", true, false},
		{"tierdedup.Do", "", "", false, true}, // failed before a claim: no outcome
	}
	var spans []sdktrace.ReadOnlySpan
	var charge sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		if s.Name() == "charge" {
			charge = s
			continue
		}
		spans = append(spans, s)
	}
	if len(spans) != len(wants) || charge == nil {
		t.Fatalf("%d spans, want %d, and the handler's", len(spans), len(wants))
	}
	if p, do := charge.Parent(), spans[0].SpanContext(); p.SpanID() != do.SpanID() || p.TraceID() != do.TraceID() || !charge.SpanContext().Equal(inner) {
		t.Errorf("the handler's span's parent is %v, want the Do span %v", p, do)
	}
	for i, w := range wants {
		s := spans[i]
		a := attrs(s)
		if s.Name() != w.name || s.SpanKind() != trace.SpanKindInternal {
			t.Errorf("span %d: %s (%v), want %s", i, s.Name(), s.SpanKind(), w.name)
		}
		if ns, ok := a[oteldedup.AttrNamespace]; !ok || ns.AsString() != w.ns {
			t.Errorf("span %d: namespace %v, want %q", i, ns.Emit(), w.ns)
		}
		if o, ok := a[oteldedup.AttrOutcome]; ok != (w.outcome != "") || o.AsString() != w.outcome {
			t.Errorf("span %d: outcome %q (%v), want %q", i, o.Emit(), ok, w.outcome)
		}
		if ran, ok := a[oteldedup.AttrRan]; !ok || ran.AsBool() != w.ran {
			t.Errorf("span %d: ran %v, want %v", i, ran.Emit(), w.ran)
		}
		events := s.Events()
		if w.failed {
			if s.Status().Code != codes.Error || len(events) != 1 || events[0].Name != "exception" {
				t.Errorf("span %d: status %v, events %v; want Error and the error recorded", i, s.Status(), events)
			}
		} else if s.Status().Code != codes.Unset || len(events) != 0 {
			t.Errorf("span %d: status %v, events %v", i, s.Status(), events)
		}
	}
	if got := spans[2].Status().Description; got != boom.Error() {
		t.Errorf("the failed span's status says %q", got)
	}
}

// TestNilTracerProvider: a nil provider is no Tracer at all, not a Tracer
// holding nil, so the engine makes no call.
func TestNilTracerProvider(t *testing.T) {
	if tr := oteldedup.Tracer(nil); tr != nil {
		t.Fatalf("Tracer(nil) = %#v", tr)
	}
}

// BenchmarkDo measures Do of a duplicate without a Tracer, with a no-op
// provider's, and with an SDK provider's, sampling none or every span
// (exported nowhere): the cost of tracing a call.
func BenchmarkDo(b *testing.B) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		tr   engine.Tracer
	}{
		{"none", nil},
		{"noop", oteldedup.Tracer(noop.NewTracerProvider())},
		{"sdk-never-sample", oteldedup.Tracer(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())))},
		{"sdk-sampled", oteldedup.Tracer(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample())))},
	} {
		b.Run(c.name, func(b *testing.B) {
			e, err := engine.Open(&engine.Options{Backend: embedded.Dir(b.TempDir()), ExpectedKeys: 1000, Logger: quietEngine, Tracer: c.tr})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			key := []byte("k")
			fn := func(context.Context) error { return nil }
			if _, err := e.Do(ctx, key, fn); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if o, err := e.Do(ctx, key, fn); err != nil || o != engine.Duplicate {
					b.Fatal(o, err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
}

// tracedEngine opens an embedded engine whose Do and DoResult spans go to
// the recorder it returns; maxAttempts is Options.MaxAttempts. Both are
// closed when the test ends.
func tracedEngine(t *testing.T, maxAttempts int) (*engine.Engine, *tracetest.SpanRecorder) {
	t.Helper()
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, Logger: quietEngine, MaxAttempts: maxAttempts, Tracer: oteldedup.Tracer(tp)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, sr
}
