package engine

import (
	"sync/atomic"
	"time"
)

// Histogram is a latency distribution since Open, in seconds: Counts[i]
// observations took at most Bounds[i] (cumulative, as Prometheus counts
// buckets), Count all of them, Sum their total.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Count  uint64
	Sum    float64
}

// latencyBounds are the bounds of the engine's latency histograms, in
// seconds: from a tenth of a millisecond (an fsync on a fast disk, a Redis
// round trip on loopback) to ten seconds.
var latencyBounds = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}

// latency counts observations into latencyBounds, lock-free.
type latency struct {
	buckets [16]atomic.Uint64 // per bound, then above the last
	count   atomic.Uint64
	sumNS   atomic.Int64
}

func (l *latency) observe(d time.Duration) {
	s := d.Seconds()
	i := 0
	for i < len(latencyBounds) && s > latencyBounds[i] {
		i++
	}
	l.buckets[i].Add(1)
	l.count.Add(1)
	l.sumNS.Add(int64(d))
}

// snapshot returns the histogram; its cumulative counts may trail Count by
// observations made meanwhile.
func (l *latency) snapshot() Histogram {
	h := Histogram{Bounds: latencyBounds, Counts: make([]uint64, len(latencyBounds)), Count: l.count.Load(), Sum: time.Duration(l.sumNS.Load()).Seconds()}
	var cum uint64
	for i := range latencyBounds {
		cum += l.buckets[i].Load()
		h.Counts[i] = cum
	}
	return h
}
