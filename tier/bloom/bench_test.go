package bloom

import (
	"strconv"
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
