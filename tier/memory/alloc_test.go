//go:build !race

// Allocation counts are checked without the race detector, whose sync.Pool
// drops items on purpose; CI runs these with `go test -run Alloc ./...`.

package memory

import (
	"runtime"
	"testing"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

func TestAllocBatch(t *testing.T) {
	tb := newTable(t, nil)
	fps := make([]shard.Fingerprint, 256)
	tokens := make([]uint64, 256)
	for i := range fps {
		fps[i], tokens[i] = fp(i), uint64(i)
	}
	out := make([]Result, 256)
	st := make([]Result, 256)
	var now int64
	tb.Acquire(fps, tokens, now, now+1, now+1, out) // warm the entry slabs and pool
	allocs := testing.AllocsPerRun(50, func() {
		now += 2
		tb.Acquire(fps, tokens, now, now+1, now+1, out)
		tb.Release(fps, tokens, now, now, true, st)
	})
	if allocs != 0 {
		t.Fatalf("Acquire+Release of 256 keys allocates %v times", allocs)
	}
}

// TestFootprintFollowsUse: a table of the default capacity (1M entries,
// ≈ 66 MiB full) costs little until keys fill it, grows with them, and
// keeps every key it took while growing.
func TestFootprintFollowsUse(t *testing.T) {
	heap := func() int64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	before := heap()
	tb := newTable(t, &Options{})
	empty := heap() - before
	if empty > 2<<20 {
		t.Fatalf("an empty table of the default capacity takes %.1f MiB of heap, want ≤ 2", float64(empty)/(1<<20))
	}
	const n = 200_000
	fps := make([]shard.Fingerprint, 256)
	tokens := make([]uint64, 256)
	out := make([]Result, 256)
	for base := 0; base < n; base += len(fps) {
		for i := range fps {
			fps[i], tokens[i] = fp(base+i), uint64(base+i)
		}
		tb.Mark(fps, tokens, nil, 1, 2, 1<<40, 1<<40, out)
	}
	grown := heap() - before
	t.Logf("heap: empty %.2f MiB, %d keys %.1f MiB", float64(empty)/(1<<20), n, float64(grown)/(1<<20))
	if grown < 8<<20 || grown > 40<<20 {
		t.Fatalf("%d keys take %.1f MiB, want between 8 and 40 (≈ 66 B a key, at most 4× slack)", n, float64(grown)/(1<<20))
	}
	for base := 0; base < n; base += len(fps) {
		for i := range fps {
			fps[i], tokens[i] = fp(base+i), uint64(n+base+i)
		}
		tb.Mark(fps, tokens, nil, 3, 4, 1<<40, 1<<40, out)
		for i, r := range out {
			if r.Status != tier.Committed {
				t.Fatalf("key %d, marked while the table grew: %v on its second mark", base+i, r)
			}
		}
	}
	runtime.KeepAlive(tb)
}
