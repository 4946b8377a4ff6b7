package bench

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestRunChecksEveryKey runs one workload (10 % duplicates reaching an
// hour back, 5 % repeats inside a batch) through three configurations and
// checks the per-key verdicts: the default is exact; memory-only with a
// cache far smaller than the reach lets duplicates through (and drops
// nothing); bloom-only with overfilled filters drops new keys (and lets
// no duplicate through). Each count is of its own kind, so a dropped key
// and a let-through duplicate cannot cancel out as totals would.
func TestRunChecksEveryKey(t *testing.T) {
	w := WorkloadConfig{Keys: 60_000, DupRatio: 0.1, DupReach: time.Hour, InBatchRepeat: 0.05, Span: 24 * time.Hour, Seed: 3}
	for _, tt := range []struct {
		name                string
		o                   engine.Options
		dropped, letThrough bool
	}{
		{"default", engine.Options{Backend: &embedded.Backend{FS: vfs.NewMem(), Dir: "db"}, ExpectedKeys: 100_000}, false, false},
		{"memory-evicting", engine.Options{Tiers: engine.MemoryOnly, MemoryCapacity: 256}, false, true},
		{"bloom-overfilled", engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 2_000, FalsePositive: 0.2}, true, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Run(context.Background(), RunConfig{Workload: w, Engine: tt.o, Workers: 4})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%d fresh, %d New: %d dropped, %d let through", res.Fresh, res.New, res.WronglyDropped, res.DupsLetThrough)
			if !res.DupsChecked {
				t.Fatal("duplicates reaching an hour into a week's window were not checked")
			}
			if (res.WronglyDropped > 0) != tt.dropped || (res.DupsLetThrough > 0) != tt.letThrough {
				t.Fatalf("dropped %d (want some: %v), let through %d (want some: %v)", res.WronglyDropped, tt.dropped, res.DupsLetThrough, tt.letThrough)
			}
			if got, want := res.New+res.WronglyDropped-res.DupsLetThrough, res.Fresh; got != want {
				t.Fatalf("New %d + dropped %d − let through %d = %d, want the %d fresh keys", res.New, res.WronglyDropped, res.DupsLetThrough, got, want)
			}
			if err := res.Exactness(); err != nil {
				t.Fatalf("errors of the kind this configuration allows are not a broken promise: %v", err)
			}
		})
	}
}

// TestExactnessFailsBrokenPromises: the same counts are a broken promise in
// a configuration that makes it.
func TestExactnessFailsBrokenPromises(t *testing.T) {
	for _, r := range []Result{
		{Tiers: engine.Default.String(), WronglyDropped: 1},
		{Tiers: engine.Default.String(), DupsLetThrough: 1},
		{Tiers: "memory+redis", DupsLetThrough: 1}, // Run's name for a Redis Backend (Options.Name)
		{Tiers: engine.MemoryOnly.String(), WronglyDropped: 1},
		{Tiers: engine.BloomOnly.String(), DupsLetThrough: 1},
		// Bloom-only dropping well above its rate; memory-only letting a
		// duplicate through with every key in its cache.
		{Tiers: engine.BloomOnly.String(), Fresh: 100_000, WronglyDropped: 2_000, BloomFPConfigured: 0.01},
		{Tiers: engine.MemoryOnly.String(), Fresh: 1_000, MemoryCapacity: 1_000, DupsLetThrough: 1},
	} {
		if err := r.Exactness(); !errors.Is(err, ErrExactness) {
			t.Errorf("%s dropped %d, let through %d: Exactness = %v", r.Tiers, r.WronglyDropped, r.DupsLetThrough, err)
		}
	}
}

// TestExactnessAllowsWhatTheConfigurationSays: drops at bloom-only's rate
// and let-throughs of a memory-only cache that evicted are no broken
// promise.
func TestExactnessAllowsWhatTheConfigurationSays(t *testing.T) {
	for _, r := range []Result{
		{Tiers: engine.BloomOnly.String(), Fresh: 100_000, WronglyDropped: 1_000, BloomFPConfigured: 0.01},
		{Tiers: engine.BloomOnly.String(), Fresh: 100_000, WronglyDropped: 5_000, BloomFPConfigured: 0.01, Stats: engine.Stats{Bloom: engine.BloomStats{EstimatedFP: 0.05}}}, // overfilled: no rate promised
		{Tiers: engine.MemoryOnly.String(), Fresh: 1_001, MemoryCapacity: 1_000, DupsLetThrough: 10},
	} {
		if err := r.Exactness(); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
}

// TestDayProfiles: a run over three simulated days writes one CPU profile
// per day (gzip-compressed pprof, so each starts with the gzip magic), and
// none for a day the stream does not reach; a second CPU profile running
// already makes the run fail with ErrConfig instead of profiling nothing.
func TestDayProfiles(t *testing.T) {
	prefix := t.TempDir() + "/"
	w := WorkloadConfig{Keys: 30_000, DupRatio: 0.1, DupReach: time.Hour, Span: 72 * time.Hour, Seed: 5}
	rc := RunConfig{Workload: w, Engine: engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 100_000}, Workers: 2, DayProfiles: prefix}
	res, err := Run(context.Background(), rc)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.PerDay) != 3 {
		t.Fatalf("%d days in the result, want 3", len(res.PerDay))
	}
	for d := 1; d <= 4; d++ {
		b, err := os.ReadFile(prefix + "day" + strconv.Itoa(d) + ".pprof")
		if d == 4 {
			if !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("a profile of day 4 of a 3-day run: %v", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("day %d: %v", d, err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Fatalf("day %d: %d bytes, not a gzip-compressed profile", d, len(b))
		}
	}
	var other bytes.Buffer
	if err := pprof.StartCPUProfile(&other); err != nil {
		t.Fatal(err)
	}
	defer pprof.StopCPUProfile()
	if _, err := Run(context.Background(), rc); !errors.Is(err, ErrConfig) {
		t.Fatalf("a run while another CPU profile runs: %v, want ErrConfig", err)
	}
}

// TestRunWarnsOfOverfullFilters: a run whose filters hold ten times the
// keys they were sized for says so among its warnings, with the measured
// rate and the ExpectedKeys that would restore the target; one sized right
// does not.
func TestRunWarnsOfOverfullFilters(t *testing.T) {
	w := WorkloadConfig{Keys: 60_000, DupRatio: 0.1, DupReach: time.Hour, Span: 12 * time.Hour, Seed: 5}
	for _, tt := range []struct {
		expected int
		warn     bool
	}{{6_000, true}, {60_000, false}} {
		res, err := Run(context.Background(), RunConfig{Workload: w, Engine: engine.Options{Backend: &embedded.Backend{FS: vfs.NewMem(), Dir: "db"}, ExpectedKeys: tt.expected}, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		var found []string
		for _, s := range res.Warnings() {
			if strings.Contains(s, "Bloom filter of the partition") {
				found = append(found, s)
			}
		}
		t.Logf("ExpectedKeys %d: recommended %d; %q", tt.expected, res.Stats.Bloom.RecommendedExpectedKeys, found)
		if (len(found) > 0) != tt.warn || (res.Stats.Bloom.RecommendedExpectedKeys > 0) != tt.warn {
			t.Errorf("ExpectedKeys %d: %d filter warnings, recommended %d; want some: %v", tt.expected, len(found), res.Stats.Bloom.RecommendedExpectedKeys, tt.warn)
		}
		if tt.warn && !strings.Contains(found[0], "measured over") {
			t.Errorf("warning %q does not say the rate was measured", found[0])
		}
	}
}

// TestPlanCountsSlidingRefreshes: a sliding window's refreshes, planned
// from the duplicate share, reach and partition, agree within 25 % with
// those a run of the same workload counts; the plan adds them to the keys
// of a partition (filters and disk), and refuses a shared tier.
func TestPlanCountsSlidingRefreshes(t *testing.T) {
	const keys, dup = 200_000, 0.2
	for _, reach := range []time.Duration{20 * time.Minute, 3 * time.Hour} {
		w := WorkloadConfig{Keys: keys, DupRatio: dup, DupReach: reach, Span: 24 * time.Hour, Seed: 9}
		o := engine.Options{Backend: &embedded.Backend{FS: vfs.NewMem(), Dir: "db", NoSync: true}, Window: 24 * time.Hour, Partition: time.Hour, ExpectedKeys: 20_000,
			Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
		res, err := Run(context.Background(), RunConfig{Workload: w, Engine: o, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		in := PlanInput{IDsPerDay: keys, Window: 24 * time.Hour, Partition: time.Hour, DupRatio: dup, DupReach: reach, FalsePositive: 0.01, Tiers: engine.Default}
		flat, err := MakePlan(in, Calibration{KeysPerSec: 1})
		if err != nil {
			t.Fatal(err)
		}
		in.Sliding = true
		pl, err := MakePlan(in, Calibration{KeysPerSec: 1})
		if err != nil {
			t.Fatal(err)
		}
		got := float64(res.Stats.Calls.Refreshes)
		t.Logf("reach %v: %0.f refreshes counted, %.0f planned (%.3g of duplicates); keys a partition %.0f → %.0f",
			reach, got, pl.RefreshesPerDay, pl.RefreshesPerDay/(keys*dup), flat.KeysPerPartition, pl.KeysPerPartition)
		if r := got / pl.RefreshesPerDay; r < 0.75 || r > 1.25 {
			t.Errorf("reach %v: run counted %.0f refreshes, the plan %.0f (%.2f×)", reach, got, pl.RefreshesPerDay, r)
		}
		if want := flat.KeysPerPartition + pl.RefreshesPerDay/24; math.Abs(pl.KeysPerPartition-want) > 1 {
			t.Errorf("keys a partition %.0f, want %.0f with the refreshes", pl.KeysPerPartition, want)
		}
	}
	if _, err := MakePlan(PlanInput{IDsPerDay: 1e6, Window: 24 * time.Hour, Partition: time.Hour, FalsePositive: 0.01, Shared: SharedRedis, Sliding: true}, Calibration{}); !errors.Is(err, ErrPlan) {
		t.Errorf("a sliding plan on Redis: %v, want ErrPlan", err)
	}
}

// TestRunRefusesALeaseTheClockOutruns: a run whose workers move the
// simulated clock past the claims' lease while one batch is in flight
// (1,000 keys over a day, batches of 256, a 1-hour window) is refused with
// ErrConfig, naming the flags to change, before anything is opened; it
// used to run and report its own expired claims as new keys dropped. The
// same stream with ten times the keys per worker batch runs exact.
func TestRunRefusesALeaseTheClockOutruns(t *testing.T) {
	o := engine.Options{Backend: &embedded.Backend{FS: vfs.NewMem(), Dir: "db"}, Window: time.Hour, Partition: 30 * time.Minute, ExpectedKeys: 10_000}
	w := WorkloadConfig{Keys: 1000, DupRatio: 0.1, DupReach: 10 * time.Minute, Span: 24 * time.Hour, Seed: 5}
	_, err := Run(context.Background(), RunConfig{Workload: w, Engine: o, Workers: 4})
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "-keys") {
		t.Fatalf("Run: %v, want ErrConfig naming -keys", err)
	}
	// A span of years over a handful of keys: the clock's move overflows
	// a Duration, and is still refused.
	long := w
	long.Keys, long.Span = 3, 100*365*24*time.Hour
	if _, err := Run(context.Background(), RunConfig{Workload: long, Engine: o, Workers: 4}); !errors.Is(err, ErrConfig) {
		t.Fatalf("Run over a century: %v, want ErrConfig", err)
	}
	w.Span = time.Hour
	w.Keys = 20_000
	res, err := Run(context.Background(), RunConfig{Workload: w, Engine: o, Workers: 4, Batch: 64})
	if err != nil {
		t.Fatal(err)
	}
	if res.WronglyDropped != 0 || res.DupsLetThrough != 0 {
		t.Fatalf("%d new keys dropped, %d duplicates let through", res.WronglyDropped, res.DupsLetThrough)
	}
}
