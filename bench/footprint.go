package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// FootprintPoint is what an engine costs once it holds Keys keys, each
// figure as the process or the OS counts it.
type FootprintPoint struct {
	// Keys is the distinct keys marked so far.
	Keys int64
	// EngineDiskBytes is the engine's own figure (Stats.Store.DiskBytes);
	// DuBytes the blocks allocated to the files under the store's
	// directory, summed by walking it as du does.
	EngineDiskBytes, DuBytes uint64
	// HeapBytes is the Go heap in use after a collection
	// (runtime.MemStats.HeapAlloc); BloomBytes the filters' part of it
	// (Stats.Bloom.Bytes).
	HeapBytes, BloomBytes uint64
	// RSSBytes is the process's resident memory now (VmRSS), PeakRSSBytes
	// its peak so far (VmHWM): the program, the heap with the collector's
	// room, Pebble's memtables and cache.
	RSSBytes, PeakRSSBytes uint64
}

// Footprint is a footprint run: the engine's cost at each of the counts
// it was asked for, and the directory after Close.
type Footprint struct {
	Points []FootprintPoint
	// ClosedDuBytes is the directory's allocated blocks after Close.
	ClosedDuBytes uint64
}

// ErrFootprintSteps is returned by MeasureFootprint for counts that are not
// positive and increasing.
var ErrFootprintSteps = errors.New("bench: footprint counts must be positive and increasing")

// MeasureFootprint opens an engine with o (the default configuration over
// a fresh temporary directory, removed at the end, when o names no
// backend) and marks distinct keys ("key-<n>", batches of 1000) until it
// holds each of steps in turn, measuring it at each. The process's RSS is
// the whole process's: run it in a process of its own (dedupbench
// footprint) for figures that are the engine's.
func MeasureFootprint(ctx context.Context, o engine.Options, steps []int64) (*Footprint, error) {
	for i, n := range steps {
		if n < 1 || i > 0 && n <= steps[i-1] {
			return nil, fmt.Errorf("%w: %v", ErrFootprintSteps, steps)
		}
	}
	if len(steps) == 0 {
		return nil, fmt.Errorf("%w: none given", ErrFootprintSteps)
	}
	var dir string
	if o.Backend == nil && o.Tiers == engine.Default {
		var err error
		if dir, err = os.MkdirTemp("", "dedupbench-footprint-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
		o.Backend = embedded.Dir(dir)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	e, err := engine.Open(&o)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	var fp Footprint
	keys := make([][]byte, 1000)
	out := make([]engine.Outcome, len(keys))
	var marked int64
	for _, target := range steps {
		for marked < target {
			n := min(int64(len(keys)), target-marked)
			for j := range n {
				keys[j] = fmt.Appendf(keys[j][:0], "key-%d", marked+j)
			}
			if err := e.MarkBatch(ctx, keys[:n], nil, out[:n]); err != nil {
				return nil, err
			}
			for j := range n {
				if out[j] != engine.New {
					return nil, fmt.Errorf("bench: footprint key %d of distinct keys answered %v", marked+j, out[j])
				}
			}
			marked += n
		}
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		st := e.Stats()
		p := FootprintPoint{Keys: marked, EngineDiskBytes: st.Store.DiskBytes, HeapBytes: m.HeapAlloc, BloomBytes: uint64(max(st.Bloom.Bytes, 0))}
		if dir != "" {
			p.DuBytes = Allocated(dir)
		}
		if kb, err := procKB("/proc/self/status", "VmRSS:"); err == nil {
			p.RSSBytes = uint64(kb)
		}
		p.PeakRSSBytes = peakRSS()
		fp.Points = append(fp.Points, p)
	}
	if err := e.Close(); err != nil {
		return nil, err
	}
	if dir != "" {
		fp.ClosedDuBytes = Allocated(dir)
	}
	return &fp, nil
}

// Allocated sums the blocks the OS allocated to the files under dir, as du
// does (pebble.WalkAllocated).
func Allocated(dir string) uint64 {
	var n uint64
	pebble.WalkAllocated(nil, dir, func(_ string, b uint64) { n += b })
	return n
}

// PrintFootprint prints a footprint as a table.
func PrintFootprint(w io.Writer, fp *Footprint) {
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	fmt.Fprintf(w, "%12s %14s %12s %12s %14s %12s %14s\n", "keys", "engine disk", "du", "heap", "(filters)", "VmRSS", "VmHWM")
	for _, p := range fp.Points {
		fmt.Fprintf(w, "%12d %10.1f MiB %8.1f MiB %8.1f MiB %10.1f MiB %8.1f MiB %10.1f MiB\n",
			p.Keys, mib(p.EngineDiskBytes), mib(p.DuBytes), mib(p.HeapBytes), mib(p.BloomBytes), mib(p.RSSBytes), mib(p.PeakRSSBytes))
	}
	if fp.ClosedDuBytes > 0 {
		fmt.Fprintf(w, "after Close: du %.1f MiB\n", mib(fp.ClosedDuBytes))
	}
}
