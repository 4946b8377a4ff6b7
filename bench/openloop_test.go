package bench

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestOpenLoop: at a rate the engine sustains, an open-loop run takes
// keys/rate and achieves the rate; offered far more than it can take, the
// same workload's batches wait, and their latency, measured from when each
// was due, grows with the run (a closed-loop measurement would not see
// the waiting at all).
func TestOpenLoop(t *testing.T) {
	w := WorkloadConfig{Keys: 40_000, DupRatio: 0.1, DupReach: time.Hour, Span: time.Hour, Seed: 5}
	rc := RunConfig{Workload: w, Engine: engine.Options{Tiers: engine.MemoryOnly}, Batch: 100, Workers: 4}
	ctx := context.Background()

	rc.Rate = 40_000 // a second of load
	light, err := Run(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	if light.Elapsed < 900*time.Millisecond || light.KeysPerSec > 1.1*rc.Rate || light.KeysPerSec < 0.7*rc.Rate {
		t.Fatalf("offered %v keys/s: %v keys/s over %v", rc.Rate, light.KeysPerSec, light.Elapsed)
	}
	rc.Rate = 1e10 // every batch due at once
	heavy, err := Run(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("light: p99 %v over %v; overloaded: p99 %v over %v", light.BatchLatency.P99, light.Elapsed, heavy.BatchLatency.P99, heavy.Elapsed)
	if heavy.BatchLatency.P99 < heavy.Elapsed/2 {
		t.Fatalf("overloaded: p99 %v, yet the last batches waited for most of the %v run", heavy.BatchLatency.P99, heavy.Elapsed)
	}
	for _, bad := range []float64{-1, math.NaN(), math.Inf(1), 1e12, 1e-12} {
		rc.Rate = bad
		if _, err := Run(ctx, rc); err == nil {
			t.Errorf("rate %v accepted: its schedule truncates or overflows, and the run would be closed-loop", bad)
		}
	}
	if light.Rate != 40_000 || heavy.Rate != 1e10 {
		t.Fatalf("results record rates %v and %v", light.Rate, heavy.Rate)
	}
	for _, r := range []*Result{light, heavy} {
		if err := r.Exactness(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSearchRate: a target no run can meet halves the offered rate at
// every step and finds nothing; a generous one finds a rate, whose p99 is
// within it.
func TestSearchRate(t *testing.T) {
	w := WorkloadConfig{Keys: 20_000, DupRatio: 0.1, DupReach: time.Hour, Span: time.Hour, Seed: 6}
	rc := RunConfig{Workload: w, Engine: engine.Options{Tiers: engine.MemoryOnly}, Batch: 100, Workers: 4}
	ctx := context.Background()
	s, err := SearchRate(ctx, rc, time.Nanosecond, 4)
	if err != nil {
		t.Fatal(err)
	}
	if s.Ceiling <= 0 || len(s.Tried) != 4 || s.Best.Rate != 0 {
		t.Fatalf("impossible target: ceiling %v, %d tried, best %+v", s.Ceiling, len(s.Tried), s.Best)
	}
	for i, p := range s.Tried {
		if p.OK {
			t.Fatalf("step %d met a 1ns p99: %+v", i, p)
		}
		if i > 0 && p.Rate != s.Tried[i-1].Rate/2 {
			t.Fatalf("step %d offered %v after %v: not bisecting down", i, p.Rate, s.Tried[i-1].Rate)
		}
	}
	s, err = SearchRate(ctx, rc, 10*time.Second, 4)
	if err != nil {
		t.Fatal(err)
	}
	if s.Best.Rate <= 0 || s.Best.Latency.P99 > 10*time.Second || !s.Best.OK {
		t.Fatalf("generous target: best %+v of %+v", s.Best, s.Tried)
	}
}
