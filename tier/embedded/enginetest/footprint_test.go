package enginetest_test

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestDefaultFootprint measures what a small user of the default
// configuration (engine.Options with a Dir and nothing else) pays, as the
// OS counts it: the store's disk while it runs holds one key in at most
// 16 MiB and 100k keys in at most 48 MiB (the WAL's preallocation follows
// what it holds), and one key takes at most 32 MiB of heap (the memory
// tier and the filters grow with the keys; ExpectedKeys, 10 M a
// partition by default, is the filters' ceiling). It logs the heap at
// 100k keys and the disk Close leaves.
func TestDefaultFootprint(t *testing.T) {
	dir := t.TempDir()
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	check := func(what string, limit uint64) {
		t.Helper()
		d := e.Stats().Store.Disk
		st := e.Stats()
		t.Logf("%s: disk %.1f MiB (du: %.1f MiB; WAL %.1f, SSTs %.1f, filters %.1f, other %.1f), heap %.1f MiB (filters %.1f MiB)",
			what, mib(d.Total), mib(du(t, dir)), mib(d.WAL), mib(d.Tables+d.ColdTables), mib(d.Filters), mib(d.Other), mib(heap()), mib(uint64(st.Bloom.Bytes)))
		if d.Total > limit {
			t.Errorf("%s: %.1f MiB on disk, over %.0f MiB", what, mib(d.Total), mib(limit))
		}
	}
	if _, err := e.MarkIfAbsent(ctx, []byte("one")); err != nil {
		t.Fatal(err)
	}
	check("one key", 16<<20)
	// Without -race (which moves Pebble's memory onto the Go heap; CI runs
	// this in its pass without it): the memory tier and the filters start
	// small and grow with the keys.
	if h := heap(); !enginetest.RaceEnabled() && h > 32<<20 {
		t.Errorf("one key: %.1f MiB of heap, over 32 MiB", mib(h))
	}
	markMany(t, e, 100)
	check("100k keys", 48<<20)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("after Close: %.1f MiB (du)", mib(du(t, dir)))
}

func mib(n uint64) float64 { return float64(n) / (1 << 20) }

// markMany marks batches of 1000 new keys.
func markMany(t *testing.T, e *engine.Engine, batches int) {
	t.Helper()
	keys := make([][]byte, 1000)
	out := make([]engine.Outcome, len(keys))
	for i := range batches {
		for j := range keys {
			keys[j] = fmt.Appendf(keys[j][:0], "key-%d-%d", i, j)
		}
		if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
			t.Fatal(err)
		}
	}
}
