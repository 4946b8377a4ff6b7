package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// lockedBuffer is a log destination the engine may write from any
// goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// markN marks n new keys prefix-0 … prefix-(n-1) in batches, moving clock
// on by step a key, and fails the test unless every one is New.
func markN(t *testing.T, e *engine.Engine, clock *fakeClock, step time.Duration, prefix string, n int) {
	t.Helper()
	const batch = 512
	keys := make([][]byte, batch)
	out := make([]engine.Outcome, batch)
	for i := 0; i < n; i += batch {
		m := min(batch, n-i)
		for j := range m {
			keys[j] = fmt.Appendf(keys[j][:0], "%s-%d", prefix, i+j)
		}
		if err := e.MarkBatch(context.Background(), keys[:m], nil, out[:m]); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Duration(m) * step)
		for j := range m {
			if out[j] != engine.New {
				t.Fatalf("%s: %v, want New", keys[j], out[j])
			}
		}
	}
}

// TestFilterFalsePositivesMeasured: with ExpectedKeys ten times too low, a
// partition's filter holds 100,000 keys sized for 10,000. New keys marked
// in the next partition (three measuring generations of them) are probed
// against it, and every "maybe" the store
// overturns is a measured false positive: the rate reported is within 20 %
// of the formula's for the keys it holds, and the warning, logged once for
// each partition as soon as its rate is measurably over twice its target,
// names ExpectedKeys 100,000: the keys projected to the partition's end.
// Ten times too low saturates the filter (a rate near 1); twice too low
// checks the measure where the formula's rate is far from both ends. With
// ExpectedKeys right, nothing is reported.
func TestFilterFalsePositivesMeasured(t *testing.T) {
	const full, probes = 100_000, 3 * bloom.MeasureGeneration
	for _, tc := range []struct {
		name     string
		expected int
		warn     bool
	}{
		{"ten times too low", full / 10, true},
		{"twice too low", full / 2, true},
		{"sized right", full, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newClock()
			var logs lockedBuffer
			e, err := engine.Open(&engine.Options{
				Backend: &embedded.Backend{Dir: t.TempDir(), NoSync: true}, Window: 2 * time.Hour, Partition: time.Hour, ExpectedKeys: tc.expected,
				Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			// 100,000 keys an hour, spread over each partition: the first
			// full, the next (where the probes go) nearly so.
			step := time.Hour / full
			markN(t, e, clock, step, "old", full)
			markN(t, e, clock, step, "new", probes)

			s := e.Stats()
			if len(s.Bloom.Partitions) != 2 {
				t.Fatalf("%d partitions reported, want 2: %+v", len(s.Bloom.Partitions), s.Bloom.Partitions)
			}
			p := s.Bloom.Partitions[0]
			t.Logf("full partition: %d keys, %d of %d new keys overturned: measured %.4g, formula %.4g, target %.4g; current: %+v",
				p.Keys, p.FalsePositives, p.Checked, p.MeasuredFP, p.EstimatedFP, p.TargetFP, s.Bloom.Partitions[1])
			// Measured over the last generation or two of checks: all of
			// them made after the partition was full.
			if p.Keys != full || p.Checked < bloom.MeasureGeneration || p.Checked > probes {
				t.Fatalf("full partition: %d keys and %d checked, want %d and %d to %d", p.Keys, p.Checked, full, bloom.MeasureGeneration, probes)
			}
			// The false positives among the checks are a binomial count
			// (Poisson-like: deviation √n): within four deviations of the
			// formula's expectation, a band that fails about once in
			// 16,000 runs of correct code, where ±20 % (about two
			// deviations when sized right, 89 expected) failed one run in
			// 20. A measure that is off by a factor (a lifetime average,
			// half the rate) fails the first two cases by tens of
			// deviations.
			want := p.EstimatedFP * float64(p.Checked)
			if d := math.Abs(float64(p.FalsePositives) - want); d > 4*math.Sqrt(want)+1 {
				t.Errorf("%d false positives in %d checks, the formula expects %.1f: %.1f deviations off, want at most 4", p.FalsePositives, p.Checked, want, d/math.Sqrt(want))
			}
			if s.Bloom.FalsePositives < p.FalsePositives {
				t.Errorf("engine counts %d false positives, fewer than one partition's %d", s.Bloom.FalsePositives, p.FalsePositives)
			}
			// One warning a partition, each naming the ExpectedKeys its
			// keys projected to the partition's end ask for: 100,000.
			warnings := strings.Count(logs.String(), "set ExpectedKeys to 100000 to restore")
			if !tc.warn {
				if p.OverTarget || s.Bloom.RecommendedExpectedKeys != 0 || s.Bloom.OverTarget != 0 || logs.String() != "" {
					t.Errorf("a filter sized right was reported over its target: %+v, recommended %d, log %q", p, s.Bloom.RecommendedExpectedKeys, logs.String())
				}
				return
			}
			if !p.OverTarget || p.RecommendedExpectedKeys != full || s.Bloom.RecommendedExpectedKeys != full {
				t.Errorf("over target %v, recommended %d (engine %d): want true and %d", p.OverTarget, p.RecommendedExpectedKeys, s.Bloom.RecommendedExpectedKeys, full)
			}
			if warnings != 2 || s.Bloom.OverTarget != 2 {
				t.Errorf("%d warnings naming ExpectedKeys 100000 (%d counted), want 2; log:\n%s", warnings, s.Bloom.OverTarget, logs.String())
			}
			t.Logf("log:\n%s", logs.String())
		})
	}
}

// TestFilterOverfullBloomOnly: bloom-only has no store to tell a false
// positive, so its filters are judged by the formula from their keys. With
// ExpectedKeys ten times too low, the partition is reported over its target
// once, as soon as its keys put the formula's rate past twice the target,
// with ExpectedKeys 100,000 (its keys projected to the partition's end).
func TestFilterOverfullBloomOnly(t *testing.T) {
	const full = 100_000
	clock := newClock()
	var logs lockedBuffer
	e, err := engine.Open(&engine.Options{Backend: &embedded.Backend{},
		Tiers: engine.BloomOnly, Window: 2 * time.Hour, Partition: time.Hour, ExpectedKeys: full / 10,
		Clock: clock, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// Every key New until the filter is overfull: a bloom-only maybe is a
	// Duplicate, so mark only as many as stay under the warning's point.
	step := time.Hour / full
	keys := make([][]byte, 1)
	out := make([]engine.Outcome, 1)
	for i := 0; i < full && !strings.Contains(logs.String(), "restore"); i++ {
		keys[0] = fmt.Appendf(keys[0][:0], "k-%d", i)
		if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
			t.Fatal(err)
		}
		clock.Add(step)
	}
	s := e.Stats()
	t.Logf("%+v\nlog: %s", s.Bloom.Partitions, logs.String())
	if len(s.Bloom.Partitions) != 1 {
		t.Fatalf("%d partitions, want 1", len(s.Bloom.Partitions))
	}
	p := s.Bloom.Partitions[0]
	if !p.OverTarget || p.Checked != 0 || p.EstimatedFP <= 2*p.TargetFP || p.EstimatedFP > 3*p.TargetFP {
		t.Errorf("partition %+v: want over target, nothing checked, the formula's rate just past twice the target", p)
	}
	if n := strings.Count(logs.String(), "set ExpectedKeys to 100000 to restore"); n != 1 || s.Bloom.OverTarget != 1 || s.Bloom.RecommendedExpectedKeys != full {
		t.Errorf("%d warnings naming 100000 (%d counted, recommended %d), want 1; log: %s", n, s.Bloom.OverTarget, s.Bloom.RecommendedExpectedKeys, logs.String())
	}
	// Later keys do not warn again.
	for i := range 1000 {
		keys[0] = fmt.Appendf(keys[0][:0], "later-%d", i)
		if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
			t.Fatal(err)
		}
	}
	if n := strings.Count(logs.String(), "tierdedup: Bloom filter"); n != 1 {
		t.Errorf("%d warnings after more keys, want still 1", n)
	}
}
