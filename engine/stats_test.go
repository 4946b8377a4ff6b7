package engine_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestStatsCountFalsePositives overfills small Bloom filters, then claims
// keys never seen: every one is New, each either proved new by the filters
// (BloomNegatives) or read from Pebble and overturned (BloomFalsePositives),
// and nothing else is counted as a false positive — not the duplicates that
// Pebble confirms after memory forgot them.
func TestStatsCountFalsePositives(t *testing.T) {
	ctx := context.Background()
	e := open(t, engine.Options{Backend: &embedded.Backend{Dir: "db", FS: vfs.NewMem()}, ExpectedKeys: 100, FalsePositive: 0.3, MemoryCapacity: 16, Stripes: 1})
	defer e.Close()
	const marked, fresh = 300, 2000
	keys := make([][]byte, marked)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "marked-%d", i)
	}
	out := make([]engine.Outcome, marked)
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	before := e.Stats()
	for i := range fresh {
		c, err := e.Claim(ctx, fmt.Appendf(nil, "fresh-%d", i))
		if err != nil || c.Outcome != engine.New {
			t.Fatalf("fresh key %d = %v, %v", i, c.Outcome, err)
		}
	}
	mid := e.Stats()
	fp, neg := mid.Bloom.FalsePositives-before.Bloom.FalsePositives, mid.Bloom.Negatives-before.Bloom.Negatives
	reads := mid.Store.Reads - before.Store.Reads
	if fp+neg != fresh || reads != fp {
		t.Fatalf("%d fresh keys: %d false positives + %d negatives, %d store reads", fresh, fp, neg, reads)
	}
	if fp == 0 || fp == fresh {
		t.Fatalf("overfilled filters gave %d false positives in %d: the counter is not measuring", fp, fresh)
	}
	rate := float64(fp) / fresh
	t.Logf("measured false-positive rate %.3f (filters %d× over capacity, estimated %.3f)", rate, marked/100, mid.Bloom.EstimatedFP)
	// The estimate is the formula's for the number of keys added; a filter
	// this small fills unevenly around it, with a random secret each run
	// (measured over 40 runs: 0.478 to 0.602 against 0.531). A counter that
	// missed or double-counted would be far outside this.
	if d := rate - mid.Bloom.EstimatedFP; d > 0.12 || d < -0.12 {
		t.Fatalf("measured false-positive rate %.3f, the filters' own estimate %.3f", rate, mid.Bloom.EstimatedFP)
	}

	// Duplicates that memory evicted are found in Pebble: hits, not false
	// positives.
	claims := make([]engine.Claim, 200)
	if err := e.ClaimBatch(ctx, keys[:200], nil, claims); err != nil {
		t.Fatal(err)
	}
	after := e.Stats()
	if after.Bloom.FalsePositives != mid.Bloom.FalsePositives || after.Store.Hits-mid.Store.Hits < 150 {
		t.Fatalf("duplicates read from Pebble: false positives %d → %d, store hits +%d", mid.Bloom.FalsePositives, after.Bloom.FalsePositives, after.Store.Hits-mid.Store.Hits)
	}
}

// TestStatsCoverage: Coverage is how much of the window the engine holds:
// since the store was created (surviving a restart) in the default
// configuration, since Open in memory-only, never more than the window,
// and a clock stepping back does not shrink it.
func TestStatsCoverage(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewMem()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	m := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour})
	defer m.Close()
	check := func(e *engine.Engine, want time.Duration) {
		t.Helper()
		if _, err := e.MarkIfAbsent(ctx, []byte("tick")); err != nil {
			t.Fatal(err)
		}
		if got := e.Stats().Coverage; got != want {
			t.Fatalf("%v: Coverage = %v, want %v", e.Stats().Tiers, got, want)
		}
	}
	created := e.Stats().Coverage
	if created != 0 {
		t.Fatalf("a new store covers %v", created)
	}
	clock.Add(90 * time.Minute)
	check(m, 90*time.Minute)
	clock.Add(-30 * time.Minute) // a step back shrinks nothing
	check(m, 90*time.Minute)
	_ = e.Close()
	e = open(t, o)
	defer e.Close()
	if got := e.Stats().Coverage; got != time.Hour {
		t.Fatalf("after a restart the store covers %v, want the hour since it was created (the clock reads +60 min)", got)
	}
	clock.Add(10 * time.Hour)
	check(e, 4*time.Hour)
	check(m, 4*time.Hour)
}
