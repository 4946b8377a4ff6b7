package bench

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
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
