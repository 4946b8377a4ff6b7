package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

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
		{IDsPerDay: 1, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01, KeySize: 20},                    // shorter than a UUID
		{IDsPerDay: 1, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01, DupReach: -time.Second},         // reach
		{IDsPerDay: 1, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01, Shape: Business, KeySize: 2000}, // longer than the engine takes
		{IDsPerDay: math.NaN(), Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01},
		{IDsPerDay: math.Inf(1), Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01},
		{IDsPerDay: 0.001, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01},
		{IDsPerDay: 1e6, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01, MemoryCapacity: -5},
		{IDsPerDay: 1e6, Window: time.Hour, Partition: time.Hour, FalsePositive: 1e-12},                         // more hashes than a filter takes
		{IDsPerDay: 1e6, Window: time.Hour, Partition: time.Hour, FalsePositive: 0.01, DupReach: 2 * time.Hour}, // past the window
	} {
		if _, err := MakePlan(in, Calibration{}); !errors.Is(err, ErrPlan) {
			t.Errorf("%+v: %v", in, err)
		}
	}
}

// TestPlan500MPerDay pins the worked example of docs/dedupbench.md: 500M IDs/day,
// 7-day window in daily partitions, 10 % duplicates, 1 % false positives.
func TestPlan500MPerDay(t *testing.T) {
	pl, err := MakePlan(PlanInput{IDsPerDay: 500e6, Window: 7 * 24 * time.Hour, Partition: 24 * time.Hour, DupRatio: 0.1,
		KeySize: 36, FalsePositive: 0.01, Tiers: engine.Default, MemoryCapacity: 1 << 20}, Calibration{KeysPerSec: 300e3, TableBytesPerKey: 20})
	if err != nil {
		t.Fatal(err)
	}
	if pl.Live != 8 || pl.KeysPerPartition != 450e6 || math.Abs(pl.BloomBitsPerKey-15.5) > 0.1 || pl.BloomK != 8 {
		t.Fatalf("plan: live %d, %.3g keys/partition, %.2f bits/key, k %d", pl.Live, pl.KeysPerPartition, pl.BloomBitsPerKey, pl.BloomK)
	}
	if gib := pl.BloomBytes / (1 << 30); gib < 6.3 || gib > 6.8 {
		t.Fatalf("bloom %.2f GiB", gib)
	}
}

// TestPlanDiskAndRedisModel pins the disk model's arithmetic: SSTs per
// held key; the WAL's disk as the calibration allocated it while a
// memtable's WAL (one memtable, or one partition when partitions are
// dropped sooner than memtables fill) fits one preallocation block, in
// proportion beyond, a block a file without a calibrated figure; the
// filters' files; the calibration's fixed bytes; Redis memory from the
// shape's mean key length; the derate only for a store larger than the
// calibration's.
func TestPlanDiskAndRedisModel(t *testing.T) {
	in := PlanInput{IDsPerDay: 1e6, Window: 24 * time.Hour, Partition: 6 * time.Hour, DupRatio: 0.1, FalsePositive: 0.01, Tiers: engine.Default}
	cal := Calibration{KeysPerSec: 1000, StoreKeys: 1_125_000, TableBytesPerKey: 10, WALBytesPerKey: 30, WALFileKeys: 100_000, WALDiskBytes: 300e6, FixedDiskBytes: 1000}
	pl, err := MakePlan(in, cal)
	if err != nil {
		t.Fatal(err)
	}
	// 1e6 × 0.9 / 4 = 225,000 keys per partition, 5 live.
	if pl.KeysHeld != 1_125_000 || pl.TableBytes != 11_250_000 || pl.WALFileBytes != 3_000_000 || pl.WALBytes != 300e6 ||
		pl.FilterFileBytes != pl.BloomBytes || pl.BloomBytes == 0 ||
		pl.DiskBytes != 11_250_000+300e6+pl.BloomBytes+1000 || pl.Derate != 1 || pl.CapacityPerDay != 1000*86400 {
		t.Fatalf("plan %+v", pl)
	}
	// A memtable's WAL within one block (1.1 × the memtable size), then
	// over it: two blocks a file.
	block := 1.1 * float64(pebble.DefaultMemTableSize)
	big := cal
	big.WALBytesPerKey = math.Floor(0.9 * block / 100_000)
	if pl, _ := MakePlan(in, big); pl.WALFileBytes != big.WALBytesPerKey*100_000 || pl.WALBytes != 300e6 {
		t.Fatalf("WAL file of %v: %v", pl.WALFileBytes, pl.WALBytes)
	}
	big.WALBytesPerKey = math.Floor(1.5 * block / 100_000)
	if pl, _ := MakePlan(in, big); pl.WALBytes != 2*300e6 {
		t.Fatalf("WAL file of %v: %v, want two blocks a file", pl.WALFileBytes, pl.WALBytes)
	}
	big.WALDiskBytes = 0
	if pl, _ := MakePlan(in, big); pl.WALBytes != (RecycledWALFiles+1)*2*block {
		t.Fatalf("WAL without a calibrated figure: %v", pl.WALBytes)
	}
	cal.WALFileKeys = 0 // no flush seen: bounded by the memtable, here beyond a partition
	if pl, _ = MakePlan(in, cal); pl.WALFileBytes != 30*225_000 {
		t.Fatalf("WAL file %v", pl.WALFileBytes)
	}
	in.IDsPerDay = 1e7 // ten times the calibration's store
	if pl, _ = MakePlan(in, cal); pl.Derate != LargeStoreFactor || pl.CapacityPerDay != 1000*86400*LargeStoreFactor {
		t.Fatalf("derate %v", pl.Derate)
	}
	// The range: the slowest and fastest segments, derated; within the
	// tenfold of the measured derate's store no further step.
	cal.SegmentRates = []float64{800, 1000, 1300}
	pl, _ = MakePlan(in, cal)
	if lo, hi := pl.CapacityRange[0]/86400, pl.CapacityRange[1]/86400; math.Abs(lo-800*LargeStoreFactor) > 1e-6 || math.Abs(hi-1300*LargeStoreFactor) > 1e-6 ||
		math.Abs(pl.HeadroomRange[0]-pl.CapacityRange[0]/in.IDsPerDay) > 1e-9 {
		t.Fatalf("range %v keys/s, headroom %v", pl.CapacityRange, pl.HeadroomRange)
	}
	// A store 1000× the calibration's: two more steps at the low end
	// (1000/90 > 10, 100/90 > 1), none at the high end.
	in.IDsPerDay = 1e9
	pl, _ = MakePlan(in, cal)
	if lo, hi := pl.CapacityRange[0]/86400, pl.CapacityRange[1]/86400; math.Abs(lo-800*math.Pow(LargeStoreFactor, 3)) > 1e-6 || math.Abs(hi-1300*LargeStoreFactor) > 1e-6 {
		t.Fatalf("range at 1000×: %v keys/s", []float64{lo, hi})
	}
	in.IDsPerDay, cal.SegmentRates = 1e7, nil
	in.Shared, in.Shape = SharedRedis, Snowflake
	if pl, _ = MakePlan(in, cal); pl.KeyBytes < 18 || pl.KeyBytes > 20 || pl.RedisBytes != pl.KeysHeld*(RedisFixedBytes+pl.KeyBytes) {
		t.Fatalf("redis: %.1f-byte keys, %.0f bytes", pl.KeyBytes, pl.RedisBytes)
	}
}

// TestPlanSharedModel pins the shared tiers' model: Redis holds the
// window's keys (each expires by its TTL), PostgreSQL the window's and one
// partition's (an expired row is swept at the next rotation); the bytes
// per key and the fixed heap are the calibration's when it measured them,
// the constants otherwise; no derate, no Bloom filters, no disk; shared
// tiers other than these, or beside other tiers or an archive, are refused.
func TestPlanSharedModel(t *testing.T) {
	in := PlanInput{IDsPerDay: 1e7, Window: 24 * time.Hour, Partition: 6 * time.Hour, DupRatio: 0.1, FalsePositive: 0.01,
		KeySize: 36, MemoryCapacity: 1 << 20, Shared: SharedRedis}
	cal := Calibration{KeysPerSec: 1000, StoreKeys: 1000}
	pl, err := MakePlan(in, cal)
	if err != nil {
		t.Fatal(err)
	}
	if pl.KeysHeld != 9e6 || pl.RedisBytes != 9e6*(RedisFixedBytes+36) || pl.PostgresBytes != 0 || pl.HeapBytes != pl.MemoryBytes+SharedFixedHeapBytes ||
		pl.Derate != 1 || pl.BloomBytes != 0 || pl.DiskBytes != 0 || pl.OffHeapBytes != 0 {
		t.Fatalf("redis plan %+v", pl)
	}
	in.Shared = SharedPostgres
	if pl, err = MakePlan(in, cal); err != nil || pl.KeysHeld != 9e6*30/24 || pl.PostgresBytes != pl.KeysHeld*(PostgresFixedBytes+36) || pl.RedisBytes != 0 {
		t.Fatalf("postgres plan %+v, %v", pl, err)
	}
	cal.SharedBytesPerKey, cal.FixedHeapBytes = 300, 1e6
	if pl, err = MakePlan(in, cal); err != nil || pl.PostgresBytes != pl.KeysHeld*300 || pl.SharedBytesPerKey != 300 || pl.HeapBytes != pl.MemoryBytes+1e6 {
		t.Fatalf("calibrated postgres plan %+v, %v", pl, err)
	}
	for _, bad := range []PlanInput{
		func() PlanInput { in := in; in.Shared = "memcached"; return in }(),
		func() PlanInput { in := in; in.Tiers = engine.BloomOnly; return in }(),
		func() PlanInput { in := in; in.ArchiveWindow = 48 * time.Hour; return in }(),
	} {
		if _, err := MakePlan(bad, cal); !errors.Is(err, ErrPlan) {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	// A calibration runs against the plan's own tier.
	if _, _, err := Calibrate(context.Background(), in, CalibrateConfig{Measure: 30_000}); !errors.Is(err, ErrPlan) {
		t.Errorf("a PostgreSQL plan calibrated without a server: %v", err)
	}
}

// TestPlanSaysItsSettings: a plan names the engine settings that realise
// it (the filters sized for its keys per partition, not the library's
// default) and the GOMEMLIMIT it assumes, and is judged by the peak RSS
// that limit allows, not by the live heap.
func TestPlanSaysItsSettings(t *testing.T) {
	in := PlanInput{IDsPerDay: 5e8, Window: 168 * time.Hour, Partition: 24 * time.Hour, DupRatio: 0.1, FalsePositive: 0.01, Tiers: engine.Default, MemoryCapacity: 1 << 20}
	pl, err := MakePlan(in, Calibration{KeysPerSec: 1000, StoreKeys: 1e6, TableBytesPerKey: 10, WALBytesPerKey: 30})
	if err != nil {
		t.Fatal(err)
	}
	o := pl.Options()
	for _, want := range []string{"Backend: embedded.Dir(dir)", "Window: 168 * time.Hour", "Partition: 24 * time.Hour",
		fmt.Sprintf("ExpectedKeys: %d,", int64(math.Ceil(pl.KeysPerPartition))), "FalsePositive: 0.01", "MemoryCapacity: 1048576", "GOMEMLIMIT=" + memLimit(pl.MemoryLimitBytes)} {
		if !strings.Contains(o, want) {
			t.Errorf("settings %q lack %q", o, want)
		}
	}
	if pl.KeysPerPartition < 10*float64(bloom.DefaultExpectedKeys) {
		t.Fatalf("a 5e8/day plan of %.3g keys a partition: the default ExpectedKeys would do", pl.KeysPerPartition)
	}
	if pl.MemoryLimitBytes < pl.HeapBytes*GCHeadroom || pl.MemoryLimitBytes > pl.HeapBytes*GCHeadroom+(1<<20) ||
		pl.PeakRSSBytes != pl.MemoryLimitBytes+pl.OffHeapBytes+pl.ProgramBytes || pl.PeakRSSNoLimitBytes != 2*pl.HeapBytes+pl.OffHeapBytes+pl.ProgramBytes {
		t.Fatalf("memory: heap %v, limit %v, peak %v, without the limit %v", pl.HeapBytes, pl.MemoryLimitBytes, pl.PeakRSSBytes, pl.PeakRSSNoLimitBytes)
	}
	// Judged by the peak: a machine whose 80 % holds the live heap and the
	// off-heap, but not the collector's room, does not fit.
	m := Machine{MemoryBytes: (pl.HeapBytes + pl.OffHeapBytes) / FitShare * 1.01, MemorySource: "test"}
	if f := CheckFit(pl, m); f.MemoryFits {
		t.Fatalf("fits %.2f GiB with a peak of %.2f GiB", m.MemoryBytes/(1<<30), pl.PeakRSSBytes/(1<<30))
	}
	for s, want := range map[float64]string{8 << 30: "8GiB", 1.5 * (1 << 30): "1536MiB", 100<<20 + 1: "101MiB"} {
		if got := memLimit(s); got != want {
			t.Errorf("memLimit(%v) = %s, want %s", s, got, want)
		}
	}
}

// TestPlanSmallHeapLimit: a small load's GOMEMLIMIT leaves the collector
// at least GCMinRoomBytes above the live heap (× 1.25 of a 26 MiB heap
// collected ~700 times a simulated day at 0.6 of the keys/s), and its
// peak RSS counts the heap at twice its live size, which stays below that
// limit, with Pebble's memory as full as the load fills it (less than two
// full memtables and a full cache) and the program's code.
func TestPlanSmallHeapLimit(t *testing.T) {
	in := PlanInput{IDsPerDay: 1e6, Window: 24 * time.Hour, Partition: 6 * time.Hour, DupRatio: 0.1, FalsePositive: 0.01, Tiers: engine.Default, MemoryCapacity: 300_000}
	pl, err := MakePlan(in, Calibration{KeysPerSec: 1000, StoreKeys: 1e6, TableBytesPerKey: 14, WALBytesPerKey: 75, ProgramBytes: 37 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if pl.MemoryLimitBytes < pl.HeapBytes+GCMinRoomBytes {
		t.Fatalf("heap %.1f MiB: GOMEMLIMIT %.1f MiB leaves less than %d MiB", pl.HeapBytes/(1<<20), pl.MemoryLimitBytes/(1<<20), GCMinRoomBytes>>20)
	}
	if want := 2*pl.HeapBytes + pl.OffHeapBytes + pl.ProgramBytes; pl.PeakRSSBytes != want || pl.ProgramBytes != 37<<20 {
		t.Fatalf("peak RSS %.1f MiB, want %.1f (twice the heap, the off-heap, the code)", pl.PeakRSSBytes/(1<<20), want/(1<<20))
	}
	if full := float64(2*pebble.DefaultMemTableSize + pebble.DefaultCacheSize); pl.OffHeapBytes >= full || pl.OffHeapBytes <= 0 {
		t.Fatalf("off-heap %.1f MiB for %.3g keys a partition: want some, below two full memtables and a full cache", pl.OffHeapBytes/(1<<20), pl.KeysPerPartition)
	}
}
