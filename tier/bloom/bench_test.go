package bloom

import (
	"bytes"
	"strconv"
	"sync/atomic"
	"testing"
)

// BenchmarkProbeNew probes keys no filter holds, in batches of 256, with
// 1, 2, 4 and 8 of the default window's partitions filled to their expected
// 2M keys (filters far larger than the caches, as in production): the cost
// of a new key as the window fills.
func BenchmarkProbeNew(b *testing.B) {
	const n = 2_000_000
	f := newFilters(b, n, 0.01, 7)
	absent := keys("absent", 1<<20)
	out := make([]Probe, 256)
	filled := 0
	for _, full := range []int{1, 2, 4, 8} {
		for ; filled < full; filled++ {
			ks := keys("p"+strconv.Itoa(filled)+"-", n)
			for i := 0; i < n; i += 256 {
				f.Add(ks[i:min(i+256, n)], int64(filled))
			}
		}
		b.Run("full="+strconv.Itoa(full), func(b *testing.B) {
			hits := 0
			for i := 0; b.Loop(); i++ {
				j := (i * 256) & (len(absent) - 1)
				f.Test(absent[j:j+256], out)
				for _, p := range out {
					if p.Maybe != 0 {
						hits++
					}
				}
			}
			b.ReportMetric(float64(b.N)*256/b.Elapsed().Seconds(), "keys/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/256, "ns/key")
			b.ReportMetric(float64(hits)/float64(b.N)/256, "fp")
		})
	}
}

// BenchmarkAdd adds new keys to the newest partition from every core, in
// batches of 1 (a mark per message) and 256: the cost of the ring's
// in-flight counts is per call, so batch 1 shows it.
func BenchmarkAdd(b *testing.B) {
	const n = 2_000_000
	ks := keys("add", 1<<20)
	for _, batch := range []int{1, 256} {
		b.Run("batch="+strconv.Itoa(batch), func(b *testing.B) {
			f := newFilters(b, n, 0.01, 7)
			var worker atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				// Each goroutine walks the keys from its own offset: no
				// counter shared between cores but the filters' own.
				j := int(worker.Add(1)) * 4099 * batch
				for pb.Next() {
					j = (j + batch) & (len(ks) - 1)
					if j+batch > len(ks) {
						j = 0
					}
					f.Add(ks[j:j+batch], 7)
				}
			})
			b.ReportMetric(float64(b.N)*float64(batch)/b.Elapsed().Seconds(), "keys/s")
		})
	}
}

// BenchmarkMergeSealed merges the seven sealed partitions of a default
// window, each sized for 12.5M keys (100M keys over 8 days), into empty
// filters: one MergeSnapshot a file (a copy of the ring each), and all in
// one MergeSnapshots, as an Open after a crash does. The filters' part of
// the time to warm.
func BenchmarkMergeSealed(b *testing.B) {
	const n = 12_500_000
	f := newFilters(b, n, 0.01, 7)
	var srcs []SnapshotSource
	for p := int64(0); p < 7; p++ {
		f.Add(keys("p"+strconv.FormatInt(p, 10)+"-", 1000), p)
		var buf bytes.Buffer
		if _, err := f.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
			b.Fatal(err)
		}
		srcs = append(srcs, SnapshotSource{R: bytes.NewReader(buf.Bytes()), Size: int64(buf.Len())})
	}
	for _, together := range []bool{false, true} {
		b.Run("together="+strconv.FormatBool(together), func(b *testing.B) {
			for b.Loop() {
				g := newFilters(b, n, 0.01, 7)
				if together {
					for _, err := range g.MergeSnapshots(srcs) {
						if err != nil {
							b.Fatal(err)
						}
					}
					continue
				}
				for _, src := range srcs {
					if err := g.MergeSnapshot(src.R, src.Size, nil); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/open")
		})
	}
}
