//go:build !race

package main

import (
	"encoding/json"
	"testing"

	"github.com/tierdedup/tierdedup/bench"
)

// TestFootprintCommand runs `dedupbench footprint` in a process of its own
// and holds a default engine to the footprint a small service expects: at
// one key at most 16 MiB on disk and 32 MiB of heap, at 100k keys at most
// 48 MiB on disk; at 1M keys (the filters grown to their full 148 MiB, the
// memory tier to a million entries, 222 MiB of live heap) at most 512 MiB
// resident. The resident memory of a Go process also holds what its heap
// allocated since the last time freed memory was returned, up to the
// collector's goal (twice the live heap): 336–338 MiB on an idle machine,
// 411 MiB once in CI, so this bound only catches a gross regression. That
// the filters return the copies growth replaced (457 MiB here while they
// did not) is held by tier/bloom's TestGrowthReturnsReplacedCopies, from
// the runtime's own count of free spans kept resident. And at each count
// the engine's own disk figure within 10 % of the blocks the OS allocated
// under its directory (du).
func TestFootprintCommand(t *testing.T) {
	out, err := command(t, "footprint", "-json", "-keys", "1,1e5,1e6").Output()
	if err != nil {
		t.Fatalf("footprint: %v: %s", err, stderrOf(err))
	}
	var fp bench.Footprint
	if err := json.Unmarshal(out, &fp); err != nil {
		t.Fatal(err)
	}
	if len(fp.Points) != 3 || fp.Points[0].Keys != 1 || fp.Points[1].Keys != 100_000 || fp.Points[2].Keys != 1_000_000 {
		t.Fatalf("points %+v", fp.Points)
	}
	mib := func(b uint64) float64 { return float64(b) / (1 << 20) }
	for i, limit := range []uint64{16 << 20, 48 << 20, 1 << 40} {
		p := fp.Points[i]
		t.Logf("%d keys: engine %.1f MiB, du %.1f MiB, heap %.1f MiB (filters %.1f), VmRSS %.1f MiB",
			p.Keys, mib(p.EngineDiskBytes), mib(p.DuBytes), mib(p.HeapBytes), mib(p.BloomBytes), mib(p.RSSBytes))
		if p.DuBytes > limit {
			t.Errorf("%d keys: %.1f MiB on disk (du), over %.0f MiB", p.Keys, mib(p.DuBytes), mib(limit))
		}
		if r := float64(p.EngineDiskBytes) / float64(p.DuBytes); r < 0.9 || r > 1.1 {
			t.Errorf("%d keys: the engine says %.1f MiB, du %.1f MiB", p.Keys, mib(p.EngineDiskBytes), mib(p.DuBytes))
		}
	}
	if h := fp.Points[0].HeapBytes; h > 32<<20 {
		t.Errorf("one key: %.1f MiB of heap, over 32 MiB", mib(h))
	}
	if r := fp.Points[2].RSSBytes; r > 512<<20 {
		t.Errorf("1M keys: VmRSS %.1f MiB, over 512 MiB", mib(r))
	}
}
