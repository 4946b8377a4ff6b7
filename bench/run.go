package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// RunConfig describes one measured run of an engine over a workload.
type RunConfig struct {
	// Workload is the message stream.
	Workload WorkloadConfig
	// Engine configures the engine. Run sets Clock to the stream's
	// simulated time; an empty Dir in the default configuration becomes a
	// temporary directory that Run removes.
	Engine engine.Options
	// Batch is the number of keys per MarkBatch call; zero means 256.
	Batch int
	// Workers is the number of goroutines; zero means 4 per CPU, so that
	// one batch's fsync overlaps another batch's work.
	Workers int
	// Sample is the interval of the throughput series; zero means 1 s.
	Sample time.Duration
	// Progress, if set, is called after each sample.
	Progress func(Point)
	// Compact, in the default configuration, compacts the store after the
	// run (untimed) and measures its SSTs again (CompactedTableBytes); the
	// other figures describe the store as the run left it.
	Compact bool
	// Warmup is the number of the workload's messages processed before
	// the measurement starts, to bring the engine to a steady state (a
	// store of realistic size with the levels and compaction debt of one
	// that has been written for a while, full filters). They are checked
	// like the rest, but no rate, latency or series point counts them.
	Warmup int64
	// Rate, when positive, runs the measured messages open-loop at that
	// many keys per second: batch i is due at start + i×Batch/Rate, a free
	// worker starts it no earlier, and its latency is measured from when
	// it was due, so a run that falls behind counts the waiting in every
	// late batch (no coordinated omission). Zero runs closed-loop: each
	// worker starts its next batch as soon as the last one returns.
	Rate float64
	// Segments splits the measured messages into that many equal parts;
	// KeysPerSec is then the median of their rates (Result.SegmentRates),
	// which a pause of a shared machine moves less than the mean. Zero
	// means one.
	Segments int
}

// Point is one sample of a run's progress.
type Point struct {
	At         time.Duration // wall time since the start
	Keys       int64         // messages processed so far
	KeysPerSec float64       // over the last sample
	SimTime    time.Time     // the stream's simulated time
	Rotations  uint64        // partitions dropped so far
	DiskBytes  uint64        // Stats.DiskBytes now (default configuration)
	// OtherDiskBytes is what DiskBytes holds beside the live SSTs and the
	// live and recycled WAL: manifest, obsolete files, compactions' output
	// in flight.
	OtherDiskBytes uint64
}

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
	// DiskBytes is Pebble's size at the end, WAL and files awaiting
	// deletion included; TableBytes its live SSTs (compacted when
	// RunConfig.Compact is set) and WALBytes its live WAL.
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
	// PerDay is the throughput of each simulated day, from the series.
	PerDay []DayRate
	Stats  engine.Stats
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
	return r.Stats.BloomEstimatedFP > r.BloomFPConfigured*1.01
}

// Warnings says what a run did not exercise, so that a clean result is not
// read as more than it shows.
func (r *Result) Warnings() []string {
	var w []string
	durable := r.Tiers != engine.MemoryOnly.String() && r.Tiers != engine.BloomOnly.String()
	if r.Tiers == engine.BloomOnly.String() && r.bloomOverfilled() {
		w = append(w, fmt.Sprintf("the filters hold more keys than ExpectedKeys (estimated false-positive rate %.4f%%, configured %.4f%%): the rate is not promised past it", 100*r.Stats.BloomEstimatedFP, 100*r.BloomFPConfigured))
	}
	if durable && r.DupsChecked && r.Fresh < r.Keys && r.Stats.StoreHits == 0 {
		w = append(w, "no duplicate reached past the memory tier: the durable tier's duplicate check was not exercised (raise -reach or lower -memory)")
	}
	return w
}

// DayRate is the throughput sustained during one simulated day.
type DayRate struct {
	Day        int
	Keys       int64
	KeysPerSec float64
}

type simClock struct {
	start     time.Time
	step      time.Duration
	processed *atomic.Int64
}

// Now maps the messages processed so far to simulated time.
func (c simClock) Now() time.Time {
	return c.start.Add(time.Duration(c.processed.Load()) * c.step)
}

// Run pushes the workload through an engine and measures it.
func Run(ctx context.Context, rc RunConfig) (*Result, error) {
	stream, err := NewStream(rc.Workload)
	if err != nil {
		return nil, err
	}
	if rc.Batch <= 0 {
		rc.Batch = 256
	}
	if rc.Workers <= 0 {
		rc.Workers = 4 * runtime.GOMAXPROCS(0)
	}
	if err := CheckRate(rc.Rate, rc.Batch); err != nil {
		return nil, err
	}
	if rc.Sample <= 0 {
		rc.Sample = time.Second
	}
	o := rc.Engine
	if o.Tiers == engine.Default && o.Backend == nil && o.Dir == "" && o.FS == nil {
		dir, err := os.MkdirTemp("", "dedupbench-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		o.Dir = dir
	}
	var processed atomic.Int64
	o.Clock = simClock{start: stream.Now(), step: stream.step, processed: &processed}
	if o.Lease == 0 {
		// Simulated time runs fast: while one batch is between claim and
		// commit, the other workers move the clock by many batches, which
		// may be hours. The lease must outlast that, as a real lease
		// outlasts a handler; no benchmark worker crashes, so a long lease
		// costs nothing here.
		o.Lease = o.WithDefaults().Window / 2
	}

	// News per fresh key, saturating: the ground truth each answer is
	// checked against (one byte a message, allocated before the heap is
	// measured).
	newsPerKey := make([]uint8, max(rc.Workload.Keys, 0))
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	e, err := engine.Open(&o)
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			e.Close()
		}
	}()

	if rc.Segments <= 0 {
		rc.Segments = 1
	}
	total := max(rc.Workload.Keys, 0)
	warm := min(max(rc.Warmup, 0), total)
	res := &Result{Tiers: o.Name(), Workload: stream.Config(), Batch: rc.Batch, Workers: rc.Workers, Warmup: warm,
		MemoryCapacity: o.MemoryCapacity, Rate: max(rc.Rate, 0)}
	if res.MemoryCapacity == 0 {
		res.MemoryCapacity = memory.DefaultCapacity
	}
	var (
		mu        sync.Mutex // guards stream, produced and newsPerKey
		produced  int64
		latencies = make([][]time.Duration, rc.Workers)
		fresh     atomic.Int64
		news      atomic.Int64
		firstErr  error
		errOnce   sync.Once
		segMu     sync.Mutex // guards segEnds
		segEnds   = make([]time.Time, rc.Segments)
		segLen    = max(1, (total-warm)/int64(rc.Segments))
		// Open loop: the measured batches taken so far, and when the
		// first was due.
		batches  int64
		due0     time.Time
		interval time.Duration
	)
	if rc.Rate > 0 {
		interval = time.Duration(float64(rc.Batch) / rc.Rate * float64(time.Second))
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// pump runs the workers until the stream has produced limit messages;
	// measure records their latencies and the segments' ends.
	pump := func(limit int64, measure bool) {
		var wg sync.WaitGroup
		for w := range rc.Workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var keys [][]byte
				var kinds []Kind
				idx := make([]int64, 0, rc.Batch)
				out := make([]engine.Outcome, rc.Batch)
				for ctx.Err() == nil {
					mu.Lock()
					keys, kinds, idx = stream.IndexedBatch(keys, kinds, idx, int(min(int64(rc.Batch), limit-produced)))
					produced += int64(len(keys))
					var due time.Time
					if measure && interval > 0 {
						due = due0.Add(time.Duration(batches) * interval)
						batches++
					}
					mu.Unlock()
					if len(keys) == 0 {
						return
					}
					t0 := time.Now()
					if !due.IsZero() {
						if wait := time.Until(due); wait > 0 {
							select {
							case <-time.After(wait):
							case <-ctx.Done():
								return
							}
						}
						t0 = due // late batches count their waiting
					}
					if err := e.MarkBatch(ctx, keys, nil, out[:len(keys)]); err != nil {
						errOnce.Do(func() { firstErr = err; cancel() })
						return
					}
					if measure {
						latencies[w] = append(latencies[w], time.Since(t0))
					}
					var f, n int64
					for i, k := range kinds {
						if k == Fresh {
							f++
						}
						if out[i] == engine.New {
							n++
						}
					}
					fresh.Add(f)
					news.Add(n)
					mu.Lock()
					for i, o := range out[:len(keys)] {
						if o == engine.New && newsPerKey[idx[i]] < 255 {
							newsPerKey[idx[i]]++
						}
					}
					mu.Unlock()
					v := processed.Add(int64(len(keys)))
					if measure {
						// The batch that carries the count past a segment's
						// last message ends that segment.
						now := time.Now()
						segMu.Lock()
						for k := range segEnds {
							end := warm + int64(k+1)*segLen
							if k == len(segEnds)-1 {
								end = total
							}
							if end <= v && end > v-int64(len(keys)) {
								segEnds[k] = now
							}
						}
						segMu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
	}
	if warm > 0 {
		pump(warm, false)
	}
	start := time.Now()
	due0 = start
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(rc.Sample)
		defer t.Stop()
		last, lastAt := processed.Load(), time.Duration(0)
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			n, at := processed.Load(), time.Since(start)
			st := e.Stats()
			p := Point{At: at, Keys: n, KeysPerSec: float64(n-last) / (at - lastAt).Seconds(),
				SimTime: o.Clock.Now(), Rotations: st.PartitionDropped, DiskBytes: st.DiskBytes}
			if known := st.TableBytes + st.WALBytes + st.WALRecycledBytes; st.DiskBytes > known {
				p.OtherDiskBytes = st.DiskBytes - known
			}
			last, lastAt = n, at
			res.Series = append(res.Series, p)
			if rc.Progress != nil {
				rc.Progress(p)
			}
		}
	}()
	if firstErr == nil {
		pump(total, true)
	}
	res.Elapsed = time.Since(start)
	cancel()
	<-sampled
	// A last point, so that even a run shorter than one sample has a series.
	last := Point{Keys: warm}
	if len(res.Series) > 0 {
		last = res.Series[len(res.Series)-1]
	}
	if n := processed.Load(); n > last.Keys {
		res.Series = append(res.Series, Point{At: res.Elapsed, Keys: n,
			KeysPerSec: float64(n-last.Keys) / (res.Elapsed - last.At).Seconds(),
			SimTime:    o.Clock.Now(), Rotations: e.Stats().PartitionDropped})
	}
	if firstErr != nil && !errors.Is(firstErr, context.Canceled) {
		return nil, fmt.Errorf("bench: run: %w", firstErr)
	}
	res.PerDay = perDay(res.Series, stream.start, Point{Keys: warm, SimTime: stream.start.Add(time.Duration(warm) * stream.step)})
	res.Keys = processed.Load()
	res.Measured = res.Keys - warm
	res.KeysPerSec = float64(res.Measured) / res.Elapsed.Seconds()
	if rc.Segments > 1 {
		prev := start
		for k, end := range segEnds {
			n := segLen
			if k == len(segEnds)-1 {
				n = res.Measured - int64(k)*segLen
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
	res.IDsPerDay = res.KeysPerSec * 86400
	all := slices.Concat(latencies...)
	res.BatchLatency = percentiles(all)
	for i := range all {
		all[i] /= time.Duration(rc.Batch)
	}
	res.KeyLatency = percentiles(all)
	res.Fresh, res.New = fresh.Load(), news.Load()
	res.DupsChecked = stream.Config().DupReach <= o.WithDefaults().Window
	for _, n := range newsPerKey[:stream.fresh] {
		switch {
		case n == 0:
			res.WronglyDropped++
		case n > 1 && res.DupsChecked:
			res.DupsLetThrough += int64(n) - 1
		}
	}

	st := e.Stats()
	res.Stats = st
	if rc.Compact && o.Tiers == engine.Default && o.Backend == nil {
		if err := e.Compact(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		}
		res.CompactedTableBytes = e.Stats().TableBytes
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	// The ground truth was allocated before the first reading: it must
	// still be there at this one, or the heap reads low by a byte a key.
	runtime.KeepAlive(newsPerKey)
	if after.HeapAlloc > before.HeapAlloc {
		res.HeapBytes = after.HeapAlloc - before.HeapAlloc
	}
	held := st.Commits // keys committed; all inside the window unless partitions were dropped
	if held > 0 {
		res.HeapBytesPerKey = float64(res.HeapBytes) / float64(held)
		res.DiskBytes, res.TableBytes, res.WALBytes = st.DiskBytes, st.TableBytes, st.WALBytes
		res.DiskBytesPerKey = float64(st.DiskBytes) / float64(held)
		res.TableBytesPerKey = float64(st.TableBytes) / float64(held)
	}
	if absent := st.BloomNegatives + st.BloomFalsePositives; absent > 0 {
		res.BloomFPMeasured = float64(st.BloomFalsePositives) / float64(absent)
	} else if o.Tiers == engine.BloomOnly && res.Fresh > 0 {
		// No exact tier to overturn a maybe: every false positive is a new
		// key answered Duplicate.
		res.BloomFPMeasured = float64(res.WronglyDropped) / float64(res.Fresh)
	}
	res.BloomFPConfigured = st.BloomTargetFP
	if st.Claims > 0 {
		res.MemoryHitRatio = float64(st.MemoryHits) / float64(st.Claims)
	}
	if st.MemoryMisses > 0 {
		res.BloomNegativeRatio = float64(st.BloomNegatives) / float64(st.MemoryMisses)
	}
	if st.StoreReads > 0 {
		res.StoreHitRatio = float64(st.StoreHits) / float64(st.StoreReads)
	}
	closed = true
	if err := e.Close(); err != nil {
		return res, err
	}
	return res, nil
}

// CheckRate refuses an open-loop rate whose batches would not be due
// between a nanosecond and an hour apart (NaN, infinite, negative, or so
// extreme that the schedule truncates or overflows: the run would be
// closed-loop while reporting the rate). Zero is closed-loop.
func CheckRate(rate float64, batch int) error {
	if rate == 0 {
		return nil
	}
	if !(rate > 0) || math.IsInf(rate, 0) {
		return fmt.Errorf("bench: Rate %v keys/s is not a rate", rate)
	}
	if batch <= 0 {
		batch = 256 // Run's default
	}
	secs := float64(batch) / rate
	if secs < 1e-9 || secs > 3600 {
		return fmt.Errorf("bench: Rate %v keys/s puts batches of %d %gs apart: want between a nanosecond and an hour", rate, batch, secs)
	}
	return nil
}

// perDay groups the series by simulated day (counted from start); first
// is where the series begins (the end of a warm-up).
func perDay(series []Point, start time.Time, first Point) []DayRate {
	var out []DayRate
	prev := first
	prevSim := first.SimTime
	for _, p := range series {
		// A sample covers (prev, p]: it belongs to the day it began in.
		day := int(prevSim.Sub(start) / (24 * time.Hour))
		prevSim = p.SimTime
		if len(out) == 0 || out[len(out)-1].Day != day {
			out = append(out, DayRate{Day: day})
		}
		d := &out[len(out)-1]
		d.Keys += p.Keys - prev.Keys
		d.KeysPerSec += (p.At - prev.At).Seconds() // wall seconds, divided below
		prev = p
	}
	for i := range out {
		if out[i].KeysPerSec > 0 {
			out[i].KeysPerSec = float64(out[i].Keys) / out[i].KeysPerSec
		}
	}
	return out
}

func percentiles(d []time.Duration) Percentiles {
	if len(d) == 0 {
		return Percentiles{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration { return d[min(len(d)-1, int(q*float64(len(d))))] }
	return Percentiles{P50: at(0.5), P99: at(0.99), P999: at(0.999), Max: d[len(d)-1]}
}
