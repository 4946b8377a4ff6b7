package bench

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// RatePoint is one open-loop run of a rate search.
type RatePoint struct {
	// Rate is the offered load, keys/s; Achieved what the run sustained.
	Rate, Achieved float64
	// Latency is the batches' latency, each from when it was due.
	Latency Percentiles
	// OK: the p99 stayed at most the target and the run kept up (it
	// sustained at least 95 % of the offered rate).
	OK bool
}

// Search is the outcome of SearchRate.
type Search struct {
	Target time.Duration
	// Ceiling is the closed-loop throughput the search starts from.
	Ceiling float64
	// Best is the highest rate found OK (zero Rate if none was).
	Best  RatePoint
	Tried []RatePoint
}

// SearchRate finds the highest rate rc's engine sustains open-loop with a
// batch p99, measured from each batch's due time, at most target. A
// closed-loop run gives the ceiling; then steps open-loop runs bisect
// between the highest rate found OK and the lowest found not OK, starting
// at 90 % of the ceiling. Every run is a fresh engine over the same
// workload.
func SearchRate(ctx context.Context, rc RunConfig, target time.Duration, steps int) (*Search, error) {
	if target <= 0 || steps < 1 {
		return nil, fmt.Errorf("bench: search: target %v and steps %d must be positive", target, steps)
	}
	closed := rc
	closed.Rate = 0
	res, err := Run(ctx, closed)
	if err != nil {
		return nil, err
	}
	if err := res.Exactness(); err != nil {
		return nil, err
	}
	s := &Search{Target: target, Ceiling: res.KeysPerSec}
	lo, hi := 0.0, res.KeysPerSec
	rate := 0.9 * hi
	for range steps {
		open := rc
		open.Rate = rate
		r, err := Run(ctx, open)
		if err != nil {
			return s, err
		}
		if err := r.Exactness(); err != nil {
			return s, err
		}
		p := RatePoint{Rate: rate, Achieved: r.KeysPerSec, Latency: r.BatchLatency}
		p.OK = p.Latency.P99 <= target && p.Achieved >= 0.95*rate
		s.Tried = append(s.Tried, p)
		if p.OK {
			lo, s.Best = rate, p
		} else {
			hi = rate
		}
		rate = (lo + hi) / 2
		if err := ctx.Err(); err != nil {
			return s, errors.Join(err, fmt.Errorf("bench: search stopped after %d runs", len(s.Tried)))
		}
	}
	return s, nil
}
