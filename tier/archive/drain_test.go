package archive

import (
	"fmt"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// drainReads returns the counts of positions the archive log's drain
// asks for, read after read, when every position it reads holds per
// entries, each carrying a result of the size sizes gives for that read
// (the reads' byte bound, drainBytes).
func drainReads(sizes []int, per int) []int {
	var a Archiver
	var counts []int
	for _, size := range sizes {
		n := a.readCount()
		counts = append(counts, n)
		entries := make([]tier.LogEntry, n*per)
		for i := range entries {
			entries[i].Pos.Seq = uint64(i / per)
			entries[i].Record.Result = make([]byte, size)
		}
		if got := positions(entries); got != n {
			panic(fmt.Sprintf("positions counted %d of %d", got, n))
		}
		a.sizeReads(entries, n)
	}
	return counts
}

// TestDrainReadsOfGroupedCommits: where each log position holds 256
// commits (a Redis commit script's call), the drain asks for as many
// positions as keep an Apply near drainBatch entries (16 positions, 4,096
// commits), not drainBatch positions of 256 commits each (a million rows
// in one transaction).
func TestDrainReadsOfGroupedCommits(t *testing.T) {
	sizes := make([]int, 20)
	for i := range sizes {
		sizes[i] = 100
	}
	counts := drainReads(sizes, 256)
	if last := counts[len(counts)-1]; last != drainBatch/256 {
		t.Errorf("after 20 reads of 256 commits a position the drain asks for %d positions, want %d (counts %v)", last, drainBatch/256, counts)
	}
}

// TestDrainReadsAreBounded: the archive log's drain reads as many entries
// as fit its byte bound at the size it found so far: a backlog of 4 MiB
// results (which at a fixed 4,096 entries a read made 16 GiB reads and 1
// GiB statements, failing every drain) is read at most 4 at a time after
// a first read of 16 (64 MiB), and small entries grow the reads back to
// 4,096.
func TestDrainReadsAreBounded(t *testing.T) {
	sizes := []int{4 << 20, 4 << 20, 4 << 20}
	for range 20 {
		sizes = append(sizes, 100)
	}
	counts := drainReads(sizes, 1)
	for i, n := range counts[:len(sizes)] {
		if i < 3 && n*sizes[max(i-1, 0)] > 64<<20+64*n {
			t.Errorf("read %d of 4 MiB entries asked for %d: %d MiB", i, n, n*4)
		}
	}
	if counts[1] < 1 || counts[1] > 4 || counts[2] < 1 || counts[2] > 4 {
		t.Errorf("reads of 4 MiB entries asked for %v, want 1 to 4 after the first", counts[:3])
	}
	if last := counts[len(counts)-1]; last != drainBatch {
		t.Errorf("after 20 reads of small entries the drain asks for %d, want %d (counts %v)", last, drainBatch, counts)
	}
}

// TestFilterLayout: the archive filter's ring covers the archive window
// in at most Slots slots, one spare for the group being filled.
func TestFilterLayout(t *testing.T) {
	const day = 24 * 60 * 60 * 1e9
	for _, c := range []struct {
		part, window int64
		want         Layout
	}{
		{day, 7 * day, Layout{Partitions: 8, Group: 1, Slots: 9}},
		{day, 100 * day, Layout{Partitions: 101, Group: 4, Slots: 27}},
		{day / 24, 365 * day, Layout{Partitions: 8761, Group: 283, Slots: 32}},
	} {
		got := FilterLayout(time.Duration(c.part), time.Duration(c.window))
		if got != c.want {
			t.Errorf("FilterLayout(%d, %d) = %+v, want %+v", c.part, c.window, got, c.want)
		}
		if got.Slots > Slots || int64(got.Group)*int64(got.Slots-1) < int64(got.Partitions) {
			t.Errorf("layout %+v does not cover its %d partitions in %d slots", got, got.Partitions, Slots)
		}
	}
}
