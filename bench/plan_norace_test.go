//go:build !race

// The plan is checked without the race detector: under -race Pebble keeps
// its memtables and block cache on the Go heap instead of off it, so the
// heap no longer measures what the plan models, and the detector's
// slowdown is not the machine's rate. CI runs this test in its pass without
// -race (go test -run 'Alloc|PlanAgreesWithRun' ./...).

package bench

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestPlanAgreesWithRun plans a load of a key shape other than UUIDs,
// calibrating with that shape as `dedupbench plan` does, then runs the load
// itself for two simulated days (a 24 h window in 6 h partitions, so
// partitions rotate and drop; duplicates reach 18 h back, past the memory
// tier, so the store answers many of them) and checks the plan against what the run measured,
// each within 25 %: the Bloom filters' bytes, the heap, the compacted SSTs
// on their own, every byte Stats.Store.DiskBytes counts (SSTs, live and recycled
// WAL, manifest, files awaiting deletion; sampled through the second day,
// as compactions in flight come and go), and keys/s over the second day,
// once the window is full (the calibration's steady state). Rates on a
// shared machine swing, so calibration and run alternate three times, and
// each calibration is compared with the run right after it (the nearest in
// time, so the nearest in the machine's load): the median of the three
// ratios must be within 25 % of one, or, allowing for the spread the
// calibration measured, most runs within their round's planned range
// (Plan.CapacityRange) widened by 25 %. Bloom, heap and disk are not
// load-sensitive and stay within 25 % each. (Comparing the medians of each, one
// CI run failed with calibrations of 83, 67 and 157 k keys/s beside runs
// of 93, 152 and 153 k: the machine, not the plan, moved.)
func TestPlanAgreesWithRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		shape  KeyShape
		size   int
		recipe KeySource // the user's keys: a sample of them plans, the run uses others
	}{
		{"snowflake", Snowflake, 0, nil},
		{"business-64", Business, 64, nil},
		{"sample-of-ledger-64", 0, 0, ledgerKeys{perDay: 1_000_000}},
		{"sample-of-snowflakes", 0, 0, snowflakeKeys{perMs: 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const keys, memory = 2_000_000, 300_000
			span := 48 * time.Hour
			in := PlanInput{
				IDsPerDay: keys * float64(24*time.Hour) / float64(span), Window: 24 * time.Hour, Partition: 6 * time.Hour,
				DupRatio: 0.1, DupReach: 18 * time.Hour, Shape: tc.shape, KeySize: tc.size, FalsePositive: 0.01,
				Tiers: engine.Default, MemoryCapacity: memory,
			}
			var runKeys KeySource
			if tc.recipe != nil {
				s, err := LoadSample(writeSample(t, tc.recipe, 200_000))
				if err != nil {
					t.Fatal(err)
				}
				// The run's keys are the recipe's beyond the sample.
				in.Sample, runKeys = s, offsetKeys{tc.recipe, 1 << 32}
			}
			var calRates, runRates, runDisk, runHeap, planTables, runTables []float64
			var calRanges [][2]float64
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
					Workload: WorkloadConfig{Keys: keys, Shape: tc.shape, KeySize: tc.size, Source: runKeys, DupRatio: 0.1, DupReach: 18 * time.Hour, Span: span, Seed: 11 + uint64(round)},
					Engine: engine.Options{Window: in.Window, Partition: in.Partition, FalsePositive: 0.01, MemoryCapacity: memory,
						ExpectedKeys: int(pl.KeysPerPartition)},
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := res.Exactness(); err != nil {
					t.Fatal(err)
				}
				if pl.Derate != 1 || pl.Live != 5 || res.Stats.Store.PartitionsDropped == 0 || len(res.PerDay) < 2 || res.Stats.Store.Hits == 0 {
					t.Fatalf("plan derate %v, live %d; run dropped %d partitions, %d days, %d store hits",
						pl.Derate, pl.Live, res.Stats.Store.PartitionsDropped, len(res.PerDay), res.Stats.Store.Hits)
				}
				calRates = append(calRates, pl.CapacityPerDay/86400)
				calRanges = append(calRanges, [2]float64{pl.CapacityRange[0] / 86400, pl.CapacityRange[1] / 86400})
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
				planTables, runTables = append(planTables, pl.TableBytes), append(runTables, float64(res.CompactedTableBytes))
			}
			cal, st := pl.Calibration, res.Stats
			t.Logf("keys of %.1f B; heap: plan %.1f MiB (bloom %.1f), run %.1f MiB (bloom %.1f)",
				pl.KeyBytes, pl.HeapBytes/(1<<20), pl.BloomBytes/(1<<20), float64(res.HeapBytes)/(1<<20), float64(st.Bloom.Bytes)/(1<<20))
			t.Logf("disk: plan %.1f MiB (SSTs %.1f B/key × %.0f keys held = %.1f MiB, WAL %.1f MiB in files of %.1f MiB, fixed %.1f MiB); run %.1f MiB (SSTs %.1f, %.1f compacted, WAL %.1f + %d recycled files %.1f)",
				pl.DiskBytes/(1<<20), cal.TableBytesPerKey, pl.KeysHeld, pl.TableBytes/(1<<20), pl.WALBytes/(1<<20), pl.WALFileBytes/(1<<20), cal.FixedDiskBytes/(1<<20),
				float64(st.Store.DiskBytes)/(1<<20), float64(st.Store.TableBytes)/(1<<20), float64(res.CompactedTableBytes)/(1<<20), float64(st.Store.WALBytes)/(1<<20), st.Store.WALRecycledFiles, float64(st.Store.WALRecycledBytes)/(1<<20))
			t.Logf("keys/s: plan %.0f (calibrations %.0f), run's second day %.0f; store hits %d of %d reads",
				median(calRates), calRates, runRates, st.Store.Hits, st.Store.Reads)
			within(t, "bloom bytes", pl.BloomBytes, float64(st.Bloom.Bytes))
			within(t, "heap (model vs Go heap, median)", pl.HeapBytes, median(runHeap))
			// The medians are compared. Until Compact compacted the
			// journal's keyspace too, a run's compacted SSTs moved by up to
			// a third from one run of the same keys to the next (the
			// journal a checkpoint trimmed stayed in tables no compaction
			// had reached yet: plan and run 21.0 to 28.4 MiB in one CI
			// run); they now stay within a few per cent (21.1 to 22.9).
			t.Logf("compacted SSTs, plan and run of each round (MiB): %.1f", func() [][2]float64 {
				var r [][2]float64
				for i := range planTables {
					r = append(r, [2]float64{planTables[i] / (1 << 20), runTables[i] / (1 << 20)})
				}
				return r
			}())
			within(t, "compacted SSTs (medians)", median(planTables), median(runTables))
			t.Logf("disk through the second day (medians of each run): %.1f MiB", func() []float64 {
				m := slices.Clone(runDisk)
				for i := range m {
					m[i] /= 1 << 20
				}
				return m
			}())
			within(t, "disk (Stats.Store.DiskBytes through the second day)", pl.DiskBytes, median(runDisk))
			ratios := make([]float64, len(calRates))
			for i := range calRates {
				ratios[i] = calRates[i] / runRates[i]
			}
			t.Logf("keys/s, plan / run of each round: %.2f; the plans' ranges %.0f", ratios, calRanges)
			// The spread the calibration measured is allowed for: the
			// median ratio within 25 % of one, or, on a machine whose load
			// moved within the calibration, most rounds' runs within the
			// round's planned range (its slowest to fastest segment) widened
			// by 25 %.
			inRange := 0
			for i, r := range calRanges {
				if runRates[i] >= 0.75*r[0] && runRates[i] <= 1.25*r[1] {
					inRange++
				}
			}
			if m := median(ratios); math.Abs(m-1) > 0.25 && 2*inRange <= len(calRanges) {
				t.Errorf("keys/s (second day): median plan / run %.2f, and %d of %d runs within their plan's range widened by 25 %%", m, inRange, len(calRanges))
			}
		})
	}
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestSharedPlanAgreesWithRun plans a load on each shared tier, calibrated
// against the server as `dedupbench plan -tiers redis|postgres` does (a
// Redis the test starts, the loopback PostgreSQL), then runs the load
// itself, its stream spanning the window as a shared tier's run must, and
// checks the plan against the run within 25 %: the heap (the memory tier
// at capacity and the calibrated fixed heap), the server's bytes (Redis:
// used_memory growth; PostgreSQL: pg_table_size + pg_indexes_size) and
// keys/s. The PostgreSQL plan holds the window's rows and one partition's
// (an expired row is swept at the next rotation) where the run holds the
// window's: with 10-minute partitions of a 2-hour window, 13/12 of it.
//
// Calibration and run alternate (which goes first alternating too); heap
// and bytes are compared as medians, keys/s as the median of each round's
// plan/run ratio (the pair nearest in time, so in the machine's load). The
// run's second half is timed, as the calibration's timed part follows a
// warm-up: both then mark into a tier holding about as many keys. On a
// shared 2-core machine the server and the client compete with whatever
// else runs, and one round's ratio strays by 30–50 % at times: the keys/s
// check allows the rounds' own scatter when it is wider than 25 % (twice
// the ratios' median absolute deviation), and logs it. A plan that
// overstated the rate by 1.6× failed it each time it was tried (medians
// 1.34 to 1.71 beside tolerances of 25 % to 30 %); by 1.4×, PostgreSQL's
// check failed it and Redis's, scattered by 35 % that time, did not. Heap
// and bytes are strict: 25 %.
func TestSharedPlanAgreesWithRun(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		server               func(t *testing.T) SharedServer
		rounds, memory       int
		keys, measure, store int64
		serverFigure         func(Plan) float64
	}{
		{"redis", func(t *testing.T) SharedServer { return SharedServer{Redis: redistest.Start(t).Client(t)} },
			5, 100_000, 200_000, 99_000, 90_000, func(p Plan) float64 { return p.RedisBytes }},
		{"postgres", func(t *testing.T) SharedServer { return SharedServer{Postgres: pgtest.Pool(t)} },
			5, 60_000, 90_000, 45_000, 40_500, func(p Plan) float64 { return p.PostgresBytes }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.server(t)
			memory := tc.memory
			window := 2 * time.Hour
			// The run's stream spans the window: the plan's IDs a day put
			// as many keys in it.
			in := PlanInput{IDsPerDay: float64(tc.keys) * float64(24*time.Hour) / float64(window), Window: window, Partition: 10 * time.Minute,
				DupRatio: 0.1, DupReach: 30 * time.Minute, Shape: UUIDv4, FalsePositive: 0.01, Shared: tc.name, MemoryCapacity: memory}
			var planHeap, runHeap, planBytes, runBytes, ratios []float64
			var pl Plan
			var res *Result
			for round := range tc.rounds {
				calibrate := func() {
					cal, cres, err := Calibrate(context.Background(), in, CalibrateConfig{Measure: tc.measure, Store: tc.store, Segments: 3, Shared: srv})
					if err != nil {
						t.Fatal(err)
					}
					if err := cres.Exactness(); err != nil {
						t.Fatal(err)
					}
					if pl, err = MakePlan(in, cal); err != nil {
						t.Fatal(err)
					}
				}
				measure := func() {
					var err error
					res, err = Run(context.Background(), RunConfig{
						Segments: 3,
						Warmup:   tc.keys / 2,
						Shared:   srv,
						Workload: WorkloadConfig{Keys: tc.keys, Shape: UUIDv4, DupRatio: 0.1, DupReach: 30 * time.Minute, Span: window, Seed: 11 + uint64(round)},
						Engine:   engine.Options{Window: in.Window, Partition: in.Partition, MemoryCapacity: memory},
					})
					if err != nil {
						t.Fatal(err)
					}
					if err := res.Exactness(); err != nil {
						t.Fatal(err)
					}
				}
				if round%2 == 0 {
					calibrate()
					measure()
				} else {
					measure()
					calibrate()
				}
				if res.Shared == nil || res.Shared.Keys != int64(res.Stats.Calls.Commits) || res.Stats.Memory.Entries < memory*95/100 {
					t.Fatalf("run: shared %+v, %d commits, %d memory entries: want every commit held and memory full", res.Shared, res.Stats.Calls.Commits, res.Stats.Memory.Entries)
				}
				planHeap, runHeap = append(planHeap, pl.HeapBytes), append(runHeap, float64(res.HeapBytes))
				planBytes, runBytes = append(planBytes, tc.serverFigure(pl)), append(runBytes, float64(res.Shared.Bytes))
				ratios = append(ratios, pl.CapacityPerDay/86400/res.KeysPerSec)
				t.Logf("round %d: plan %.0f keys/s (segments %.0f), heap %.2f MiB (fixed %.2f), server %.2f MiB (%.0f keys × %.1f B); run %.0f keys/s (segments %.0f), heap %.2f MiB, server %.2f MiB (%d keys × %.1f B)",
					round, pl.CapacityPerDay/86400, pl.Calibration.SegmentRates, pl.HeapBytes/(1<<20), pl.Calibration.FixedHeapBytes/(1<<20), tc.serverFigure(pl)/(1<<20), pl.KeysHeld, pl.SharedBytesPerKey,
					res.KeysPerSec, res.SegmentRates, float64(res.HeapBytes)/(1<<20), float64(res.Shared.Bytes)/(1<<20), res.Shared.Keys, res.Shared.BytesPerKey)
			}
			within(t, "heap (plan vs run, medians)", median(planHeap), median(runHeap))
			within(t, "server bytes (plan vs run, medians)", median(planBytes), median(runBytes))
			r := median(ratios)
			dev := make([]float64, len(ratios))
			for i, x := range ratios {
				dev[i] = math.Abs(x - r)
			}
			scatter := 2 * median(dev)
			tolerance := max(0.25, scatter)
			t.Logf("keys/s, plan / run of each round: %.2f, median %.2f; scatter (twice the median absolute deviation) %.0f%%, tolerance %.0f%%", ratios, r, 100*scatter, 100*tolerance)
			if math.Abs(r-1) > tolerance {
				t.Errorf("keys/s: the plan's median ratio to the run is %.2f, beyond %.0f%%", r, 100*tolerance)
			}
		})
	}
}
