package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/embedded"
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
	// DayProfiles, when set, is a path prefix: a CPU profile of each
	// simulated day of the measured part is written to DayProfiles +
	// "day<N>.pprof" (N from 1), started and stopped with the day's
	// figures in Result.PerDay, so day 1 and day 8 can be compared
	// function by function. It cannot be used while another CPU profile
	// runs (ErrConfig).
	DayProfiles string
	// Shared, when a server is set, runs the engine on that shared tier
	// behind memory (Engine.Tiers Default, no Dir, Backend or Archive):
	// over a Redis prefix or a PostgreSQL table of the run's own
	// (NewSharedTier), measured on the server at the end
	// (Result.Shared) and deleted unless Shared.Keep.
	//
	// A shared tier expires keys by the server's clock, not the engine's:
	// a run over days of simulated time expires nothing in seconds of
	// real time. Such a run measures what it can honestly: a stream whose
	// simulated span fits in the window (Workload.Span at most
	// Engine.Window, otherwise ErrConfig), so every key committed is still
	// held at the end, as it would be in real time, and the server's bytes
	// per held key and the rate of marks into a tier that expires nothing.
	// Expiry's own cost (Redis's expire cycle, PostgreSQL's sweep of a
	// partition's rows) is not in the figures.
	Shared SharedServer
}

// Point is one sample of a run's progress.
type Point struct {
	At         time.Duration // wall time since the start
	Keys       int64         // messages processed so far
	KeysPerSec float64       // over the last sample
	SimTime    time.Time     // the stream's simulated time
	Rotations  uint64        // partitions dropped so far
	DiskBytes  uint64        // Stats.Store.DiskBytes now: the directory as the OS allocates it
	// Disk is DiskBytes by part (Stats.Store.Disk).
	Disk engine.DiskParts
}

// simClock is an engine clock of simulated time: it moves a step per
// message processed.
type simClock struct {
	start     time.Time
	step      time.Duration
	processed *atomic.Int64
}

// Now maps the messages processed so far to simulated time.
func (c simClock) Now() time.Time {
	return c.start.Add(time.Duration(c.processed.Load()) * c.step)
}

// run is one Run's state, passed between its steps: the configuration
// with its defaults, the engine and its options, the stream, the figures
// the workers keep, and the Result being filled.
type run struct {
	rc     RunConfig
	stream *Stream
	// shared is the run's own instance of RunConfig.Shared's tier, nil
	// without one.
	shared *SharedTier
	o      engine.Options
	e      *engine.Engine
	res    *Result
	// processed counts the messages marked; the engine's clock reads it.
	processed atomic.Int64
	// newsPerKey is the New answers per fresh key, saturating: the ground
	// truth each answer is checked against.
	newsPerKey []uint8
	// before is the heap read before the engine opened.
	before runtime.MemStats
	// total is the number of messages, warm those of the warm-up.
	total, warm int64

	mu        sync.Mutex // guards stream, produced, batches and newsPerKey
	produced  int64
	latencies [][]time.Duration // per worker
	fresh     atomic.Int64
	news      atomic.Int64
	firstErr  error
	errOnce   sync.Once
	cancel    context.CancelFunc // ends the workers and the sampler
	segMu     sync.Mutex         // guards segEnds
	segEnds   []time.Time
	segLen    int64
	// dayBounds are the message counts at which a simulated day ends
	// (ascending; the last is total), dayEnds when the batch that crossed
	// each was answered: the exact per-day rates. Guarded by segMu.
	dayBounds []int64
	// dayProfile is the file of the running day's CPU profile
	// (RunConfig.DayProfiles), nil when none runs. Guarded by segMu once
	// the workers run.
	dayProfile *os.File
	dayEnds    []dayMark
	dayStart   dayMark // when the timed loop started
	// Open loop: the measured batches taken so far, when the first was
	// due, and the interval between two.
	batches  int64
	due0     time.Time
	interval time.Duration
}

// Run pushes the workload through an engine and measures it.
func Run(ctx context.Context, rc RunConfig) (_ *Result, err error) {
	stream, err := NewStream(rc.Workload)
	if err != nil {
		return nil, err
	}
	if rc, err = rc.withDefaults(); err != nil {
		return nil, err
	}
	r := &run{rc: rc, stream: stream}
	if rc.Shared.Redis != nil || rc.Shared.Postgres != nil {
		if rc.Shared.Redis != nil && !tier.Nil(rc.Shared.Redis) && rc.Shared.Postgres != nil {
			return nil, fmt.Errorf("%w: a shared tier is Redis or PostgreSQL, not both", ErrConfig)
		}
		if err := CheckShared(rc.Shared.Tier(), rc); err != nil {
			return nil, err
		}
		if r.shared, err = NewSharedTier(ctx, rc.Shared); err != nil {
			return nil, err
		}
		// Deferred first, so it runs after the engine is closed.
		defer func() {
			if derr := r.shared.Delete(ctx); derr != nil && err == nil {
				err = derr
			}
		}()
	}
	tmp, err := r.engineOptions()
	if err != nil {
		return nil, err
	}
	if tmp != "" {
		defer os.RemoveAll(tmp)
	}
	if err := r.openEngine(); err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			r.e.Close()
		}
	}()
	r.prepare()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r.cancel = cancel

	if r.warm > 0 {
		r.pump(ctx, r.warm, false) // the warm-up: checked, not measured
	}
	start, err := r.timedLoop(ctx)
	if err != nil {
		return nil, err
	}
	r.rates(start)
	r.checkAnswers()
	st, err := r.engineStats(ctx)
	if err != nil {
		return nil, err
	}
	r.heapAndDisk(st)
	r.filterAndHitRatios(st)
	if r.shared != nil {
		sr, err := r.shared.Measure(context.WithoutCancel(ctx))
		if err != nil {
			return nil, err
		}
		r.res.Shared = &sr
	}
	closed = true
	if err := r.e.Close(); err != nil {
		return r.res, err
	}
	return r.res, nil
}

// withDefaults returns rc with its zero fields given their defaults, or an
// error for a rate CheckRate refuses.
func (rc RunConfig) withDefaults() (RunConfig, error) {
	if rc.Batch <= 0 {
		rc.Batch = 256
	}
	if rc.Workers <= 0 {
		rc.Workers = 4 * runtime.GOMAXPROCS(0)
	}
	if err := CheckRate(rc.Rate, rc.Batch); err != nil {
		return rc, err
	}
	if rc.Sample <= 0 {
		rc.Sample = time.Second
	}
	if rc.Segments <= 0 {
		rc.Segments = 1
	}
	return rc, nil
}

// engineOptions sets r.o to the engine's options: RunConfig.Engine with,
// in the default configuration given no directory, a temporary directory
// (returned, for Run to remove), the stream's simulated clock, and a lease
// that outlasts it.
func (r *run) engineOptions() (tmp string, err error) {
	r.o = r.rc.Engine
	o := &r.o
	// While one batch is between claim and commit, the other workers move
	// the simulated clock by their batches. A lease shorter than that ends
	// under the run's own claims: their keys answer InFlight, which the
	// check counts as new keys dropped. Refused, not reported as the
	// engine's error.
	lease := o.Lease
	if lease == 0 {
		lease = o.WithDefaults().Window / 2
	}
	// Compared by division: step × batch × workers overflows for a span of
	// years over a handful of keys.
	if perKey := lease / time.Duration(r.rc.Batch*r.rc.Workers); lease > 0 && r.stream.step >= perKey {
		moved := float64(r.stream.step) * float64(r.rc.Batch*r.rc.Workers)
		return "", fmt.Errorf("%w: %d workers' batches of %d keys move the simulated clock %.0fh while one is in flight, past the claims' lease of %v (half the window): give more keys (-keys), a shorter span (-span) or a longer window (-window)",
			ErrConfig, r.rc.Workers, r.rc.Batch, moved/float64(time.Hour), lease)
	}
	if r.shared != nil {
		o.Backend = r.shared.Backend()
	}
	if eb := embeddedIn(o); o.Tiers == engine.Default && (o.Backend == nil || eb != nil && eb.Dir == "" && eb.FS == nil) {
		if tmp, err = os.MkdirTemp("", "dedupbench-"); err != nil {
			return "", err
		}
		b := embedded.Backend{}
		if eb != nil {
			b = *eb
		}
		b.Dir = tmp
		o.Backend = &b
	}
	if o.Tiers == engine.BloomOnly && o.Backend == nil {
		o.Backend = &embedded.Backend{}
	}
	o.Clock = simClock{start: r.stream.Now(), step: r.stream.step, processed: &r.processed}
	if o.Lease == 0 {
		// Simulated time runs fast: while one batch is between claim and
		// commit, the other workers move the clock by many batches, which
		// may be hours. The lease must outlast that, as a real lease
		// outlasts a handler; no benchmark worker crashes, so a long lease
		// costs nothing here.
		o.Lease = o.WithDefaults().Window / 2
	}
	return tmp, nil
}

// openEngine allocates the ground truth, reads the heap, and opens the
// engine: the heap the engine then grows is what Result.HeapBytes reports.
func (r *run) openEngine() error {
	// News per fresh key, saturating: the ground truth each answer is
	// checked against (one byte a message, allocated before the heap is
	// measured).
	r.newsPerKey = make([]uint8, max(r.rc.Workload.Keys, 0))
	runtime.GC()
	runtime.ReadMemStats(&r.before)
	e, err := engine.Open(&r.o)
	if err != nil {
		return err
	}
	r.e = e
	return nil
}

// prepare sizes the run: the messages in all and of the warm-up, the
// Result to fill, the workers' latencies, the segments, and the open
// loop's interval between batches.
func (r *run) prepare() {
	rc := &r.rc
	r.total = max(rc.Workload.Keys, 0)
	r.warm = min(max(rc.Warmup, 0), r.total)
	r.res = &Result{Tiers: r.o.Name(), Workload: r.stream.Config(), Batch: rc.Batch, Workers: rc.Workers, Warmup: r.warm,
		MemoryCapacity: r.o.MemoryCapacity, Rate: max(rc.Rate, 0), ExpectedKeys: r.o.ExpectedKeys}
	if r.res.MemoryCapacity == 0 {
		r.res.MemoryCapacity = memory.DefaultCapacity
	}
	r.latencies = make([][]time.Duration, rc.Workers)
	r.segEnds = make([]time.Time, rc.Segments)
	r.segLen = max(1, (r.total-r.warm)/int64(rc.Segments))
	r.dayBounds = dayBounds(r.warm, r.total, r.stream.step)
	r.dayEnds = make([]dayMark, len(r.dayBounds))
	if rc.Rate > 0 {
		r.interval = time.Duration(float64(rc.Batch) / rc.Rate * float64(time.Second))
	}
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
