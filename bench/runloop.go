package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// timedLoop is the measured part of a run: it starts the sampler's
// progress ticks, runs the workers through the rest of the stream (unless
// the warm-up failed), stops the sampler and closes the series. It returns
// when the loop started, or the first worker error that is not a
// cancellation.
func (r *run) timedLoop(ctx context.Context) (time.Time, error) {
	if err := r.profileDay(0); err != nil {
		return time.Now(), err
	}
	defer func() {
		r.segMu.Lock()
		r.stopDayProfile()
		r.segMu.Unlock()
	}()
	r.dayStart = r.mark()
	start := r.dayStart.at
	r.due0 = start
	sampled := make(chan struct{})
	go r.sample(ctx, start, sampled)
	if r.firstErr == nil {
		r.pump(ctx, r.total, true)
	}
	r.res.Elapsed = time.Since(start)
	r.cancel()
	<-sampled
	r.closeSeries()
	if r.firstErr != nil && !errors.Is(r.firstErr, context.Canceled) {
		return start, fmt.Errorf("bench: run: %w", r.firstErr)
	}
	return start, nil
}

// pump runs the workers until the stream has produced limit messages;
// measure records their latencies and the segments' ends.
func (r *run) pump(ctx context.Context, limit int64, measure bool) {
	var wg sync.WaitGroup
	for w := range r.rc.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.work(ctx, w, limit, measure)
		}()
	}
	wg.Wait()
}

// work is worker w of pump: it takes batches until the stream has produced
// limit messages or ctx ends, marks each (an open-loop batch no earlier
// than it is due), and counts its answers. The first error cancels the run.
func (r *run) work(ctx context.Context, w int, limit int64, measure bool) {
	var keys [][]byte
	var kinds []Kind
	idx := make([]int64, 0, r.rc.Batch)
	out := make([]engine.Outcome, r.rc.Batch)
	for ctx.Err() == nil {
		var due time.Time
		keys, kinds, idx, due = r.take(keys, kinds, idx, limit, measure)
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
		if err := r.e.MarkBatch(ctx, keys, nil, out[:len(keys)]); err != nil {
			r.errOnce.Do(func() { r.firstErr = err; r.cancel() })
			return
		}
		if measure {
			r.latencies[w] = append(r.latencies[w], time.Since(t0))
		}
		r.count(kinds, idx, out[:len(keys)])
		v := r.processed.Add(int64(len(keys)))
		if measure {
			r.endSegments(v, int64(len(keys)))
		}
	}
}

// take fills keys, kinds and idx with the stream's next batch, no further
// than limit messages, and returns them with the time the batch is due: a
// measured batch of an open loop is due an interval after the one before,
// any other at the zero time.
func (r *run) take(keys [][]byte, kinds []Kind, idx []int64, limit int64, measure bool) ([][]byte, []Kind, []int64, time.Time) {
	r.mu.Lock()
	keys, kinds, idx = r.stream.IndexedBatch(keys, kinds, idx, int(min(int64(r.rc.Batch), limit-r.produced)))
	r.produced += int64(len(keys))
	var due time.Time
	if measure && r.interval > 0 {
		due = r.due0.Add(time.Duration(r.batches) * r.interval)
		r.batches++
	}
	r.mu.Unlock()
	return keys, kinds, idx, due
}

// count adds a batch's fresh keys and New answers to the run's totals, and
// each New answer to its key's count in the ground truth.
func (r *run) count(kinds []Kind, idx []int64, out []engine.Outcome) {
	var f, n int64
	for i, k := range kinds {
		if k == Fresh {
			f++
		}
		if out[i] == engine.New {
			n++
		}
	}
	r.fresh.Add(f)
	r.news.Add(n)
	r.mu.Lock()
	for i, o := range out {
		if o == engine.New && r.newsPerKey[idx[i]] < 255 {
			r.newsPerKey[idx[i]]++
		}
	}
	r.mu.Unlock()
}

// endSegments records now as the end of the segments and simulated days
// whose last message is in the batch of n messages that brought the count processed to v.
func (r *run) endSegments(v, n int64) {
	// The batch that carries the count past a segment's last message ends
	// that segment.
	now := time.Now()
	r.segMu.Lock()
	for k := range r.segEnds {
		end := r.warm + int64(k+1)*r.segLen
		if k == len(r.segEnds)-1 {
			end = r.total
		}
		if end <= v && end > v-n {
			r.segEnds[k] = now
		}
	}
	for k, end := range r.dayBounds {
		if end <= v && end > v-n {
			r.dayEnds[k] = r.mark()
			r.stopDayProfile()
			if k+1 < len(r.dayBounds) {
				if err := r.profileDay(k + 1); err != nil {
					r.errOnce.Do(func() { r.firstErr = err; r.cancel() })
				}
			}
		}
	}
	r.segMu.Unlock()
}

// sample is the progress ticks of the timed loop that started at start:
// every RunConfig.Sample until ctx ends, it appends a Point to the series
// and passes it to RunConfig.Progress. It closes done when it returns.
func (r *run) sample(ctx context.Context, start time.Time, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(r.rc.Sample)
	defer t.Stop()
	last, lastAt := r.processed.Load(), time.Duration(0)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		n, at := r.processed.Load(), time.Since(start)
		st := r.e.Stats()
		p := Point{At: at, Keys: n, KeysPerSec: float64(n-last) / (at - lastAt).Seconds(),
			SimTime: r.o.Clock.Now(), Rotations: st.Store.PartitionsDropped, DiskBytes: st.Store.DiskBytes, Disk: st.Store.Disk}
		last, lastAt = n, at
		r.res.Series = append(r.res.Series, p)
		if r.rc.Progress != nil {
			r.rc.Progress(p)
		}
	}
}

// closeSeries appends a last point to the series, so that even a run
// shorter than one sample has a series.
func (r *run) closeSeries() {
	res := r.res
	last := Point{Keys: r.warm}
	if len(res.Series) > 0 {
		last = res.Series[len(res.Series)-1]
	}
	if n := r.processed.Load(); n > last.Keys {
		res.Series = append(res.Series, Point{At: res.Elapsed, Keys: n,
			KeysPerSec: float64(n-last.Keys) / (res.Elapsed - last.At).Seconds(),
			SimTime:    r.o.Clock.Now(), Rotations: r.e.Stats().Store.PartitionsDropped})
	}
}

// dayMark is what the run had spent when a simulated day ended: wall
// time, process CPU time, GC cycles, and the store's bytes written to the
// WAL and to SSTs.
type dayMark struct {
	at               time.Time
	cpu              time.Duration
	gcs              uint64
	walBytes, tables uint64
}

// mark reads the run's spending now.
func (r *run) mark() dayMark {
	m := dayMark{at: time.Now(), cpu: processCPU()}
	sample := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() == metrics.KindUint64 {
		m.gcs = sample[0].Value.Uint64()
	}
	if r.e != nil {
		st := r.e.Stats()
		m.walBytes, m.tables = st.Store.WALWrittenBytes, st.Store.TableWrittenBytes
	}
	return m
}

// processCPU is the CPU time the process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// profileDay starts the CPU profile of simulated day k (from 0) when
// RunConfig.DayProfiles is set. Once the workers run, the caller holds
// r.segMu.
func (r *run) profileDay(k int) error {
	if r.rc.DayProfiles == "" {
		return nil
	}
	f, err := os.Create(r.rc.DayProfiles + "day" + strconv.Itoa(k+1) + ".pprof")
	if err != nil {
		return fmt.Errorf("%w: day profile: %w", ErrConfig, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("%w: day profile: %w", ErrConfig, err)
	}
	r.dayProfile = f
	return nil
}

// stopDayProfile ends the running day's profile, if any.
func (r *run) stopDayProfile() {
	if r.dayProfile == nil {
		return
	}
	pprof.StopCPUProfile()
	_ = r.dayProfile.Close()
	r.dayProfile = nil
}
