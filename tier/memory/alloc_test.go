//go:build !race

// Allocation counts are checked without the race detector, whose sync.Pool
// drops items on purpose; CI runs these with `go test -run Alloc ./...`.

package memory

import (
	"testing"

	"github.com/tierdedup/tierdedup/shard"
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
