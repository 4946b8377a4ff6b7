package bench

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestPlanAgreesWithRun sizes a load with the plan's model and checks it
// against what a run of that load measures, at a scale CI can afford, with
// every live partition full (the plan's steady state): the Bloom filters,
// the heap, and the disk predicted from a calibration run of half the size
// (another seed), each within 25 %.
func TestPlanAgreesWithRun(t *testing.T) {
	const keys = 1_200_000
	// Three live partitions of an hour; the run ends just before a fourth
	// begins, so every key it committed is still held.
	window, partition, span := 2*time.Hour, time.Hour, 3*time.Hour-time.Minute
	in := PlanInput{
		IDsPerDay: keys * float64(24*time.Hour) / float64(span), Window: window, Partition: partition,
		DupRatio: 0.1, KeySize: 36, FalsePositive: 0.01, Tiers: engine.Default, MemoryCapacity: 400_000,
	}
	pl, err := MakePlan(in, Calibration{})
	if err != nil {
		t.Fatal(err)
	}
	run := func(n int64, seed uint64) *Result {
		res, err := Run(context.Background(), RunConfig{
			Compact:  true,
			Workload: WorkloadConfig{Keys: n, DupRatio: 0.1, DupReach: time.Minute, Span: span, Seed: seed},
			Engine: engine.Options{Window: window, Partition: partition, FalsePositive: 0.01, MemoryCapacity: 400_000,
				ExpectedKeys: int(pl.KeysPerPartition)},
		})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	cal := CalibrationOf(run(keys/2, 5))
	if pl, err = MakePlan(in, cal); err != nil {
		t.Fatal(err)
	}
	res := run(keys, 11)
	measuredHeap := float64(res.Stats.BloomBytes) + float64(res.Stats.MemoryEntries)*MemoryEntryBytes
	t.Logf("heap: plan %.2f MiB (bloom %.2f), run %.2f MiB (bloom %.2f, memory entries %d, Go heap %.2f)",
		pl.HeapBytes/(1<<20), pl.BloomBytes/(1<<20), measuredHeap/(1<<20), float64(res.Stats.BloomBytes)/(1<<20), res.Stats.MemoryEntries, float64(res.HeapBytes)/(1<<20))
	within(t, "bloom bytes", pl.BloomBytes, float64(res.Stats.BloomBytes))
	within(t, "heap (model vs Go heap)", pl.HeapBytes, float64(res.HeapBytes))
	// The run's live files: SSTs and WAL. Its DiskBytes also counts files a
	// finished compaction has not deleted yet, which come and go.
	live := float64(res.TableBytes + res.WALBytes)
	t.Logf("disk: calibrated %.1f B/key of SSTs + %.1f B/key of WAL; plan %.2f MiB for %.0f keys held, run %.2f MiB live (SSTs %.2f, WAL %.2f; %.2f MiB with files awaiting deletion) for %d commits",
		cal.TableBytesPerKey, cal.WALBytesPerKey, pl.DiskBytes/(1<<20), pl.KeysHeld, live/(1<<20), float64(res.TableBytes)/(1<<20), float64(res.WALBytes)/(1<<20), float64(res.DiskBytes)/(1<<20), res.Stats.Commits)
	within(t, "disk", pl.DiskBytes, live)
	if pl.Headroom <= 0 || pl.BloomK == 0 || pl.Live != 3 || res.Stats.PartitionDropped != 0 {
		t.Fatalf("plan %+v, dropped %d", pl, res.Stats.PartitionDropped)
	}
}

func within(t *testing.T, what string, plan, measured float64) {
	t.Helper()
	if measured == 0 || math.Abs(plan-measured)/measured > 0.25 {
		t.Errorf("%s: plan %.0f, measured %.0f: more than 25%% apart", what, plan, measured)
	}
}

func TestMakePlanRejectsBadInput(t *testing.T) {
	for _, in := range []PlanInput{
		{IDsPerDay: 0, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01, KeySize: 36},
		{IDsPerDay: 1, Window: time.Hour, Partition: time.Hour, FalsePositive: 1, KeySize: 36},
		{IDsPerDay: 1, Window: 0, Partition: time.Hour, FalsePositive: 0.01, KeySize: 36},
	} {
		if _, err := MakePlan(in, Calibration{}); !errors.Is(err, ErrPlan) {
			t.Errorf("%+v: %v", in, err)
		}
	}
}

// TestPlan500MPerDay pins the worked example of the README: 500M IDs/day,
// 7-day window in daily partitions, 10 % duplicates, 1 % false positives.
func TestPlan500MPerDay(t *testing.T) {
	pl, err := MakePlan(PlanInput{IDsPerDay: 500e6, Window: 7 * 24 * time.Hour, Partition: 24 * time.Hour, DupRatio: 0.1,
		KeySize: 36, FalsePositive: 0.01, Tiers: engine.Default, MemoryCapacity: 1 << 20}, Calibration{KeysPerSec: 300e3, TableBytesPerKey: 20})
	if err != nil {
		t.Fatal(err)
	}
	if pl.Live != 8 || pl.KeysPerPartition != 450e6 || math.Abs(pl.BloomBitsPerKey-13.9) > 0.1 || pl.BloomK != 10 {
		t.Fatalf("plan: live %d, %.3g keys/partition, %.2f bits/key, k %d", pl.Live, pl.KeysPerPartition, pl.BloomBitsPerKey, pl.BloomK)
	}
	if gib := pl.BloomBytes / (1 << 30); gib < 5.5 || gib > 6.2 {
		t.Fatalf("bloom %.2f GiB", gib)
	}
}
