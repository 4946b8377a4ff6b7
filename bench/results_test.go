package bench_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// BenchmarkStoredResult measures what a stored result costs in the default
// configuration: b.N keys claimed and committed in batches of 256, each
// with a random (incompressible) result of the sub-benchmark's size, then
// every key claimed again as a duplicate; result=0B/memory=16 is the
// baseline of duplicates read from the store (a memory tier of 16 keys),
// result=0B/namespace-window the cost of dating every commit (a namespace
// with a window of its own).
// It reports the store's bytes per
// key after a full compaction, commits per second (keys/s) and duplicate
// answers per second (dup-keys/s): a duplicate with a result is read from
// the store, never from memory, which keeps no results beside an exact
// tier.
func BenchmarkStoredResult(b *testing.B) {
	for _, c := range []struct {
		size, memory int
		dated        bool
	}{{0, 0, false}, {0, 16, false}, {0, 0, true}, {64, 0, false}, {512, 0, false}} {
		size := c.size
		name := fmt.Sprintf("result=%dB", size)
		if c.memory > 0 {
			name += fmt.Sprintf("/memory=%d", c.memory)
		}
		o := engine.Options{MemoryCapacity: c.memory, Logger: quietEngine}
		if c.dated {
			// A namespace window of its own: every commit stores its time.
			name += "/namespace-window"
			o.Namespaces = map[string]engine.NamespaceOptions{"": {Window: 24 * time.Hour}}
		}
		b.Run(name, func(b *testing.B) {
			ctx := context.Background()
			o.Backend, o.ExpectedKeys = embedded.Dir(b.TempDir()), max(b.N, 1000)
			e, err := engine.Open(&o)
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			ks := keys(b, b.N)
			rng := rand.New(rand.NewPCG(uint64(size), 1))
			results := make([][]byte, 256)
			for i := range results {
				if size > 0 {
					results[i] = make([]byte, size)
					for j := range results[i] {
						results[i][j] = byte(rng.Uint32())
					}
				}
			}
			claims := make([]engine.Claim, 256)
			b.ResetTimer()
			t0 := time.Now()
			for i := 0; i < len(ks); i += 256 {
				batch := ks[i:min(i+256, len(ks))]
				out := claims[:len(batch)]
				if err := e.ClaimBatch(ctx, batch, nil, out); err != nil {
					b.Fatal(err)
				}
				for j := range out {
					out[j].Result = results[j]
				}
				if err := e.CommitBatch(ctx, out, nil); err != nil {
					b.Fatal(err)
				}
			}
			t1 := time.Now()
			dups := 0
			for i := 0; i < len(ks); i += 256 {
				batch := ks[i:min(i+256, len(ks))]
				out := claims[:len(batch)]
				if err := e.ClaimBatch(ctx, batch, nil, out); err != nil {
					b.Fatal(err)
				}
				for j := range out {
					if out[j].Outcome == engine.Duplicate && len(out[j].Result) == size {
						dups++
					}
				}
				if err := e.ReleaseBatch(ctx, out, nil); err != nil {
					b.Fatal(err)
				}
			}
			t2 := time.Now()
			b.StopTimer()
			if err := e.Compact(ctx); err != nil {
				b.Fatal(err)
			}
			s := e.Stats()
			if dups != len(ks) {
				b.Fatalf("%d of %d keys answered Duplicate with their result", dups, len(ks))
			}
			b.ReportMetric(float64(s.Store.TableBytes)/float64(s.Calls.Commits), "bytes/key")
			b.ReportMetric(float64(s.Calls.Commits)/t1.Sub(t0).Seconds(), "keys/s")
			b.ReportMetric(float64(dups)/t2.Sub(t1).Seconds(), "dup-keys/s")
		})
	}
}
