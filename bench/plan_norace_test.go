//go:build !race

// The plan is checked without the race detector: under -race Pebble keeps
// its memtables and block cache on the Go heap instead of off it, so the
// heap no longer measures what the plan models. CI runs this test in its
// pass without -race (go test -run 'Alloc|PlanAgreesWithRun' ./...).

package bench

import (
	"context"
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
