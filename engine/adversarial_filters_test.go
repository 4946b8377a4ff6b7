package engine_test

// Adversarial tests of the measured Bloom filters (Stats.Bloom.Partitions,
// BloomRecommendedExpectedKeys, BloomOverTarget, the warning): each would
// fail if a filter sized right were reported, or recommended a size, as
// wrong.

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// syncBuf is a log sink safe for the engine's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// noWarning fails if e or its log report a filter over its target.
func noWarning(t *testing.T, e *engine.Engine, logs *syncBuf, what string) {
	t.Helper()
	st := e.Stats()
	if st.Bloom.OverTarget != 0 || st.Bloom.RecommendedExpectedKeys != 0 {
		t.Errorf("%s: BloomOverTarget %d, BloomRecommendedExpectedKeys %d, want 0 and 0 (ExpectedKeys %d)",
			what, st.Bloom.OverTarget, st.Bloom.RecommendedExpectedKeys, e.Options().ExpectedKeys)
	}
	for _, p := range st.Bloom.Partitions {
		if p.OverTarget {
			t.Errorf("%s: partition %v over target: %+v", what, p.Start.UTC(), p)
		}
	}
	if strings.Contains(logs.String(), "set ExpectedKeys") {
		t.Errorf("%s: logged %q", what, logs.String())
	}
}

// TestAdvFilterForgottenKeysAreNotFalsePositives: a filter sized ten
// times larger than its keys, whose keys were forgotten (Forget) and then
// claimed again, said "maybe" for keys it really was given: its false-
// positive rate is its target's, and nothing should tell the operator to
// resize it.
func TestAdvFilterForgottenKeysAreNotFalsePositives(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	logs := &syncBuf{}
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 10000, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer e.Close()
	const n = 1000 // a tenth of ExpectedKeys
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprint("order-", i))
	}
	out := make([]engine.Outcome, n)
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	// Some genuinely new keys, so the filters are measured at all.
	fresh := make([][]byte, n)
	for i := range fresh {
		fresh[i] = []byte(fmt.Sprint("fresh-", i))
	}
	if err := e.MarkBatch(ctx, fresh, nil, out); err != nil {
		t.Fatal(err)
	}
	noWarning(t, e, logs, "before any Forget")
	// Reprocess a tenth of the orders: Forget, then claim them again.
	infos := make([]engine.KeyInfo, 100)
	if err := e.ForgetBatch(ctx, keys[:100], infos); err != nil {
		t.Fatal(err)
	}
	if err := e.MarkBatch(ctx, keys[:100], nil, out[:100]); err != nil {
		t.Fatal(err)
	}
	for i, o := range out[:100] {
		if o != engine.New {
			t.Fatalf("forgotten key %d: %v", i, o)
		}
	}
	st := e.Stats()
	t.Logf("BloomFalsePositives %d; partitions %+v", st.Bloom.FalsePositives, st.Bloom.Partitions)
	noWarning(t, e, logs, "after re-claiming 100 forgotten keys of a filter holding a fifth of its ExpectedKeys")
}

// TestAdvFilterSlidingNamespaceWindowKeys: in a sliding namespace with a
// window of its own every duplicate re-commits its key (and adds it to the
// current filter again). A handful of keys that keep arriving fill no
// filter: each re-add sets bits already set. The filter's Keys, the rate
// its formula gives, and the recommendation must not grow with the
// duplicates.
func TestAdvFilterSlidingNamespaceWindowKeys(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	logs := &syncBuf{}
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, Clock: clock,
		Logger:     slog.New(slog.NewTextHandler(logs, nil)),
		Namespaces: map[string]engine.NamespaceOptions{"sensors": {Sliding: true, Window: 10 * time.Minute}}})
	defer e.Close()
	ns, _ := e.Namespace("sensors")
	keys := make([][]byte, 10)
	for i := range keys {
		keys[i] = []byte(fmt.Sprint("sensor-", i))
	}
	out := make([]engine.Outcome, len(keys))
	// Ten sensors report every second for half an hour.
	for s := 0; s < 1800; s++ {
		if err := ns.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Second)
	}
	st := e.Stats()
	t.Logf("Refreshes %d; partitions %+v", st.Calls.Refreshes, st.Bloom.Partitions)
	for _, p := range st.Bloom.Partitions {
		if p.Keys > 100 {
			t.Errorf("partition %v: Keys %d for 10 distinct keys (EstimatedFP %.3g, target %.3g)", p.Start.UTC(), p.Keys, p.EstimatedFP, p.TargetFP)
		}
	}
	noWarning(t, e, logs, "10 keys re-sent 1,800 times each, no new key")
}

// TestAdvFilterRightSizedRepeatedWorkload: a filter sized right under a
// skewed workload (most claims duplicates of a few hot keys, new keys at
// the rate ExpectedKeys allows, claims released and retried) reports
// nothing, across partitions and a restart.
func TestAdvFilterRightSizedRepeatedWorkload(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	logs := &syncBuf{}
	o := engine.Options{Backend: embedded.Dir(t.TempDir()), Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 20000, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(logs, nil))}
	e := open(t, o)
	defer func() { e.Close() }()
	hot := make([][]byte, 50)
	for i := range hot {
		hot[i] = []byte(fmt.Sprint("hot-", i))
	}
	out := make([]engine.Outcome, len(hot))
	fresh := 0
	for step := 0; step < 6*60; step++ { // six hours in minutes: 15,000 new keys an hour
		if err := e.MarkBatch(ctx, hot, nil, out); err != nil {
			t.Fatal(err)
		}
		keys := make([][]byte, 250)
		for i := range keys {
			keys[i] = []byte(fmt.Sprint("new-", fresh))
			fresh++
		}
		cl := make([]engine.Claim, len(keys))
		if err := e.ClaimBatch(ctx, keys, nil, cl); err != nil {
			t.Fatal(err)
		}
		// A fifth fail and are retried at once.
		if err := e.ReleaseBatch(ctx, cl[:50], nil); err != nil {
			t.Fatal(err)
		}
		if err := e.ClaimBatch(ctx, keys[:50], nil, cl[:50]); err != nil {
			t.Fatal(err)
		}
		if err := e.CommitBatch(ctx, cl, nil); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Minute)
		if step == 150 {
			if err := e.Close(); err != nil {
				t.Fatal(err)
			}
			e = open(t, o)
		}
	}
	st := e.Stats()
	for _, p := range st.Bloom.Partitions {
		t.Logf("%v keys %d measured %.4g (%d/%d) target %.4g estimated %.4g", p.Start.UTC().Format("15:04"), p.Keys, p.MeasuredFP, p.FalsePositives, p.Checked, p.TargetFP, p.EstimatedFP)
	}
	noWarning(t, e, logs, "a right-sized filter under a skewed workload")
}

// TestAdvFilterRecommendationEarly: a filter ten times too small, filled
// in the first two minutes of its partition by a burst and then quiet: the
// recommendation is its keys projected to the partition's end. Whatever
// the projection, it must be at least the keys the filter already holds,
// and the warning names one (it is a snapshot of the moment it fired:
// Stats' projection moves on).
func TestAdvFilterRecommendationEarly(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	logs := &syncBuf{}
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer e.Close()
	n := 0
	for m := 0; m < 2; m++ {
		keys := make([][]byte, 5000)
		for i := range keys {
			keys[i] = []byte(fmt.Sprint("k-", n))
			n++
		}
		out := make([]engine.Outcome, len(keys))
		if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Minute)
	}
	st := e.Stats()
	cur := st.Bloom.Partitions[len(st.Bloom.Partitions)-1]
	t.Logf("current %+v; recommended %d; log %q", cur, st.Bloom.RecommendedExpectedKeys, logs.String())
	if !cur.OverTarget {
		t.Fatalf("a filter ten times too small is not over target: %+v", cur)
	}
	if cur.RecommendedExpectedKeys < int(cur.Keys) {
		t.Errorf("recommended %d < the %d keys it holds", cur.RecommendedExpectedKeys, cur.Keys)
	}
	if !strings.Contains(logs.String(), "set ExpectedKeys to ") || st.Bloom.OverTarget != 1 {
		t.Errorf("no single warning: %d, %q", st.Bloom.OverTarget, logs.String())
	}
}

// TestFilterWarningOfAnInheritedFilter: a filter over its target because
// it grew from bits restored at a smaller size (Inherited) while holding
// fewer keys than ExpectedKeys is not told to raise ExpectedKeys, which
// would not thin those bits: no recommendation, and the warning says why.
// The same figures without Inherited, or with as many keys as
// ExpectedKeys, get the recommendation.
func TestFilterWarningOfAnInheritedFilter(t *testing.T) {
	logs := &syncBuf{}
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), ExpectedKeys: 1_000_000, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	defer e.Close()
	p := tier.FilterStats{Partition: time.Now().UnixNano() / int64(24*time.Hour), Keys: 900_000, Checked: 20_000, FalsePositives: 400, TargetFP: 0.00126, Inherited: true}
	bp := e.WarnFilter(p)
	if !bp.OverTarget || !bp.Inherited || bp.RecommendedExpectedKeys != 0 {
		t.Fatalf("inherited, under ExpectedKeys: %+v, want over target, inherited, no recommendation", bp)
	}
	if l := logs.String(); !strings.Contains(l, "ExpectedKeys need not change") || strings.Contains(l, "set ExpectedKeys to") {
		t.Fatalf("inherited filter's warning: %q", l)
	}
	for _, q := range []tier.FilterStats{
		{Partition: p.Partition, Keys: 900_000, Checked: 20_000, FalsePositives: 400, TargetFP: 0.00126},
		{Partition: p.Partition, Keys: 1_000_000, Checked: 20_000, FalsePositives: 400, TargetFP: 0.00126, Inherited: true},
	} {
		if bp := e.WarnFilter(q); bp.RecommendedExpectedKeys < int(q.Keys) {
			t.Fatalf("%+v: recommended %d, want at least its keys", q, bp.RecommendedExpectedKeys)
		}
	}
	if !strings.Contains(logs.String(), "set ExpectedKeys to ") {
		t.Fatalf("no recommendation logged: %q", logs.String())
	}
}
