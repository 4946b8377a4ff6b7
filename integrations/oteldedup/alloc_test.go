//go:build !race

package oteldedup_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace/noop"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/integrations/oteldedup"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestDoAllocsWithoutTracer: without a Tracer (Tracer of a nil
// provider), Do of a duplicate allocates what the Claim it makes does,
// nothing more: the hook costs a comparison. With one, even a no-op
// provider's, the measure sees the span's cost.
func TestDoAllocsWithoutTracer(t *testing.T) {
	ctx := context.Background()
	allocs := func(tr engine.Tracer) (claim, do float64) {
		e, err := engine.Open(&engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1000, Logger: quietEngine, Tracer: tr})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		key := []byte("k")
		fn := func(context.Context) error { return nil }
		if _, err := e.Do(ctx, key, fn); err != nil {
			t.Fatal(err)
		}
		claim = testing.AllocsPerRun(200, func() {
			if c, err := e.Claim(ctx, key); err != nil || c.Outcome != engine.Duplicate {
				t.Fatal(c.Outcome, err)
			}
		})
		do = testing.AllocsPerRun(200, func() {
			if o, err := e.Do(ctx, key, fn); err != nil || o != engine.Duplicate {
				t.Fatal(o, err)
			}
		})
		return claim, do
	}
	claim, do := allocs(oteldedup.Tracer(nil))
	t.Logf("allocations: Claim %v, Do without a Tracer %v", claim, do)
	if do != claim {
		t.Errorf("Do without a Tracer allocates %v, its Claim %v", do, claim)
	}
	claim, do = allocs(oteldedup.Tracer(noop.NewTracerProvider()))
	t.Logf("allocations: Claim %v, Do with a no-op provider's Tracer %v", claim, do)
	if do <= claim {
		t.Errorf("Do with a Tracer allocates %v, its Claim %v: the measure sees nothing", do, claim)
	}
}
