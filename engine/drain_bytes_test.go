package engine_test

import (
	"testing"

	"github.com/tierdedup/tierdedup/engine"
)

// TestDrainReadsAreBounded: the archive log's drain reads as many entries
// as fit its byte bound at the size it found so far: a backlog of 4 MiB
// results (which at the old fixed 4,096 entries a read made 16 GiB reads
// and 1 GiB statements, failing every drain) is read at most 4 at a time after a
// first read of 16 (64 MiB), and small entries grow the reads back to
// 4,096.
func TestDrainReadsAreBounded(t *testing.T) {
	sizes := []int{4 << 20, 4 << 20, 4 << 20}
	for range 20 {
		sizes = append(sizes, 100)
	}
	counts := engine.DrainReads(sizes)
	for i, n := range counts[:len(sizes)] {
		if i < 3 && n*sizes[max(i-1, 0)] > 64<<20+64*n {
			t.Errorf("read %d of 4 MiB entries asked for %d: %d MiB", i, n, n*4)
		}
	}
	if counts[1] < 1 || counts[1] > 4 || counts[2] < 1 || counts[2] > 4 {
		t.Errorf("reads of 4 MiB entries asked for %v, want 1 to 4 after the first", counts[:3])
	}
	if last := counts[len(counts)-1]; last != 4096 {
		t.Errorf("after 20 reads of small entries the drain asks for %d, want 4096 (counts %v)", last, counts)
	}
}
