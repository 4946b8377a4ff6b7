package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	bitsbloom "github.com/bits-and-blooms/bloom/v3"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Measured constants of the model. Each names the test or benchmark that
// measures it, so a change that moves it shows up there first.
const (
	// MemoryEntryBytes is the heap of one cached key in the memory tier
	// (tier/memory TestHeapBytesPerEntry: 66.5 B at 1M entries, full 128-bit
	// digests included).
	MemoryEntryBytes = 66.5
	// RedisFixedBytes plus the key size is Redis's memory per committed key:
	// the default 10-byte prefix, the NUL and namespace-length bytes, the
	// 17-byte value, the TTL and Redis's own overhead (bench
	// TestRedisBytesPerKey: 198 B for a 36-byte key, and checks this
	// within 15 %).
	RedisFixedBytes = 162
	// SteadyStateFactor derates a calibration's keys/s to a store holding a
	// full window: the 100M-key, 7-simulated-day scale run in the README
	// sustained 232,495 keys/s where the 2M-key calibration of the same
	// shape measured 357,148 (0.65).
	SteadyStateFactor = 0.65
	// PebbleOffHeapBytes is Pebble's memory outside the Go heap: two 64 MiB
	// memtables and the 64 MiB block cache.
	PebbleOffHeapBytes = 3 * 64 << 20
	// SteadyWALBytes is the WAL Pebble keeps once a store has flushed many
	// memtables: the live WAL and recycled ones, about 4.5 memtables of
	// 64 MiB (measured beside Pebble: 282 MiB). Small stores hold less: the
	// calibration's WAL bytes per key, up to this bound.
	SteadyWALBytes = 288 << 20
	// FixedHeapBytes is the heap of an engine beyond its tiers: Pebble's
	// Go-heap structures, batch buffers, the runtime (measured by
	// TestPlanAgreesWithRun: ≈ 4 MiB).
	FixedHeapBytes = 4 << 20
)

// PlanInput is the load to size for.
type PlanInput struct {
	IDsPerDay         float64
	Window, Partition time.Duration
	DupRatio          float64
	KeySize           int
	FalsePositive     float64
	Tiers             engine.Tiers
	MemoryCapacity    int
}

// Calibration is what a short run on this machine measured.
type Calibration struct {
	KeysPerSec float64
	// TableBytesPerKey is the compacted SST size per key; WALBytesPerKey
	// the live WAL per key written, which stops growing at SteadyWALBytes.
	TableBytesPerKey float64
	WALBytesPerKey   float64
	Keys             int64
	Elapsed          time.Duration
}

// Plan is the sizing of every tier for a PlanInput.
type Plan struct {
	Input PlanInput
	// Live is the number of retention partitions kept.
	Live int
	// KeysPerPartition are the distinct keys committed per partition;
	// KeysHeld the most the durable tier holds (Live partitions).
	KeysPerPartition, KeysHeld float64
	// Bloom sizing: bits per key, hashes, each filter's and the window's
	// false-positive rate, and the memory of the Live filters.
	BloomBitsPerKey                 float64
	BloomK                          int
	BloomPartitionFP, BloomWindowFP float64
	BloomBytes                      float64
	MemoryBytes                     float64 // memory tier at capacity
	HeapBytes                       float64 // memory + bloom
	OffHeapBytes                    float64 // Pebble's memtables and cache
	DiskBytes                       float64 // Pebble, default configuration: compacted SSTs of KeysHeld + the fixed part
	RedisBytes                      float64 // Redis configuration
	Calibration                     Calibration
	CapacityPerDay, Headroom        float64 // keys/day this machine sustains, and its ratio to IDsPerDay
}

// ErrPlan reports an invalid PlanInput.
var ErrPlan = errors.New("bench: invalid plan input")

// MakePlan sizes the tiers for in, using cal for throughput and disk.
func MakePlan(in PlanInput, cal Calibration) (Plan, error) {
	parts, err := tier.NewPartitions(in.Window, in.Partition)
	if err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	if in.IDsPerDay <= 0 || in.DupRatio < 0 || in.DupRatio >= 1 || !(in.FalsePositive > 0 && in.FalsePositive < 1) || in.KeySize <= 0 {
		return Plan{}, fmt.Errorf("%w: %+v", ErrPlan, in)
	}
	p := Plan{Input: in, Live: parts.Live, Calibration: cal}
	p.KeysPerPartition = in.IDsPerDay * (1 - in.DupRatio) * float64(in.Partition) / float64(24*time.Hour)
	p.KeysHeld = p.KeysPerPartition * float64(parts.Live)
	if in.Tiers == engine.Default || in.Tiers == engine.BloomOnly {
		p.BloomPartitionFP = bloom.PerFilter(in.FalsePositive, parts.Live)
		m, k := bitsbloom.EstimateParameters(uint(math.Max(1, p.KeysPerPartition)), p.BloomPartitionFP)
		m = (m + 63) &^ 63
		p.BloomK = int(k)
		p.BloomBitsPerKey = float64(m) / math.Max(1, p.KeysPerPartition)
		p.BloomWindowFP = 1 - math.Pow(1-p.BloomPartitionFP, float64(parts.Live))
		p.BloomBytes = float64(m/8) * float64(parts.Live)
	}
	if in.Tiers != engine.BloomOnly {
		capacity := in.MemoryCapacity
		if capacity == 0 {
			capacity = 1 << 20
		}
		p.MemoryBytes = float64(capacity) * MemoryEntryBytes
	}
	p.HeapBytes = p.MemoryBytes + p.BloomBytes + FixedHeapBytes
	switch in.Tiers {
	case engine.Default:
		p.OffHeapBytes = PebbleOffHeapBytes
		// Live SSTs, plus the WAL: what a small store holds live, or the
		// steady state's live and recycled files for a large one.
		tables := p.KeysHeld * cal.TableBytesPerKey
		wal := p.KeysHeld * cal.WALBytesPerKey
		if tables > SteadyWALBytes {
			wal = SteadyWALBytes
		}
		p.DiskBytes = tables + wal
	case engine.Redis:
		p.RedisBytes = p.KeysHeld * float64(RedisFixedBytes+in.KeySize)
	}
	// A short calibration on an empty store runs faster than a store that
	// holds a full window: derate by the measured factor.
	p.CapacityPerDay = cal.KeysPerSec * SteadyStateFactor * 86400
	p.Headroom = p.CapacityPerDay / in.IDsPerDay
	return p, nil
}

// Calibrate runs keys messages of the plan's shape through the planned
// configuration on this machine and returns what it measured.
func Calibrate(ctx context.Context, in PlanInput, keys int64, shape KeyShape) (Calibration, *Result, error) {
	perPartition := float64(keys) * (1 - in.DupRatio) * float64(in.Partition) / float64(24*time.Hour)
	rc := RunConfig{
		Compact:  true,
		Workload: WorkloadConfig{Keys: keys, Shape: shape, DupRatio: in.DupRatio, DupReach: time.Hour, Span: 24 * time.Hour, Seed: 7},
		Engine: engine.Options{Tiers: in.Tiers, Window: in.Window, Partition: in.Partition, FalsePositive: in.FalsePositive,
			MemoryCapacity: in.MemoryCapacity, ExpectedKeys: max(1000, int(perPartition))},
	}
	res, err := Run(ctx, rc)
	if err != nil {
		return Calibration{}, nil, err
	}
	return CalibrationOf(res), res, nil
}

// CalibrationOf takes a calibration from a run's measurements (a run with
// RunConfig.Compact, for the disk figures).
func CalibrationOf(res *Result) Calibration {
	cal := Calibration{KeysPerSec: res.KeysPerSec, TableBytesPerKey: res.TableBytesPerKey, Keys: res.Keys, Elapsed: res.Elapsed}
	if c := res.Stats.Commits; c > 0 {
		cal.WALBytesPerKey = float64(res.WALBytes) / float64(c)
	}
	return cal
}
