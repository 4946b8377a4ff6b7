package oteldedup_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"sort"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/oteldedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// Example registers an engine's metrics with a MeterProvider (here one
// read by hand; a program gives it a periodic reader and an exporter)
// and reads the claims back once.
func Example() {
	dir, _ := os.MkdirTemp("", "dedup")
	defer os.RemoveAll(dir)
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close()

	reader := sdkmetric.NewManualReader()
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer provider.Shutdown(context.Background())
	reg, err := oteldedup.Register(dedup, provider, oteldedup.WithAttributes(attribute.String("engine", "orders")))
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Unregister() // before the engine closes

	ctx := context.Background()
	for _, id := range []string{"order-1", "order-2", "order-1"} {
		if _, err := dedup.MarkIfAbsent(ctx, []byte(id)); err != nil {
			log.Fatal(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "tierdedup.claims" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				outcome, _ := p.Attributes.Value("outcome")
				lines = append(lines, fmt.Sprintf("%s %s{outcome=%s} %d", m.Name, m.Unit, outcome.AsString(), p.Value))
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// tierdedup.claims {key}{outcome=conflict} 0
	// tierdedup.claims {key}{outcome=duplicate} 1
	// tierdedup.claims {key}{outcome=in_flight} 0
	// tierdedup.claims {key}{outcome=new} 2
	// tierdedup.claims {key}{outcome=poison} 0
	// tierdedup.claims {key}{outcome=stale} 0
}

// ExampleTracer gives an engine a Tracer: each Do is a span, and the
// handler's own spans are its children.
func ExampleTracer() {
	dir, _ := os.MkdirTemp("", "dedup")
	defer os.RemoveAll(dir)
	spans := tracetest.NewSpanRecorder() // a program gives a batcher and an exporter
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer provider.Shutdown(context.Background())
	dedup, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), ExpectedKeys: 1000, Tracer: oteldedup.Tracer(provider)})
	if err != nil {
		log.Fatal(err)
	}
	defer dedup.Close()

	ctx := context.Background()
	for range 2 {
		_, err := dedup.Do(ctx, []byte("order-1"), func(ctx context.Context) error {
			_, span := provider.Tracer("shop").Start(ctx, "charge card")
			defer span.End()
			return nil
		})
		if err != nil {
			log.Fatal(err)
		}
	}
	for _, s := range spans.Ended() {
		fmt.Print(s.Name())
		for _, kv := range s.Attributes() {
			fmt.Printf(" %s=%s", kv.Key, kv.Value.Emit())
		}
		if s.Parent().IsValid() {
			fmt.Print(" (child of a span)")
		}
		fmt.Println()
	}
	// Output:
	// charge card (child of a span)
	// tierdedup.Do tierdedup.namespace= tierdedup.outcome=new tierdedup.ran=true
	// tierdedup.Do tierdedup.namespace= tierdedup.outcome=duplicate tierdedup.ran=false
}
