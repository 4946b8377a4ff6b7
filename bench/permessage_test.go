package bench_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// BenchmarkPerMessage measures consumers that handle one message at a
// time, each beside MarkBatch of 256 in the same run (8 goroutines at
// -cpu 2), over the shared stream (36-byte keys, 90 % new), the default
// configuration, synced:
//
//   - op=do/goroutines=N: Do per message (claim, a no-op handler, commit)
//     from N goroutines;
//   - op=claim-commit-async/goroutines=1: one goroutine, Claim, a no-op
//     handler, CommitAsync; a message is done when its done ran;
//   - op=fsync: a 64-byte write and fsync of a file in the same directory,
//     the floor of a synced commit's latency.
//
// Each reports msgs/s and, where a call's latency is one message's, its
// p50 and p99 in microseconds.
//
//	go test -run '^$' -bench PerMessage -benchtime 200000x -cpu 2 ./bench/
func BenchmarkPerMessage(b *testing.B) {
	b.Run("op=markbatch/batch=256", func(b *testing.B) {
		d := engineTarget("default", engine.Options{}).open(b)
		defer d.close()
		runMark(b, d, 256)
	})
	for _, g := range []int{1, 64} {
		b.Run(fmt.Sprintf("op=do/goroutines=%d", g), func(b *testing.B) {
			e := openDefault(b)
			defer e.Close()
			stream := keys(b, b.N)
			var next atomic.Int64
			lat := newLatencies(b.N)
			noop := func(context.Context) error { return nil }
			b.ResetTimer()
			var wg sync.WaitGroup
			for range g {
				wg.Go(func() {
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							return
						}
						start := time.Now()
						if _, err := e.Do(context.Background(), stream[i], noop); err != nil {
							b.Error(err)
							return
						}
						lat.add(i, time.Since(start))
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			lat.report(b)
			st := e.Stats()
			b.ReportMetric(float64(st.Calls.Commits)/float64(max(st.Queue.Groups, 1)), "commits/group")
		})
	}
	b.Run("op=claim-commit-async/goroutines=1", func(b *testing.B) {
		e := openDefault(b)
		defer e.Close()
		stream := keys(b, b.N)
		var done atomic.Int64
		var failed atomic.Value
		all := make(chan struct{})
		finish := func(err error) {
			if err != nil {
				failed.Store(err)
			}
			if done.Add(1) == int64(b.N) {
				close(all)
			}
		}
		ctx := context.Background()
		b.ResetTimer()
		for i := range b.N {
			c, err := e.Claim(ctx, stream[i])
			if err != nil {
				b.Fatal(err)
			}
			if c.Outcome != engine.New {
				finish(nil) // a duplicate is done at once: ack it
				continue
			}
			e.CommitAsync(ctx, c, finish) // the handler: nothing
		}
		<-all
		b.StopTimer()
		if err, ok := failed.Load().(error); ok {
			b.Fatal(err)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		st := e.Stats()
		b.ReportMetric(float64(st.Calls.Commits)/float64(max(st.Queue.Groups, 1)), "commits/group")
	})
	b.Run("op=fsync", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "f"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		buf := make([]byte, 64)
		lat := newLatencies(b.N)
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			if _, err := f.Write(buf); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			lat.add(i, time.Since(start))
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		lat.report(b)
	})
}

// openDefault opens the default configuration in a temporary directory.
func openDefault(b *testing.B) *engine.Engine {
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(b.TempDir()), Logger: quietEngine})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// latencies records one duration per message.
type latencies struct{ d []time.Duration }

func newLatencies(n int) *latencies { return &latencies{d: make([]time.Duration, n)} }

func (l *latencies) add(i int, d time.Duration) { l.d[i] = d }

func (l *latencies) report(b *testing.B) {
	s := slices.Clone(l.d)
	slices.Sort(s)
	b.ReportMetric(float64(s[len(s)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(s[len(s)*99/100].Nanoseconds())/1e3, "p99-µs")
}
