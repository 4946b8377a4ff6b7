package bloom

import (
	"bytes"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestPlaceAllIsPlaceInTurn: merging a snapshot's records at once
// (placeAll: the words scattered in parallel, each goroutine over its own
// range) gives the ring, word for word, that placing them one after
// another gives, for one, eight, three and twenty-five live partitions
// (lanes of 64, 8, 21 and 2 bits), on rings large enough to be split, and
// with a record of a smaller step among them (a growing ring).
func TestPlaceAllIsPlaceInTurn(t *testing.T) {
	for _, live := range []int{1, 8, 3, 25} {
		for _, grow := range []bool{false, true} {
			t.Run(fmt.Sprintf("live=%d/grow=%v", live, grow), func(t *testing.T) {
				window := time.Duration(live-1) * time.Hour
				if live == 1 {
					window = time.Hour
				}
				opts := &Options{Partitions: parts(t, window, time.Hour), ExpectedKeys: 2_000_000 / live, Grow: grow}
				src, err := New(opts, int64(live+10))
				if err != nil {
					t.Fatal(err)
				}
				oldest := src.parts.Oldest(int64(live + 10))
				var small []byte
				for p := oldest; p <= int64(live+10); p++ {
					src.Add(keys(fmt.Sprint("k", p, "-"), 3000+int(p%7)*500), p)
					if grow && p == oldest {
						var buf bytes.Buffer // written before the ring grows
						if _, err := src.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
							t.Fatal(err)
						}
						small = buf.Bytes()
					}
				}
				if grow {
					src.Add(keys("big", int(src.growAt[len(src.growAt)-2])), int64(live+10))
				}
				var snap bytes.Buffer
				if _, err := src.WriteSnapshot(&snap, SnapshotMeta{Kind: SnapshotCache}); err != nil {
					t.Fatal(err)
				}
				_, recs, err := src.read(bytes.NewReader(snap.Bytes()), int64(snap.Len()), nil)
				if err != nil {
					t.Fatal(err)
				}
				if small != nil {
					_, more, err := src.read(bytes.NewReader(small), int64(len(small)), nil)
					if err != nil {
						t.Fatal(err)
					}
					more[0].part = int64(live + 10) // beside the full-size records, into another filter
					recs = append(more, recs...)
				}
				one, err := New(opts, int64(live+10))
				if err != nil {
					t.Fatal(err)
				}
				all, err := New(opts, int64(live+10))
				if err != nil {
					t.Fatal(err)
				}
				a := &ring{newest: int64(live + 10), lay: &one.steps[0], slots: make([]*filter, one.parts.Live)}
				for _, rec := range recs {
					a = one.place(a, rec)
				}
				b := all.placeAll(&ring{newest: int64(live + 10), lay: &all.steps[0], slots: make([]*filter, one.parts.Live)}, recs)
				if len(b.words) < 2*(1<<16) && live > 1 {
					t.Fatalf("a ring of %d words: too small to be split", len(b.words))
				}
				if a.step != b.step || !slices.Equal(a.words, b.words) {
					t.Fatalf("placed in turn: step %d, %d words; at once: step %d, %d words; equal %v", a.step, len(a.words), b.step, len(b.words), slices.Equal(a.words, b.words))
				}
				for s := range a.slots {
					fa, fb := a.slots[s], b.slots[s]
					if (fa == nil) != (fb == nil) || fa != nil && (fa.part != fb.part || fa.adds.Load() != fb.adds.Load() || fa.inherited.Load() != fb.inherited.Load()) {
						t.Fatalf("slot %d differs: %+v against %+v", s, fa, fb)
					}
				}
			})
		}
	}
}
