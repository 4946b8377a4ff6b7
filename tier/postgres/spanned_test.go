package postgres

import (
	"math"
	"slices"
	"testing"

	"github.com/tierdedup/tierdedup/tier"
)

// TestSpanned: the partition list the archive's statements prune with is
// every partition some span covers, once each and ascending; spans
// covering more than maxSpanned partitions (or whose width overflows)
// give no list, which the statements read as every partition.
func TestSpanned(t *testing.T) {
	q := func(from, to int64) tier.ArchiveQuery { return tier.ArchiveQuery{From: from, To: to} }
	for _, c := range []struct {
		name string
		qs   []tier.ArchiveQuery
		want []int64
	}{
		{"none", nil, []int64{}},
		{"empty spans", []tier.ArchiveQuery{q(5, 5), q(7, 3)}, []int64{}},
		{"one", []tier.ArchiveQuery{q(3, 6)}, []int64{3, 4, 5}},
		{"apart, out of order", []tier.ArchiveQuery{q(20, 22), q(3, 5)}, []int64{3, 4, 20, 21}},
		{"overlapping", []tier.ArchiveQuery{q(3, 8), q(5, 10)}, []int64{3, 4, 5, 6, 7, 8, 9}},
		{"nested", []tier.ArchiveQuery{q(0, 10), q(2, 3), q(4, 12)}, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
		{"negative", []tier.ArchiveQuery{q(-2, 1)}, []int64{-2, -1, 0}},
		{"at the bound", []tier.ArchiveQuery{q(0, maxSpanned)}, nil},
	} {
		got := spanned(c.qs)
		if c.name == "at the bound" {
			if len(got) != maxSpanned {
				t.Fatalf("%s: %d partitions, want %d", c.name, len(got), maxSpanned)
			}
			continue
		}
		if got == nil || !slices.Equal(got, c.want) {
			t.Fatalf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	for _, qs := range [][]tier.ArchiveQuery{
		{q(0, maxSpanned+1)},
		{q(0, maxSpanned/2), q(maxSpanned, maxSpanned+maxSpanned/2+1)},
		{q(-1<<40, 1<<40)},
		{q(math.MinInt64, math.MaxInt64)},
		{q(math.MinInt64, 0), q(1, math.MaxInt64)},
	} {
		if got := spanned(qs); got != nil {
			t.Fatalf("%v: a list of %d partitions, want none (every partition)", qs, len(got))
		}
	}
}
