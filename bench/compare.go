package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// CompareRow is one line of a side-by-side comparison.
type CompareRow struct {
	Name string
	// Group is GroupBatch or GroupPerMessage: rows are compared within
	// their group, with the engine's row of the group.
	Group string
	// Batch is the keys per call; Concurrency the goroutines (or
	// connections) calling.
	Batch, Concurrency int
	Keys               int64
	Elapsed            time.Duration
	KeysPerSec         float64
	// Ratio is the keys/s of the engine's row of the group divided by this
	// row's (zero for the engine's rows).
	Ratio float64
	// Skipped says why the row did not run (no server answered).
	Skipped string `json:",omitempty"`
}

// The groups of a comparison.
const (
	GroupBatch      = "batch"
	GroupPerMessage = "per message"
)

// Baseline is a dedup table that users replace: it marks a batch of keys
// and reports, per key, whether it was new.
type Baseline interface {
	Mark(ctx context.Context, keys [][]byte, fresh []bool) error
	Close()
}

// Flusher is a Baseline whose marks complete after Mark returns (an
// engine committing asynchronously): RunBaseline calls Flush before it
// stops the clock.
type Flusher interface {
	Flush(ctx context.Context) error
}

// RunBaseline pushes the workload through b from workers goroutines in
// batches of batch keys until the stream ends or budget elapses.
func RunBaseline(ctx context.Context, name string, b Baseline, wc WorkloadConfig, batch, workers int, budget time.Duration) (CompareRow, error) {
	stream, err := NewStream(wc)
	if err != nil {
		return CompareRow{}, err
	}
	var mu sync.Mutex
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var keys [][]byte
			var kinds []Kind
			fresh := make([]bool, batch)
			for ctx.Err() == nil {
				mu.Lock()
				keys, kinds = stream.Batch(keys, kinds, batch)
				mu.Unlock()
				if len(keys) == 0 {
					return
				}
				if err := b.Mark(ctx, keys, fresh[:len(keys)]); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { firstErr = err; cancel() })
					}
					return
				}
				done.Add(int64(len(keys)))
			}
		}()
	}
	wg.Wait()
	if f, ok := b.(Flusher); ok && firstErr == nil {
		firstErr = f.Flush(context.WithoutCancel(ctx))
	}
	el := time.Since(start)
	if firstErr != nil {
		return CompareRow{}, fmt.Errorf("%s: %w", name, firstErr)
	}
	group := GroupBatch
	if batch == 1 {
		group = GroupPerMessage
	}
	return CompareRow{Name: name, Group: group, Batch: batch, Concurrency: workers, Keys: done.Load(), Elapsed: el, KeysPerSec: float64(done.Load()) / el.Seconds()}, nil
}

// Ratios fills each row's Ratio against the keys/s of the first engine row
// of its group.
func Ratios(rows []CompareRow) {
	ref := map[string]float64{}
	for _, r := range rows {
		if _, ok := ref[r.Group]; !ok && strings.HasPrefix(r.Name, "engine") && r.KeysPerSec > 0 {
			ref[r.Group] = r.KeysPerSec
		}
	}
	for i := range rows {
		if rows[i].KeysPerSec > 0 && !strings.HasPrefix(rows[i].Name, "engine") && ref[rows[i].Group] > 0 {
			rows[i].Ratio = ref[rows[i].Group] / rows[i].KeysPerSec
		}
	}
}
