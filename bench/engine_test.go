package bench_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// The benchmarks push one key stream (36-byte UUIDv4 strings, 90 % new, 10 %
// duplicates of about the last 1000 keys, generated before the timer) through each
// engine configuration and, in the same run, through the naive structures
// they replace. Every sub-benchmark reports keys/s; compare them with
// benchstat, slicing on tier= and batch=.
//
//	go test -run '^$' -bench . -cpu 1,2 ./bench/

var (
	streamMu sync.Mutex
	stream   *bench.Workload
)

// keys returns the first n keys of the shared stream, generating it once.
func keys(b *testing.B, n int) [][]byte {
	streamMu.Lock()
	defer streamMu.Unlock()
	if stream == nil || len(stream.Keys) < n {
		b.StopTimer()
		// 90 % new; duplicates within the last 10 simulated seconds of a
		// stream of 10M keys a day: about the last 1000 keys.
		total := max(n, 1<<16)
		span := time.Duration(float64(24*time.Hour) * float64(total) / 10e6)
		w, err := bench.Generate(bench.WorkloadConfig{Keys: int64(total), DupRatio: 0.1, DupReach: 10 * time.Second, Span: span, Seed: 1})
		if err != nil {
			b.Fatal(err)
		}
		stream = w
		b.StartTimer()
	}
	return stream.Keys[:n]
}

// deduper is what a benchmark drives: mark a batch of keys, one outcome each.
type deduper interface {
	mark(keys [][]byte, out []engine.Outcome) error
	close()
}

type target struct {
	name string
	open func(b *testing.B) deduper
}

var quiet = log.New(io.Discard, "", 0)

// quietEngine discards an engine\'s logs.
var quietEngine = slog.New(slog.DiscardHandler)

// parallelism is goroutines per CPU. A consumer runs several workers per
// core (one per broker partition) so that one batch's fsync overlaps another
// batch's work; with one goroutine per core the CPU idles during every fsync.
const parallelism = 4

func engineTarget(name string, o engine.Options) target {
	return target{name, func(b *testing.B) deduper {
		o := o
		o.Logger = quietEngine
		if o.Tiers == engine.Default {
			o.Backend = embedded.Dir(b.TempDir())
		}
		e, err := engine.Open(&o)
		if err != nil {
			b.Fatal(err)
		}
		return engineDeduper{e}
	}}
}

type engineDeduper struct{ e *engine.Engine }

func (d engineDeduper) mark(keys [][]byte, out []engine.Outcome) error {
	return d.e.MarkBatch(context.Background(), keys, nil, out)
}
func (d engineDeduper) close()              { _ = d.e.Close() }
func (d engineDeduper) stats() engine.Stats { return d.e.Stats() }

// statser is implemented by dedupers backed by an engine.
type statser interface{ stats() engine.Stats }

// mapMutex is the simplest exact set: a map under one mutex, never expiring.
type mapMutex struct {
	mu sync.Mutex
	m  map[string]struct{}
}

func (d *mapMutex) mark(keys [][]byte, out []engine.Outcome) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, k := range keys {
		if _, ok := d.m[string(k)]; ok {
			out[i] = engine.Duplicate
			continue
		}
		d.m[string(k)] = struct{}{}
		out[i] = engine.New
	}
	return nil
}
func (d *mapMutex) close() {}

// lruSet is hashicorp/golang-lru/v2 holding as many keys as the memory tier.
type lruSet struct{ c *lru.Cache[string, struct{}] }

func (d lruSet) mark(keys [][]byte, out []engine.Outcome) error {
	for i, k := range keys {
		if ok, _ := d.c.ContainsOrAdd(string(k), struct{}{}); ok {
			out[i] = engine.Duplicate
		} else {
			out[i] = engine.New
		}
	}
	return nil
}
func (d lruSet) close() {}

// pebbleMark is a PebbleBaseline as a deduper: with Read, the durable
// recipe the default configuration replaces (one Get per key, a Set for
// each absent key, one synced batch per call); without, the synced writes
// alone.
type pebbleMark struct{ p *bench.PebbleBaseline }

func (d pebbleMark) mark(keys [][]byte, out []engine.Outcome) error {
	fresh := make([]bool, len(keys))
	if err := d.p.Mark(context.Background(), keys, fresh); err != nil {
		return err
	}
	for i, f := range fresh {
		out[i] = engine.Duplicate
		if f {
			out[i] = engine.New
		}
	}
	return nil
}
func (d pebbleMark) close() { d.p.Close() }

func pebbleTarget(name string, read bool) target {
	return target{name, func(b *testing.B) deduper {
		p, err := bench.OpenPebbleBaseline(bench.PebbleBaselineOptions{Dir: b.TempDir(), Read: read})
		if err != nil {
			b.Fatal(err)
		}
		return pebbleMark{p}
	}}
}

var targets = []target{
	engineTarget("memory", engine.Options{Tiers: engine.MemoryOnly}),
	{"baseline-map", func(*testing.B) deduper { return &mapMutex{m: map[string]struct{}{}} }},
	{"baseline-golang-lru", func(b *testing.B) deduper {
		c, err := lru.New[string, struct{}](1 << 20)
		if err != nil {
			b.Fatal(err)
		}
		return lruSet{c}
	}},
	engineTarget("bloom", engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly}),
	engineTarget("default", engine.Options{}),
	pebbleTarget("baseline-pebble-get-set", true),
	pebbleTarget("baseline-pebble-synced-writes", false),
}

func BenchmarkMark(b *testing.B) {
	for _, batch := range []int{1, 256} {
		for _, tg := range targets {
			b.Run(fmt.Sprintf("tier=%s/batch=%d", tg.name, batch), func(b *testing.B) {
				d := tg.open(b)
				defer d.close()
				runMark(b, d, batch)
			})
		}
	}
}

// runMark pushes b.N keys of the stream through d in batches, from
// parallelism goroutines per CPU, and reports keys/s.
func runMark(b *testing.B, d deduper, batch int) {
	stream := keys(b, b.N)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	var next atomic.Int64
	var news atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([][]byte, 0, batch)
		out := make([]engine.Outcome, batch)
		var fresh int64
		flush := func() {
			if err := d.mark(buf, out[:len(buf)]); err != nil {
				b.Error(err)
			}
			for _, o := range out[:len(buf)] {
				if o == engine.New {
					fresh++
				}
			}
			buf = buf[:0]
		}
		for pb.Next() {
			buf = append(buf, stream[next.Add(1)-1])
			if len(buf) == batch {
				flush()
			}
		}
		if len(buf) > 0 {
			flush()
		}
		news.Add(fresh)
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "keys/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/key")
	b.ReportMetric(float64(news.Load())/float64(b.N), "new-ratio")
	s, ok := d.(statser)
	if !ok {
		return
	}
	st := s.stats()
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if st.Calls.Commits > 0 {
		b.ReportMetric(float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/float64(st.Calls.Commits), "heap-B/key")
		b.ReportMetric(float64(st.Store.DiskBytes)/float64(st.Calls.Commits), "disk-B/key")
	}
	if st.Calls.Claims > 0 {
		b.ReportMetric(float64(st.Memory.Hits)/float64(st.Calls.Claims), "hit-ratio")
	}
	if absent := st.Bloom.Negatives + st.Bloom.FalsePositives; absent > 0 {
		b.ReportMetric(float64(st.Bloom.FalsePositives)/float64(absent), "fp-rate")
	}
}
