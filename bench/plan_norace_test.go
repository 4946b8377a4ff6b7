//go:build !race

// The plan is checked without the race detector: under -race Pebble keeps
// its memtables and block cache on the Go heap instead of off it, so the
// heap no longer measures what the plan models, and the detector's
// slowdown is not the machine's rate. CI runs this test in its pass without
// -race (go test -run 'Alloc|PlanAgreesWithRun' ./...).

package bench

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// TestPlanAgreesWithRun plans a load of a key shape other than UUIDs,
// calibrating with that shape as `dedupbench plan` does, then runs the load
// itself for two simulated days (a 24 h window in 6 h partitions, so
// partitions rotate and drop; duplicates reach 18 h back, past the memory
// tier, so the store answers many of them) and checks the plan against what the run measured,
// each within 25 %: the Bloom filters' bytes, the heap, the compacted SSTs
// on their own, every byte Stats.DiskBytes counts (SSTs, live and recycled
// WAL, manifest, files awaiting deletion; sampled through the second day,
// as compactions in flight come and go), and keys/s over the second day,
// once the window is full (the calibration's steady state). Rates on a
// shared machine swing, so calibration and run alternate three times, and
// each calibration is compared with the run right after it (the nearest in
// time, so the nearest in the machine's load): the median of the three
// ratios must be within 25 % of one. (Comparing the medians of each, one
// CI run failed with calibrations of 83, 67 and 157 k keys/s beside runs
// of 93, 152 and 153 k: the machine, not the plan, moved.)
func TestPlanAgreesWithRun(t *testing.T) {
	for _, tc := range []struct {
		name  string
		shape KeyShape
		size  int
	}{
		{"snowflake", Snowflake, 0},
		{"business-64", Business, 64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const keys, memory = 2_000_000, 300_000
			span := 48 * time.Hour
			in := PlanInput{
				IDsPerDay: keys * float64(24*time.Hour) / float64(span), Window: 24 * time.Hour, Partition: 6 * time.Hour,
				DupRatio: 0.1, DupReach: 18 * time.Hour, Shape: tc.shape, KeySize: tc.size, FalsePositive: 0.01,
				Tiers: engine.Default, MemoryCapacity: memory,
			}
			var calRates, runRates, runDisk, runHeap []float64
			var pl Plan
			var res *Result
			for round := range 3 {
				cal, cres, err := Calibrate(context.Background(), in, CalibrateConfig{Measure: 600_000, Store: 10_000_000, Segments: 3})
				if err != nil {
					t.Fatal(err)
				}
				if err := cres.Exactness(); err != nil {
					t.Fatal(err)
				}
				if pl, err = MakePlan(in, cal); err != nil {
					t.Fatal(err)
				}
				res, err = Run(context.Background(), RunConfig{
					Compact:  true,
					Sample:   100 * time.Millisecond,
					Workload: WorkloadConfig{Keys: keys, Shape: tc.shape, KeySize: tc.size, DupRatio: 0.1, DupReach: 18 * time.Hour, Span: span, Seed: 11 + uint64(round)},
					Engine: engine.Options{Window: in.Window, Partition: in.Partition, FalsePositive: 0.01, MemoryCapacity: memory,
						ExpectedKeys: int(pl.KeysPerPartition)},
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := res.Exactness(); err != nil {
					t.Fatal(err)
				}
				if pl.Derate != 1 || pl.Live != 5 || res.Stats.PartitionDropped == 0 || len(res.PerDay) < 2 || res.Stats.StoreHits == 0 {
					t.Fatalf("plan derate %v, live %d; run dropped %d partitions, %d days, %d store hits",
						pl.Derate, pl.Live, res.Stats.PartitionDropped, len(res.PerDay), res.Stats.StoreHits)
				}
				calRates = append(calRates, pl.CapacityPerDay/86400)
				runRates = append(runRates, res.PerDay[1].KeysPerSec)
				// The disk as it stood through the second day: compactions
				// in flight come and go, so one instant is not the store's
				// size.
				var disk []float64
				for _, p := range res.Series {
					if p.SimTime.Sub(Start) > 24*time.Hour && p.DiskBytes > 0 {
						disk = append(disk, float64(p.DiskBytes))
					}
				}
				if len(disk) == 0 {
					t.Fatal("no disk sample in the second day")
				}
				runDisk = append(runDisk, median(disk))
				runHeap = append(runHeap, float64(res.HeapBytes))
			}
			cal, st := pl.Calibration, res.Stats
			t.Logf("keys of %.1f B; heap: plan %.1f MiB (bloom %.1f), run %.1f MiB (bloom %.1f)",
				pl.KeyBytes, pl.HeapBytes/(1<<20), pl.BloomBytes/(1<<20), float64(res.HeapBytes)/(1<<20), float64(st.BloomBytes)/(1<<20))
			t.Logf("disk: plan %.1f MiB (SSTs %.1f B/key × %.0f keys held = %.1f MiB, WAL %.1f MiB in files of %.1f MiB, fixed %.1f MiB); run %.1f MiB (SSTs %.1f, %.1f compacted, WAL %.1f + %d recycled files %.1f)",
				pl.DiskBytes/(1<<20), cal.TableBytesPerKey, pl.KeysHeld, pl.TableBytes/(1<<20), pl.WALBytes/(1<<20), pl.WALFileBytes/(1<<20), cal.FixedDiskBytes/(1<<20),
				float64(st.DiskBytes)/(1<<20), float64(st.TableBytes)/(1<<20), float64(res.CompactedTableBytes)/(1<<20), float64(st.WALBytes)/(1<<20), st.WALRecycledFiles, float64(st.WALRecycledBytes)/(1<<20))
			t.Logf("keys/s: plan %.0f (calibrations %.0f), run's second day %.0f; store hits %d of %d reads",
				median(calRates), calRates, runRates, st.StoreHits, st.StoreReads)
			within(t, "bloom bytes", pl.BloomBytes, float64(st.BloomBytes))
			within(t, "heap (model vs Go heap, median)", pl.HeapBytes, median(runHeap))
			within(t, "compacted SSTs", pl.TableBytes, float64(res.CompactedTableBytes))
			t.Logf("disk through the second day (medians of each run): %.1f MiB", func() []float64 {
				m := slices.Clone(runDisk)
				for i := range m {
					m[i] /= 1 << 20
				}
				return m
			}())
			within(t, "disk (Stats.DiskBytes through the second day)", pl.DiskBytes, median(runDisk))
			ratios := make([]float64, len(calRates))
			for i := range calRates {
				ratios[i] = calRates[i] / runRates[i]
			}
			t.Logf("keys/s, plan / run of each round: %.2f", ratios)
			within(t, "keys/s (second day), plan / run of each round, median ×1000", 1000*median(ratios), 1000)
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
