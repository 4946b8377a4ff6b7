package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/archive"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// Measured constants of the model. Each names the test or benchmark that
// measures it, so a change that moves it shows up there first.
const (
	// MemoryEntryBytes is the heap of one cached key in the memory tier
	// (tier/memory TestHeapBytesPerEntry: 70.5 B at 1M entries, full 128-bit
	// digests and the index's 32-bit hashes included).
	MemoryEntryBytes = 70.5
	// RedisFixedBytes plus the key size is Redis's memory per committed key:
	// the default 10-byte prefix, the NUL and namespace-length bytes, the
	// 17-byte value, the TTL and Redis's own overhead (bench
	// TestRedisBytesPerKey: 198 B for a 36-byte key, and checks this
	// within 15 %). A plan calibrated on a Redis uses the bytes it
	// measured there instead (Calibration.SharedBytesPerKey).
	RedisFixedBytes = 162
	// PostgresFixedBytes plus the key size is the PostgreSQL tier's table
	// and primary key index per committed row (pg_table_size +
	// pg_indexes_size): the tuple header and line pointer, the token,
	// expiry and state columns, the key in the heap and again in the
	// B-tree, at the fill random inserts leave (bench
	// TestPostgresBytesPerKey checks it within 15 % for 36-byte keys). A
	// plan calibrated on a PostgreSQL uses the bytes it measured there
	// instead.
	PostgresFixedBytes = 175
	// SharedFixedHeapBytes is the heap of an engine on a shared tier
	// beyond its memory tier, for a plan without a calibration: the
	// client's connections and the buffers of 8 batches of 256 keys in
	// flight (Run's default on 2 cores), the runtime; each batch in flight
	// holds about 0.45 MiB of it (TestSharedPlanAgreesWithRun logs the
	// calibrated figure, Calibration.FixedHeapBytes, which a plan uses
	// instead).
	SharedFixedHeapBytes = 5 << 20
	// LargeStoreFactor derates the calibrated keys/s when the planned
	// store holds more keys than the calibration's (capped by
	// CalibrateConfig.Store): a larger store has deeper levels, more
	// compaction work and fewer cache hits. Measured: a 60M-key run over
	// two simulated days (33.75M keys held) sustained 239,436 keys/s on its
	// second day where the 3.75M-key steady-state calibration of the same
	// load measured 273,074 (0.877; docs/dedupbench.md, "Scale run").
	LargeStoreFactor = 0.87
	// MemtableBytesPerWALByte is the resident memtable memory for each
	// byte of records its WAL holds: the skiplist's nodes and the arena's
	// alignment beside the records. An estimate, checked against one run:
	// `dedupbench plan` of 1e6 IDs/day from a sample of 48-byte business
	// keys (docs/dedupbench.md, "Plan against run on your own keys") said
	// 153.7 MiB of peak RSS; `dedupbench run` of that load with its
	// settings peaked at 168.4 MiB (VmHWM).
	MemtableBytesPerWALByte = 2
	// RecycledWALFiles is the number of WAL files Pebble keeps for reuse
	// once a store has flushed a few memtables (its MemTableStopWritesThreshold
	// plus one): with the live WAL, half full on average, a running store
	// holds 3.5 flushed memtables' worth of WAL.
	RecycledWALFiles = 3
	// GCHeadroom is the room above the live heap the plan gives the Go
	// collector: it assumes GOMEMLIMIT set to the heap × GCHeadroom, so
	// the process peaks there instead of at twice its live heap (the
	// default GOGC's; dedupbench run prints a run's live heap and peak
	// RSS side by side).
	GCHeadroom = 1.25
	// GCMinRoomBytes is the least room the plan's GOMEMLIMIT leaves above
	// the live heap: with less, a small heap is collected all the time.
	// Measured (docs/dedupbench.md, "Plan against run on your own keys"):
	// a 24 MiB live heap under GOMEMLIMIT=33MiB (× 1.25) ran about 700
	// collections a simulated day at 0.57–0.62 of the keys/s of the same
	// run without a limit; under 90MiB, 0 to 3 and the same keys/s.
	GCMinRoomBytes = 64 << 20
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
	// DupReach is how far back duplicates reach (zero means an hour): with
	// the daily volume it says how many keys back a duplicate lies, and so
	// whether the memory tier or the store answers it.
	DupReach time.Duration
	// Shape and KeySize are the keys' form (see WorkloadConfig): the
	// store keeps the keys themselves, so both set the disk per key, the
	// Redis memory per key and the throughput. KeySize zero is the shape's
	// natural length.
	Shape   KeyShape
	KeySize int
	// Sample, if set, replaces Shape and KeySize: the calibration draws
	// its keys from a sample of the user's own (see Sample), and the plan
	// assumes the sample's mean key length.
	Sample        *Sample
	FalsePositive float64
	Tiers         engine.Tiers
	// Shared names a shared tier the plan is for (SharedRedis or
	// SharedPostgres), behind memory, with Tiers Default; empty: the tiers
	// Tiers names.
	Shared         string
	MemoryCapacity int
	// ArchiveWindow, when set, plans an archive behind the window
	// (engine.Options.Archive) keeping keys that long; ArchiveFalsePositive
	// is its filter's target (zero: 0.01).
	ArchiveWindow        time.Duration
	ArchiveFalsePositive float64
	// Sliding plans a sliding window (engine.NamespaceOptions.Sliding on
	// the default namespace): a duplicate that arrives in a later
	// partition than its key's last commit re-commits it, one more write
	// and one more record in the store and the current filter. The
	// embedded store, memory or bloom-only; not a shared tier.
	Sliding bool
}

// RefreshShare is the share of duplicates that refresh their key in a
// sliding window: a duplicate reaching d back (uniform up to reach, as
// the workload draws them) from a key committed at a uniform moment of
// its partition lands in a later partition with probability
// min(1, d/partition). Each duplicate is taken against its key's first
// commit, so a key refreshed before counts again: it errs high.
func RefreshShare(reach, partition time.Duration) float64 {
	r, p := float64(reach), float64(partition)
	if r <= p {
		return r / (2 * p)
	}
	return 1 - p/(2*r)
}

// freshPerPartition is the distinct keys a partition gets, refreshes left
// out.
func (p Plan) freshPerPartition() float64 {
	return max(p.KeysPerPartition-p.RefreshesPerDay*float64(p.Input.Partition)/float64(24*time.Hour), 1)
}

// SharedRedis is PlanInput.Shared for the Redis tier.
const SharedRedis = "redis"

// workload returns the calibration stream's shape for in: n messages.
func (in PlanInput) workload(n int64, span time.Duration) WorkloadConfig {
	reach := in.DupReach
	if reach == 0 {
		reach = time.Hour
	}
	// The same number of keys back as the planned load's reach, in the
	// calibration's (faster) simulated time.
	keysBack := in.IDsPerDay * float64(reach) / float64(24*time.Hour)
	simReach := time.Duration(keysBack / max(float64(n), 1) * float64(span))
	return WorkloadConfig{Keys: n, Shape: in.Shape, KeySize: in.KeySize, Sample: in.Sample, DupRatio: in.DupRatio,
		DupReach: min(max(simReach, time.Millisecond), span), Span: span, Seed: 7}
}

// meanKeySize is the mean key length of in's shape and size.
func (in PlanInput) meanKeySize() float64 {
	if in.Sample != nil {
		return in.Sample.MeanKeySize()
	}
	if in.KeySize > 0 {
		return float64(in.KeySize)
	}
	st, err := NewStream(WorkloadConfig{Keys: 4096, Shape: in.Shape, Span: time.Hour, Seed: 7})
	if err != nil {
		return 0
	}
	keys, _ := st.Batch(nil, nil, 4096)
	n := 0
	for _, k := range keys {
		n += len(k)
	}
	return float64(n) / float64(len(keys))
}

// Calibration is what a run at steady state measured on this machine.
type Calibration struct {
	// KeysPerSec is the median rate of the measured segments
	// (SegmentRates), after a warm-up that filled the store and the
	// filters.
	KeysPerSec   float64
	SegmentRates []float64
	// StoreKeys is the number of keys the calibration's store (or shared
	// tier) held at the end; TableBytesPerKey its SSTs per held key, compacted after the
	// timed part (which also removes dropped partitions' data: as the LSM
	// stands, a drop's range is reclaimed a little later).
	StoreKeys        int64
	TableBytesPerKey float64
	// WALBytesPerKey is the WAL written per committed key; WALFileKeys the
	// keys one flushed memtable's WAL file held (zero if the calibration
	// flushed none).
	WALBytesPerKey, WALFileKeys float64
	// WALDiskBytes is the disk the WAL took (Stats.Store.Disk.WAL: live
	// and recycled files with their preallocation), the median over the
	// run's samples. FixedDiskBytes is the median of the directory's other
	// files (Stats.Store.Disk.Other): the manifest and options files,
	// obsolete SSTs, compactions in progress.
	WALDiskBytes, FixedDiskBytes float64
	// ProgramBytes is the calibrating process's resident code and mapped
	// files (RssFile in /proc/self/status), a stand-in for the consumer's
	// own program, which the OS counts in its resident memory too.
	ProgramBytes float64
	// SharedBytesPerKey is, for a shared tier, what a held key took on
	// the calibration's server (SharedResult.BytesPerKey: Redis's
	// used_memory, PostgreSQL's table and index); zero otherwise.
	SharedBytesPerKey float64
	// FixedHeapBytes is, for a shared tier, the calibration's heap beyond
	// its memory tier's entries (MemoryEntryBytes each): the client's
	// connections and the buffers of the batches in flight (Run's
	// default, 4 per CPU); zero otherwise.
	FixedHeapBytes float64
	// Keys is the number of measured messages, Elapsed their time.
	Keys    int64
	Elapsed time.Duration
}

// Plan is the sizing of every tier for a PlanInput.
type Plan struct {
	Input PlanInput
	// KeyBytes is the mean key length the plan assumes.
	KeyBytes float64
	// Live is the number of retention partitions kept.
	Live int
	// KeysPerPartition are the distinct keys committed per partition;
	// KeysHeld the most the exact tier holds: Live partitions for the
	// embedded store (a partition is dropped once it left the window) and
	// for PostgreSQL (a row that expired is swept at the next partition
	// rotation), the window's keys for Redis (each expires by its TTL).
	KeysPerPartition, KeysHeld float64
	// RefreshesPerDay are the refreshing duplicates of a sliding window
	// (PlanInput.Sliding), each a record: counted in KeysPerPartition and
	// so in the filters and the disk; its cost in keys/s is the
	// calibration's, which runs with the window sliding.
	RefreshesPerDay float64
	// Bloom sizing: bits per key, hashes, each filter's and the window's
	// false-positive rate, and the memory of the Live filters.
	BloomBitsPerKey                 float64
	BloomK                          int
	BloomPartitionFP, BloomWindowFP float64
	BloomBytes                      float64
	MemoryBytes                     float64 // memory tier at capacity
	HeapBytes                       float64 // memory + bloom + the engine's fixed heap
	OffHeapBytes                    float64 // Pebble's memtables and cache, as resident as this load holds them
	// ProgramBytes is the program's own resident code and mapped files
	// (Calibration.ProgramBytes).
	ProgramBytes float64
	// MemoryLimitBytes is the GOMEMLIMIT the plan assumes: the heap with
	// GCHeadroom, and at least GCMinRoomBytes above it, rounded up to a
	// MiB. PeakRSSBytes is the process's peak resident memory with it set
	// (the heap at the limit, or at twice its live size when that is
	// lower; the off-heap; the program's code), which the plan is judged
	// by; PeakRSSNoLimitBytes without it, when the collector (GOGC=100)
	// lets the heap grow to twice its live size.
	MemoryLimitBytes, PeakRSSBytes, PeakRSSNoLimitBytes float64
	// DiskBytes is what Stats.Store.DiskBytes (and du) will report for a
	// running store holding KeysHeld keys: TableBytes of SSTs; WALBytes
	// of live and recycled WAL files as the OS allocates them, the
	// calibration's WALDiskBytes (Pebble preallocates each file in blocks
	// of 1.1 × its memtable size, so the WAL's disk follows its number of
	// files, not the load, while one memtable's WAL, WALFileBytes, fits
	// one block, else in proportion); FilterFileBytes of the filters' files
	// (sealed partitions and checkpoints of the open ones: the filters'
	// memory, BloomBytes); and the calibration's FixedDiskBytes.
	DiskBytes, TableBytes, WALBytes, WALFileBytes, FilterFileBytes float64
	// RedisBytes (SharedRedis) is Redis's used_memory for KeysHeld keys,
	// PostgresBytes (SharedPostgres) the tier's table and index for
	// KeysHeld rows, both at SharedBytesPerKey: the calibration's
	// measurement on the server, or RedisFixedBytes or PostgresFixedBytes
	// plus the key without one.
	RedisBytes, PostgresBytes, SharedBytesPerKey float64
	// The archive (PlanInput.ArchiveWindow): the keys it holds past the
	// window, its filter's layout, memory (on the heap, in HeapBytes) and
	// false-positive rate, and its disk: the archived tables, at the
	// calibration's bytes a key, and one filter blob a slot.
	ArchiveKeysHeld                    float64
	ArchiveLayout                      archive.Layout
	ArchiveFilterBytes, ArchiveFP      float64
	ArchiveDiskBytes, ArchiveBlobBytes float64
	Calibration                        Calibration
	// Derate is the factor applied to the calibrated rate: 1, or
	// LargeStoreFactor when the planned store outgrows the calibration's.
	Derate float64
	// CapacityPerDay is the keys a day this machine sustains in the
	// steady state: the rate on the last day of a full window (the
	// calibration is timed once every live partition holds its keys, each
	// sealed one moved to the cold database, the open one filling), times
	// Derate. Headroom is its ratio to IDsPerDay.
	CapacityPerDay, Headroom float64
	// CapacityRange is the low and high CapacityPerDay the calibration
	// supports, HeadroomRange the same as headroom: the slowest and the
	// fastest of its segments (SegmentRates), times Derate, and, for the
	// low end, one more LargeStoreFactor for each tenfold the planned store
	// exceeds MeasuredDerateRatio times the calibration's (the derate was
	// measured no further).
	CapacityRange, HeadroomRange [2]float64
}

// MeasuredDerateRatio is how many times the calibration's store the store
// of the run that measured LargeStoreFactor held (33.75M keys against
// 3.75M).
const MeasuredDerateRatio = 9

// ErrPlan reports an invalid PlanInput.
var ErrPlan = errors.New("bench: invalid plan input")

// MakePlan sizes the tiers for in, using cal for throughput and disk.
func MakePlan(in PlanInput, cal Calibration) (Plan, error) {
	parts, err := tier.NewPartitions(in.Window, in.Partition)
	if err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	if !(in.IDsPerDay >= 1) || math.IsInf(in.IDsPerDay, 0) || !(in.DupRatio >= 0 && in.DupRatio < 1) || in.DupReach < 0 || in.DupReach > in.Window {
		return Plan{}, fmt.Errorf("%w: IDsPerDay %v must be finite and at least 1, DupRatio %v in [0, 1), DupReach %v in [0, Window %v]",
			ErrPlan, in.IDsPerDay, in.DupRatio, in.DupReach, in.Window)
	}
	// The engine's own rules for what the plan configures.
	eo := engine.Options{Tiers: in.Tiers, Window: in.Window, Partition: in.Partition, FalsePositive: in.FalsePositive,
		MemoryCapacity: in.MemoryCapacity, ExpectedKeys: int(min(in.IDsPerDay, engine.MaxExpectedKeys))}
	switch {
	case in.Shared != "" && (in.Shared != SharedRedis && in.Shared != SharedPostgres || in.Tiers != engine.Default):
		return Plan{}, fmt.Errorf("%w: Shared %q with Tiers %v: plans know the Redis and PostgreSQL tiers behind memory (Tiers Default)", ErrPlan, in.Shared, in.Tiers)
	case in.Shared != "":
		eo.Tiers = engine.MemoryOnly // the server is not the plan's business
	case in.Tiers == engine.Default:
		eo.Backend = embedded.Dir("plan")
	case in.Tiers == engine.BloomOnly:
		eo.Backend = &embedded.Backend{}
	}
	if in.FalsePositive == 0 {
		return Plan{}, fmt.Errorf("%w: FalsePositive is required", ErrPlan)
	}
	if err := eo.Validate(); err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	if err := (&WorkloadConfig{Shape: in.Shape, KeySize: in.KeySize, Sample: in.Sample}).Validate(); err != nil {
		return Plan{}, fmt.Errorf("%w: %w", ErrPlan, err)
	}
	if in.Sliding && in.Shared != "" {
		return Plan{}, fmt.Errorf("%w: Sliding with the %s tier: only the embedded store, memory and bloom-only refresh keys", ErrPlan, in.Shared)
	}
	p := Plan{Input: in, Live: parts.Live, Calibration: cal, KeyBytes: in.meanKeySize()}
	p.KeysPerPartition = in.IDsPerDay * (1 - in.DupRatio) * float64(in.Partition) / float64(24*time.Hour)
	if in.Sliding {
		reach := in.DupReach
		if reach == 0 {
			reach = time.Hour
		}
		p.RefreshesPerDay = in.IDsPerDay * in.DupRatio * RefreshShare(reach, in.Partition)
		// Each refresh is a record in the current partition and a key in
		// its filter.
		p.KeysPerPartition += p.RefreshesPerDay * float64(in.Partition) / float64(24*time.Hour)
	}
	p.KeysHeld = p.KeysPerPartition * float64(parts.Live)
	if in.Shared == SharedRedis {
		p.KeysHeld = in.IDsPerDay * (1 - in.DupRatio) * float64(in.Window) / float64(24*time.Hour)
	}
	if (in.Tiers == engine.Default && in.Shared == "") || in.Tiers == engine.BloomOnly {
		sz := bloom.Sizing(int(math.Max(1, p.KeysPerPartition)), in.FalsePositive, parts.Live)
		p.BloomPartitionFP, p.BloomK = sz.PerFilter, sz.K
		p.BloomBitsPerKey = float64(sz.M) / math.Max(1, p.KeysPerPartition)
		p.BloomWindowFP = 1 - math.Pow(1-p.BloomPartitionFP, float64(parts.Live))
		p.BloomBytes = float64(sz.Bytes)
	}
	if in.Tiers != engine.BloomOnly {
		if p.Input.MemoryCapacity == 0 {
			p.Input.MemoryCapacity = memory.DefaultCapacity
		}
		p.MemoryBytes = float64(p.Input.MemoryCapacity) * MemoryEntryBytes
	}
	if in.ArchiveWindow > 0 {
		if err := p.planArchive(in, cal); err != nil {
			return Plan{}, err
		}
	}
	p.HeapBytes = p.MemoryBytes + p.BloomBytes + p.ArchiveFilterBytes + FixedHeapBytes
	switch {
	case in.Shared != "":
		p.HeapBytes = p.MemoryBytes + SharedFixedHeapBytes
		if cal.FixedHeapBytes > 0 {
			p.HeapBytes = p.MemoryBytes + cal.FixedHeapBytes
		}
		p.SharedBytesPerKey = cal.SharedBytesPerKey
		if p.SharedBytesPerKey == 0 {
			p.SharedBytesPerKey = RedisFixedBytes + p.KeyBytes
			if in.Shared == SharedPostgres {
				p.SharedBytesPerKey = PostgresFixedBytes + p.KeyBytes
			}
		}
		if in.Shared == SharedRedis {
			p.RedisBytes = p.KeysHeld * p.SharedBytesPerKey
		} else {
			p.PostgresBytes = p.KeysHeld * p.SharedBytesPerKey
		}
	case in.Tiers == engine.Default:
		// The calibration's bytes are per distinct key committed; with a
		// sliding window they include the refreshes' records (it runs
		// sliding too), which KeysHeld counts as keys.
		p.TableBytes = p.KeysHeld * p.freshPerPartition() / p.KeysPerPartition * cal.TableBytesPerKey
		// A memtable is flushed when full, or when a drop's range deletion
		// is compacted: every partition at least. A calibration that
		// flushed nothing bounds the memtable's keys by its size.
		fileKeys := cal.WALFileKeys
		if fileKeys == 0 && cal.WALBytesPerKey > 0 {
			fileKeys = pebble.DefaultMemTableSize / cal.WALBytesPerKey
		}
		p.WALFileBytes = cal.WALBytesPerKey * min(fileKeys, p.KeysPerPartition)
		// Pebble's memory outside the Go heap, as resident as a store of
		// this load holds it: the mutable memtable and one being flushed
		// (or kept for reuse), each touched as far as it fills before its
		// flush (WALFileBytes of records: a partition's, or a full
		// memtable's), at MemtableBytesPerWALByte; and the block cache
		// filled up to the SSTs there are to cache. A load that fills them
		// holds them whole: two memtables and the cache.
		p.OffHeapBytes = 2*min(pebble.DefaultMemTableSize, MemtableBytesPerWALByte*p.WALFileBytes) + min(pebble.DefaultCacheSize, p.TableBytes)
		block := 1.1 * pebble.DefaultMemTableSize
		p.WALBytes = cal.WALDiskBytes * max(1, math.Ceil(p.WALFileBytes/block))
		if cal.WALDiskBytes == 0 { // no calibration's disk: a block a file
			p.WALBytes = (RecycledWALFiles + 1) * block * max(1, math.Ceil(p.WALFileBytes/block))
		}
		p.FilterFileBytes = p.BloomBytes
		p.DiskBytes = p.TableBytes + p.WALBytes + p.FilterFileBytes + cal.FixedDiskBytes
	case in.Tiers == engine.BloomOnly:
		p.DiskBytes = p.BloomBytes // the state file Close writes: the filters
	}
	p.MemoryLimitBytes = math.Ceil(max(p.HeapBytes*GCHeadroom, p.HeapBytes+GCMinRoomBytes)/(1<<20)) * (1 << 20)
	p.ProgramBytes = cal.ProgramBytes
	// The heap peaks at the limit, or below it at twice the live heap
	// (GOGC=100) when the limit is higher.
	p.PeakRSSBytes = min(p.MemoryLimitBytes, 2*p.HeapBytes) + p.OffHeapBytes + p.ProgramBytes
	p.PeakRSSNoLimitBytes = 2*p.HeapBytes + p.OffHeapBytes + p.ProgramBytes
	p.Derate = 1
	if in.Tiers == engine.Default && in.Shared == "" && cal.StoreKeys > 0 && p.KeysHeld > 1.25*float64(cal.StoreKeys) {
		p.Derate = LargeStoreFactor
	}
	p.CapacityPerDay = cal.KeysPerSec * p.Derate * 86400
	p.Headroom = p.CapacityPerDay / in.IDsPerDay
	lo, hi := cal.spread()
	lo *= p.Derate
	if p.Derate != 1 && cal.StoreKeys > 0 {
		for x := p.KeysHeld / float64(cal.StoreKeys); x > 10*MeasuredDerateRatio; x /= 10 {
			lo *= LargeStoreFactor
		}
	}
	p.CapacityRange = [2]float64{lo * 86400, hi * p.Derate * 86400}
	p.HeadroomRange = [2]float64{p.CapacityRange[0] / in.IDsPerDay, p.CapacityRange[1] / in.IDsPerDay}
	return p, nil
}

// planArchive sizes the archive: the filter as the engine lays it out
// (archive.FilterLayout, bloom.Sizing), the tables at the
// calibration's bytes a key (the archive writes a partition's keys as the
// cold database's tables hold them).
func (p *Plan) planArchive(in PlanInput, cal Calibration) error {
	if in.Tiers != engine.Default || in.Shared != "" || in.ArchiveWindow <= in.Window {
		return fmt.Errorf("%w: an archive needs the embedded store (Tiers Default, no Shared) and an ArchiveWindow longer than the Window", ErrPlan)
	}
	fp := in.ArchiveFalsePositive
	if fp == 0 {
		fp = bloom.DefaultFalsePositive
	}
	lay := archive.FilterLayout(in.Partition, in.ArchiveWindow)
	p.ArchiveLayout = lay
	p.ArchiveKeysHeld = p.KeysPerPartition * float64(lay.Partitions-p.Live)
	sz := bloom.Sizing(int(math.Max(1, p.KeysPerPartition*float64(lay.Group))), fp, lay.Slots)
	p.ArchiveFilterBytes = float64(sz.Bytes)
	p.ArchiveFP = 1 - math.Pow(1-sz.PerFilter, float64(lay.Slots))
	p.ArchiveBlobBytes = p.ArchiveFilterBytes // one blob a slot, each a slot's filter
	// The archive holds every closed partition inside its window: the
	// window's own closed ones too (archived once sealed).
	p.ArchiveDiskBytes = p.KeysPerPartition*float64(lay.Partitions-1)*cal.TableBytesPerKey + p.ArchiveBlobBytes
	return nil
}

// CalibrateConfig sizes a calibration run.
type CalibrateConfig struct {
	// Measure is the number of timed messages; zero means 1,500,000.
	Measure int64
	// Store caps the keys the store holds before the timed part (the
	// warm-up fills it to the planned store, or to this); zero means
	// 4,000,000, or 1,000,000 on a shared tier (which the calibration
	// writes to a server others may use).
	Store int64
	// Segments is the number of timed parts whose median rate is taken;
	// zero means 3.
	Segments int
	// Dir, if set, holds the calibration's store (a temporary directory
	// otherwise); it must be empty.
	Dir string
	// Shared is the server of PlanInput.Shared's tier, which the
	// calibration runs against (required with a Shared plan, unused
	// otherwise).
	Shared SharedServer
}

// Calibrate runs the plan's load on this machine at steady state: a
// warm-up fills the store to the planned number of keys (up to
// cc.Store) and every filter to its planned density, then cc.Measure
// messages are timed in cc.Segments parts and the median rate is kept, and
// the store is compacted (untimed) to measure its bytes per key. It is not
// compacted after the warm-up: a freshly compacted store
// runs faster than one that has been written for a while (the first
// timed part after a compaction measured 1.6× the others). The keys have
// the plan's shape and size, and duplicates reach as many keys back as the
// planned load's.
func Calibrate(ctx context.Context, in PlanInput, cc CalibrateConfig) (Calibration, *Result, error) {
	if cc.Measure <= 0 {
		cc.Measure = 1_500_000
	}
	if cc.Store <= 0 {
		cc.Store = 4_000_000
		if in.Shared != "" {
			cc.Store = 1_000_000
		}
	}
	if cc.Segments <= 0 {
		cc.Segments = 3
	}
	if cc.Measure/int64(cc.Segments) < 10_000 {
		return Calibration{}, nil, fmt.Errorf("%w: %d timed keys in %d segments: at least 10,000 keys a segment", ErrPlan, cc.Measure, cc.Segments)
	}
	pl, err := MakePlan(in, Calibration{})
	if err != nil {
		return Calibration{}, nil, err
	}
	if in.Shared != "" {
		return calibrateShared(ctx, in, cc, pl)
	}
	// The warm-up fills the store to the planned keys, or to cc.Store.
	warm := int64(min(pl.KeysHeld, float64(cc.Store)) / (1 - in.DupRatio))
	total := warm + cc.Measure
	// Simulated time runs at the planned rate when the warm-up covers the
	// window: then the filters are the planned ones, full, and partitions
	// rotate and drop during the timed part at the planned keys apart, as
	// they will in production. A larger plan compresses time so the
	// warm-up still spreads over every live partition, each filter sized
	// for its share and full at the end; its drops come at a compressed
	// pace, and the memtable flushes they force are discounted below.
	span := time.Duration(float64(total) / in.IDsPerDay * float64(24*time.Hour))
	expected := pl.KeysPerPartition
	compressed := warm > 0 && float64(warm) < pl.KeysHeld/(1-in.DupRatio)
	if compressed {
		span = time.Duration(float64(pl.Live)*float64(in.Partition)*float64(total)/float64(max(warm, 1))) - in.Partition/64
		if in.Tiers != engine.BloomOnly {
			// Each partition's keys: the new ones, and a sliding window's
			// refreshes, as the plan counts them.
			expected = float64(warm) * (1 - in.DupRatio) / float64(pl.Live) * pl.KeysPerPartition / pl.freshPerPartition()
		}
		// Bloom-only keeps the planned filters (pl.BloomBytes of memory):
		// it is all there is, and filters larger than the CPU's caches
		// cost more per probe (measured: filters for 100M keys ran at
		// 0.26–0.51× the rate of filters for 450k). Fewer keys than
		// planned leave them sparser, so the rate still errs high.
	}
	rc := RunConfig{
		Compact:  true,
		Sample:   250 * time.Millisecond,
		Workload: in.workload(total, span),
		Warmup:   warm,
		Segments: cc.Segments,
		Engine: engine.Options{Tiers: in.Tiers, Backend: backendFor(in.Tiers, cc.Dir), Window: in.Window, Partition: in.Partition, FalsePositive: in.FalsePositive,
			MemoryCapacity: in.MemoryCapacity, ExpectedKeys: max(1000, int(expected)), Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: in.Sliding}}},
	}
	res, err := Run(ctx, rc)
	if err != nil {
		return Calibration{}, nil, err
	}
	cal := CalibrationOf(res)
	if perPartition := float64(total) * (1 - in.DupRatio) / float64(pl.Live); compressed && cal.WALFileKeys > 0.8*perPartition {
		// Its memtables were flushed by its own (compressed) partition
		// drops before they filled: how many keys fill one is unknown
		// here, and the plan's partitions are larger. MakePlan bounds it
		// by the memtable's size instead.
		cal.WALFileKeys = 0
	}
	// Partitions dropped during the run took their keys with them: the
	// store holds the commits of the live partitions' time, at the
	// stream's even rate.
	if res.Stats.Store.PartitionsDropped > 0 {
		parts, _ := tier.NewPartitions(in.Window, in.Partition)
		end := Start.Add(span)
		oldest := time.Unix(0, parts.Oldest(parts.Of(end.UnixNano()))*int64(in.Partition))
		held := float64(res.Stats.Calls.Commits) * float64(end.Sub(oldest)) / float64(span)
		cal.StoreKeys = int64(held)
		cal.TableBytesPerKey = float64(res.CompactedTableBytes) / held
	}
	return cal, res, nil
}

// calibrateShared is Calibrate on a shared tier, against cc.Shared's
// server: a warm-up fills a fresh prefix or table to the planned keys
// held (up to cc.Store), then cc.Measure messages are timed. Simulated
// time runs at the planned rate, and no longer than the window (Run
// refuses more): the tier expires keys by the server's clock, so it holds
// every key the calibration committed, and its bytes per key are the
// server's for that many. The keys have the plan's shape and size, and
// duplicates reach as far back as the planned load's.
func calibrateShared(ctx context.Context, in PlanInput, cc CalibrateConfig, pl Plan) (Calibration, *Result, error) {
	if cc.Shared.Tier() != in.Shared {
		return Calibration{}, nil, fmt.Errorf("%w: a plan for the %s tier calibrates against its server: CalibrateConfig.Shared has %q", ErrPlan, in.Shared, cc.Shared.Tier())
	}
	warm := int64(min(pl.KeysHeld, float64(cc.Store)) / (1 - in.DupRatio))
	total := warm + cc.Measure
	span := time.Duration(float64(total) / in.IDsPerDay * float64(24*time.Hour))
	span = min(max(span, time.Duration(total)), in.Window)
	res, err := Run(ctx, RunConfig{
		Sample:   250 * time.Millisecond,
		Workload: in.workload(total, span),
		Warmup:   warm,
		Segments: cc.Segments,
		Shared:   cc.Shared,
		Engine:   engine.Options{Window: in.Window, Partition: in.Partition, MemoryCapacity: in.MemoryCapacity},
	})
	if err != nil {
		return Calibration{}, nil, err
	}
	cal := Calibration{KeysPerSec: res.KeysPerSec, SegmentRates: res.SegmentRates, Keys: res.Measured, Elapsed: res.Elapsed,
		StoreKeys: res.Shared.Keys, SharedBytesPerKey: res.Shared.BytesPerKey,
		FixedHeapBytes: max(1, float64(res.HeapBytes)-float64(res.Stats.Memory.Entries)*MemoryEntryBytes)}
	return cal, res, nil
}

// CalibrationOf takes a calibration from a run's measurements.
func CalibrationOf(res *Result) Calibration {
	cal := Calibration{KeysPerSec: res.KeysPerSec, SegmentRates: res.SegmentRates, Keys: res.Measured, Elapsed: res.Elapsed}
	if b, err := procKB("/proc/self/status", "RssFile:"); err == nil {
		cal.ProgramBytes = b
	}
	st := res.Stats
	if held := int64(st.Calls.Commits); held > 0 {
		cal.StoreKeys = held
		tables := st.Store.TableBytes
		if res.CompactedTableBytes > 0 {
			tables = res.CompactedTableBytes
		}
		cal.TableBytesPerKey = float64(tables) / float64(held)
		cal.WALBytesPerKey = float64(st.Store.WALWrittenBytes) / float64(held)
		if st.Store.WALRecycledFiles > 0 && cal.WALBytesPerKey > 0 {
			cal.WALFileKeys = float64(st.Store.WALRecycledBytes) / float64(st.Store.WALRecycledFiles) / cal.WALBytesPerKey
		}
		// The WAL's and the other files' disk, as it stood through the
		// run (files come and go; one instant may catch a compaction's).
		var wal, other []float64
		for _, p := range res.Series {
			if p.DiskBytes > 0 {
				wal, other = append(wal, float64(p.Disk.WAL)), append(other, float64(p.Disk.Other))
			}
		}
		if len(other) > 0 {
			slices.Sort(wal)
			slices.Sort(other)
			cal.WALDiskBytes, cal.FixedDiskBytes = wal[len(wal)/2], other[len(other)/2]
		} else {
			cal.WALDiskBytes, cal.FixedDiskBytes = float64(st.Store.Disk.WAL), float64(st.Store.Disk.Other)
		}
	}
	return cal
}

// spread is the slowest and the fastest rate of c's segments (its median
// rate when it has none).
func (c Calibration) spread() (lo, hi float64) {
	lo, hi = c.KeysPerSec, c.KeysPerSec
	for _, r := range c.SegmentRates {
		lo, hi = min(lo, r), max(hi, r)
	}
	return lo, hi
}

// Options returns the engine settings that realise the plan, as Go, and
// the GOMEMLIMIT it assumes: the filters sized for the keys a partition
// receives (ExpectedKeys), the window, the memory tier. dir, client, pool
// and archive stand for the caller's own.
func (p Plan) Options() string {
	in := p.Input
	var f []string
	switch {
	case in.Shared == SharedRedis:
		f = append(f, "Backend: redis.NewBackend(client, redis.Config{})")
	case in.Shared == SharedPostgres:
		f = append(f, "Backend: postgres.NewBackend(pool, postgres.Config{})")
	case in.Tiers == engine.BloomOnly:
		f = append(f, "Tiers: engine.BloomOnly", "Backend: &embedded.Backend{Dir: dir}")
	case in.Tiers == engine.MemoryOnly:
		f = append(f, "Tiers: engine.MemoryOnly")
	default:
		f = append(f, "Backend: embedded.Dir(dir)")
	}
	f = append(f, "Window: "+goDuration(in.Window), "Partition: "+goDuration(in.Partition))
	if p.BloomBytes > 0 {
		f = append(f, fmt.Sprintf("ExpectedKeys: %d", int64(math.Ceil(p.KeysPerPartition))), fmt.Sprintf("FalsePositive: %g", in.FalsePositive))
	}
	if in.Tiers != engine.BloomOnly {
		f = append(f, fmt.Sprintf("MemoryCapacity: %d", p.Input.MemoryCapacity))
	}
	if in.ArchiveWindow > 0 {
		f = append(f, "Archive: archive", "ArchiveWindow: "+goDuration(in.ArchiveWindow))
	}
	if in.Sliding {
		f = append(f, `Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}`)
	}
	return "engine.Options{" + strings.Join(f, ", ") + "}, GOMEMLIMIT=" + memLimit(p.MemoryLimitBytes)
}

// goDuration writes d as Go: whole hours or minutes as multiples of
// time.Hour or time.Minute.
func goDuration(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%d * time.Hour", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%d * time.Minute", d/time.Minute)
	}
	return fmt.Sprintf("time.Duration(%d)", d)
}
