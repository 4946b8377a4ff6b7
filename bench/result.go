package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// Percentiles of a latency distribution.
type Percentiles struct {
	P50, P99, P999, Max time.Duration
}

// Result is what a run measured.
type Result struct {
	Tiers    string
	Workload WorkloadConfig
	Batch    int
	Workers  int
	// ExpectedKeys is the filters' sizing the run's engine had: the
	// workload's keys per partition (what plan's settings give), not the
	// library's default.
	ExpectedKeys int
	// PeakRSSBytes is the process's peak resident memory as the OS
	// counted it (VmHWM) at the end: the engine's heap and off-heap, the
	// collector's room, and the benchmark's own ground truth.
	PeakRSSBytes uint64
	// Rate is RunConfig.Rate: the offered load of an open-loop run, zero
	// for closed-loop. BatchLatency is then measured from each batch's
	// due time.
	Rate float64
	// Keys is the number of messages processed, Warmup included; Elapsed
	// and KeysPerSec cover the Measured ones after the warm-up.
	Keys, Warmup, Measured int64
	Elapsed                time.Duration
	KeysPerSec             float64
	// SegmentRates are the keys/s of each of RunConfig.Segments parts of
	// the measured messages.
	SegmentRates []float64
	// IDsPerDay extrapolates KeysPerSec to a day of sustained load.
	IDsPerDay float64
	// BatchLatency is the latency of MarkBatch calls; KeyLatency divides it
	// by the batch size (the amortised cost of a key).
	BatchLatency, KeyLatency Percentiles
	// HeapBytes is the heap the engine held at the end (after GC), and
	// HeapBytesPerKey divides it by the keys committed in the window.
	HeapBytes       uint64
	HeapBytesPerKey float64
	// DiskBytes is the store's directory at the end as the OS allocates
	// it (Stats.Store.DiskBytes: du's figure); TableBytes Pebble's live
	// SSTs (compacted when RunConfig.Compact is set) and WALBytes its live
	// WAL, as Pebble sizes them.
	DiskBytes, TableBytes, WALBytes   uint64
	DiskBytesPerKey, TableBytesPerKey float64
	// CompactedTableBytes are the SSTs once compacted (RunConfig.Compact).
	CompactedTableBytes uint64
	// BloomFPMeasured is the share of keys absent from Pebble that the
	// filters called maybe; BloomFPConfigured is the whole-window target.
	BloomFPMeasured, BloomFPConfigured float64
	// Hit ratios: memory answered Duplicate / all claims; the filters proved
	// new / keys memory did not know; Pebble found / keys read.
	MemoryHitRatio, BloomNegativeRatio, StoreHitRatio float64
	// Fresh is the number of distinct keys the stream sent and New the
	// number of New answers. Every answer is checked against the
	// workload's ground truth, key by key: WronglyDropped counts distinct
	// keys never answered New (a new message dropped), DupsLetThrough the
	// New answers beyond the first for one key (a duplicate let through).
	// Workers run batches concurrently, so which copy of a key gets the New
	// may vary; that each key gets exactly one does not. DupsChecked is
	// false when duplicates may reach past the window (a second New may
	// then be right), and DupsLetThrough is not counted.
	Fresh, New                     int64
	WronglyDropped, DupsLetThrough int64
	DupsChecked                    bool
	// MemoryCapacity is the memory tier's capacity in committed keys.
	MemoryCapacity int
	Series         []Point
	// PerDay is the throughput of each simulated day the timed loop finished,
	// from the moments its days ended (exact to a batch, whatever the
	// sampling interval).
	PerDay []DayRate
	Stats  engine.Stats
	// Shared is what a run on a shared tier (RunConfig.Shared) left in
	// its server; nil for the other configurations.
	Shared *SharedResult `json:",omitempty"`
}

// ErrExactness reports a run whose answers broke a promise of its
// configuration (see Result.Exactness).
var ErrExactness = errors.New("bench: wrong answers")

// Exactness returns an error matching ErrExactness when the run's answers
// broke a promise of its configuration:
//   - a new key dropped, in every configuration but bloom-only; bloom-only
//     drops new keys at its false-positive rate, and breaks its promise
//     when it drops more than the configured rate, beyond four standard
//     deviations of the sample, with no filter over its ExpectedKeys (past
//     them the rate is not promised: Warnings says so);
//   - a duplicate let through, in every configuration but memory-only;
//     memory-only forgets after eviction, and breaks its promise when it
//     lets one through although every distinct key fitted its cache.
func (r *Result) Exactness() error {
	var errs []error
	switch {
	case r.WronglyDropped == 0:
	case r.Tiers != engine.BloomOnly.String():
		errs = append(errs, fmt.Errorf("%w: %s dropped %d new keys", ErrExactness, r.Tiers, r.WronglyDropped))
	case r.Fresh > 0 && !r.bloomOverfilled():
		p := r.BloomFPConfigured
		bound := p + 4*math.Sqrt(p*(1-p)/float64(r.Fresh)) + 1/float64(r.Fresh)
		if rate := float64(r.WronglyDropped) / float64(r.Fresh); rate > bound {
			errs = append(errs, fmt.Errorf("%w: %s dropped %.4f%% of new keys, above its false-positive rate (%.4f%% allowed)", ErrExactness, r.Tiers, 100*rate, 100*bound))
		}
	}
	switch {
	case r.DupsLetThrough == 0:
	case r.Tiers != engine.MemoryOnly.String():
		errs = append(errs, fmt.Errorf("%w: %s let %d duplicates through", ErrExactness, r.Tiers, r.DupsLetThrough))
	case r.Fresh <= int64(r.MemoryCapacity):
		errs = append(errs, fmt.Errorf("%w: %s let %d duplicates through although its %d distinct keys fitted a cache of %d", ErrExactness, r.Tiers, r.DupsLetThrough, r.Fresh, r.MemoryCapacity))
	}
	return errors.Join(errs...)
}

// bloomOverfilled reports filters past their capacity: their own estimate
// of the false-positive rate exceeds the configured one, which it reaches
// only when every filter holds ExpectedKeys.
func (r *Result) bloomOverfilled() bool {
	return r.Stats.Bloom.EstimatedFP > r.BloomFPConfigured*1.01
}

// Warnings says what a run did not exercise, so that a clean result is not
// read as more than it shows.
func (r *Result) Warnings() []string {
	var w []string
	durable := r.Tiers != engine.MemoryOnly.String() && r.Tiers != engine.BloomOnly.String()
	if r.Tiers == engine.BloomOnly.String() && r.bloomOverfilled() {
		w = append(w, fmt.Sprintf("the filters hold more keys than ExpectedKeys (estimated false-positive rate %.4f%%, configured %.4f%%): the rate is not promised past it", 100*r.Stats.Bloom.EstimatedFP, 100*r.BloomFPConfigured))
	}
	for _, p := range r.Stats.Bloom.Partitions {
		if !p.OverTarget {
			continue
		}
		rate, how := p.MeasuredFP, fmt.Sprintf("measured over %d new keys", p.Checked)
		if p.Checked == 0 {
			rate, how = p.EstimatedFP, "estimated from its keys"
		}
		advice := fmt.Sprintf("ExpectedKeys %d would restore the target", p.RecommendedExpectedKeys)
		if p.RecommendedExpectedKeys == 0 {
			advice = "it grew from bits restored at a smaller size, which growing does not thin (BloomPartition.Inherited)"
		}
		w = append(w, fmt.Sprintf("the Bloom filter of the partition starting %s lets %.4f%% of new keys through to the store (%s), over twice its target %.4f%%: it holds %d keys; %s",
			p.Start.UTC().Format(time.RFC3339), 100*rate, how, 100*p.TargetFP, p.Keys, advice))
	}
	if durable && r.DupsChecked && r.Fresh < r.Keys && r.Stats.Store.Hits == 0 {
		w = append(w, "no duplicate reached past the memory tier: the durable tier's duplicate check was not exercised (raise -reach or lower -memory)")
	}
	return w
}

// DayRate is the throughput sustained during one simulated day.
type DayRate struct {
	Day        int
	Keys       int64
	KeysPerSec float64
	// CPUPerKey is the process's CPU time per key during the day, GCs its
	// garbage collections, and WriteAmp the bytes written to SSTs over
	// those written to the WAL (zero without a Pebble store).
	CPUPerKey time.Duration
	GCs       uint64
	WriteAmp  float64
}

// rates fills the Result's counts, rates and latencies from the timed loop
// that started at start: the keys per simulated day, keys/s (the median of
// the segments' rates when there are several), its extrapolation to a day,
// and the batch and per-key latency percentiles.
func (r *run) rates(start time.Time) {
	res := r.res
	res.PerDay = perDay(r.warm, r.stream.step, r.dayStart, r.dayBounds, r.dayEnds)
	res.Keys = r.processed.Load()
	res.Measured = res.Keys - r.warm
	res.KeysPerSec = float64(res.Measured) / res.Elapsed.Seconds()
	if r.rc.Segments > 1 {
		r.segmentRates(start)
	}
	res.IDsPerDay = res.KeysPerSec * 86400
	all := slices.Concat(r.latencies...)
	res.BatchLatency = percentiles(all)
	for i := range all {
		all[i] /= time.Duration(r.rc.Batch)
	}
	res.KeyLatency = percentiles(all)
}

// segmentRates sets the Result's SegmentRates from the segments' ends (the
// first segment starting at start) and KeysPerSec to their median.
func (r *run) segmentRates(start time.Time) {
	res := r.res
	prev := start
	for k, end := range r.segEnds {
		n := r.segLen
		if k == len(r.segEnds)-1 {
			n = res.Measured - int64(k)*r.segLen
		}
		if end.IsZero() || n <= 0 {
			break
		}
		if d := end.Sub(prev); d > 0 {
			res.SegmentRates = append(res.SegmentRates, float64(n)/d.Seconds())
		}
		prev = end
	}
	if len(res.SegmentRates) > 0 {
		sorted := slices.Clone(res.SegmentRates)
		slices.Sort(sorted)
		res.KeysPerSec = sorted[len(sorted)/2]
	}
}

// checkAnswers is the exactness check: it counts the fresh keys and New
// answers, and checks the New answers of every fresh key against the
// ground truth: a key never answered New was dropped, and, when no
// duplicate reaches past the window, every New beyond a key's first let a
// duplicate through.
func (r *run) checkAnswers() {
	res := r.res
	res.Fresh, res.New = r.fresh.Load(), r.news.Load()
	res.DupsChecked = r.stream.Config().DupReach <= r.o.WithDefaults().Window
	for _, n := range r.newsPerKey[:r.stream.fresh] {
		switch {
		case n == 0:
			res.WronglyDropped++
		case n > 1 && res.DupsChecked:
			res.DupsLetThrough += int64(n) - 1
		}
	}
}

// engineStats stores the engine's stats in the Result and returns them;
// with RunConfig.Compact, in the default configuration, it then compacts
// the store (untimed) and measures its SSTs again.
func (r *run) engineStats(ctx context.Context) (engine.Stats, error) {
	st := r.e.Stats()
	r.res.Stats = st
	if r.rc.Compact && r.o.Tiers == engine.Default && embeddedIn(&r.o) != nil {
		if err := r.e.Compact(context.WithoutCancel(ctx)); err != nil {
			return st, err
		}
		r.res.CompactedTableBytes = r.e.Stats().Store.TableBytes
	}
	return st, nil
}

// heapAndDisk fills the Result's heap figures (the heap now, after GC,
// beyond the reading taken before the engine opened) and, with st's
// figures, the disk figures, each also per key committed.
func (r *run) heapAndDisk(st engine.Stats) {
	res := r.res
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// The ground truth was allocated before the first reading: it must
	// still be there at this one, or the heap reads low by a byte a key.
	runtime.KeepAlive(r.newsPerKey)
	if after.HeapAlloc > r.before.HeapAlloc {
		res.HeapBytes = after.HeapAlloc - r.before.HeapAlloc
	}
	res.PeakRSSBytes = peakRSS()
	held := st.Calls.Commits // keys committed; all inside the window unless partitions were dropped
	if held > 0 {
		res.HeapBytesPerKey = float64(res.HeapBytes) / float64(held)
		res.DiskBytes, res.TableBytes, res.WALBytes = st.Store.DiskBytes, st.Store.TableBytes, st.Store.WALBytes
		res.DiskBytesPerKey = float64(st.Store.DiskBytes) / float64(held)
		res.TableBytesPerKey = float64(st.Store.TableBytes) / float64(held)
	}
}

// filterAndHitRatios fills the Result's false-positive rates of the
// filters, measured and configured, and the tiers' hit ratios, from st.
func (r *run) filterAndHitRatios(st engine.Stats) {
	res := r.res
	if absent := st.Bloom.Negatives + st.Bloom.FalsePositives; absent > 0 {
		res.BloomFPMeasured = float64(st.Bloom.FalsePositives) / float64(absent)
	} else if r.o.Tiers == engine.BloomOnly && res.Fresh > 0 {
		// No exact tier to overturn a maybe: every false positive is a new
		// key answered Duplicate.
		res.BloomFPMeasured = float64(res.WronglyDropped) / float64(res.Fresh)
	}
	res.BloomFPConfigured = st.Bloom.TargetFP
	if st.Calls.Claims > 0 {
		res.MemoryHitRatio = float64(st.Memory.Hits) / float64(st.Calls.Claims)
	}
	if st.Memory.Misses > 0 {
		res.BloomNegativeRatio = float64(st.Bloom.Negatives) / float64(st.Memory.Misses)
	}
	if st.Store.Reads > 0 {
		res.StoreHitRatio = float64(st.Store.Hits) / float64(st.Store.Reads)
	}
}

// dayBounds returns the message counts in (warm, total] at which a
// simulated day of a stream advancing step per message ends, total last;
// nil for a stream without time.
func dayBounds(warm, total int64, step time.Duration) []int64 {
	if step <= 0 || total <= warm {
		return nil
	}
	perDay := int64(24 * time.Hour / step)
	if perDay < 1 {
		perDay = 1
	}
	var out []int64
	for b := (warm/perDay + 1) * perDay; b < total; b += perDay {
		out = append(out, b)
	}
	return append(out, total)
}

// perDay is the throughput of each simulated day of the timed loop that
// started at start, from the exact moments its days ended (bounds and
// ends, as dayBounds and endSegments make them): a day's keys are those
// between its bounds (the first from warm), its time the wall time
// between its end and the one before. A day the run did not finish is
// left out.
func perDay(warm int64, step time.Duration, start dayMark, bounds []int64, ends []dayMark) []DayRate {
	var out []DayRate
	prevKeys, prev := warm, start
	for k, b := range bounds {
		end := ends[k]
		if end.at.IsZero() {
			break
		}
		d := DayRate{Day: int(time.Duration(b-1) * step / (24 * time.Hour)), Keys: b - prevKeys, GCs: end.gcs - prev.gcs}
		if s := end.at.Sub(prev.at).Seconds(); s > 0 {
			d.KeysPerSec = float64(d.Keys) / s
		}
		if d.Keys > 0 {
			d.CPUPerKey = (end.cpu - prev.cpu) / time.Duration(d.Keys)
		}
		if wal := end.walBytes - prev.walBytes; wal > 0 {
			d.WriteAmp = float64(end.tables-prev.tables) / float64(wal)
		}
		out = append(out, d)
		prevKeys, prev = b, end
	}
	return out
}

// percentiles sorts d and returns its percentiles (zero for none).
func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Percentiles{P50: at(0.5), P99: at(0.99), P999: at(0.999), Max: d[len(d)-1]}
}
