package bloom

import (
	"bytes"
	"errors"
	"strconv"
	"testing"

	"github.com/tierdedup/tierdedup/shard"
)

// TestPartitionSnapshotMerge: one partition's filter round-trips alone and
// is merged as a union: the merged filters hold the keys of both sides and
// no key of another partition of the writer; partitions not live on the
// reader are ignored; the checksum handed to accept is the writer's.
func TestPartitionSnapshotMerge(t *testing.T) {
	f := newFilters(t, 5000, 0.01, 100)
	a, b, c, d := keys("a", 500), keys("b", 500), keys("c", 500), keys("d", 500)
	f.Add(a, 97)
	f.Add(b, 98)
	f.Add(c, 100)
	var buf bytes.Buffer
	meta := SnapshotMeta{Kind: SnapshotPartition, StoreID: [16]byte{3}, Epoch: 42}
	sum, err := f.WritePartition(&buf, 98, meta)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WritePartition(&bytes.Buffer{}, 100-int64(f.parts.Live), meta); err == nil {
		t.Fatal("WritePartition of a partition out of the window succeeded")
	}

	g := newFilters(t, 5000, 0.01, 100)
	g.Add(d, 98)
	var seen SnapshotHeader
	if err := g.MergeSnapshot(bytes.NewReader(buf.Bytes()), int64(buf.Len()), func(h SnapshotHeader) error { seen = h; return nil }); err != nil {
		t.Fatal(err)
	}
	if seen.SnapshotMeta != meta || seen.Sum != sum || seen.Newest != 98 {
		t.Fatalf("header %+v, sum %08x; want meta %+v, newest 98", seen, sum, meta)
	}
	bit98 := uint64(1) << (98 - f.parts.Oldest(100))
	for name, ks := range map[string][]Probe{"b": probe(g, b), "d": probe(g, d)} {
		for i, p := range ks {
			if p.Maybe&bit98 == 0 {
				t.Fatalf("%s[%d] lost by the merge: %b", name, i, p.Maybe)
			}
		}
	}
	for name, ks := range map[string][]Probe{"a": probe(g, a), "c": probe(g, c)} {
		hits := 0
		for _, p := range ks {
			if p.Maybe != 0 {
				hits++
			}
		}
		if hits > 25 { // 5 % of 500: far above the configured rate
			t.Fatalf("%s: %d of 500 keys of other partitions found after merging partition 98", name, hits)
		}
	}

	// An empty partition round-trips as no filter: merging it allocates
	// nothing.
	var empty bytes.Buffer
	if _, err := f.WritePartition(&empty, 99, meta); err != nil {
		t.Fatal(err)
	}
	before := g.Bytes()
	if err := g.MergeSnapshot(bytes.NewReader(empty.Bytes()), int64(empty.Len()), nil); err != nil {
		t.Fatal(err)
	}
	if g.Bytes() != before {
		t.Fatalf("merging an empty partition allocated a filter: %d bytes, %d before", g.Bytes(), before)
	}

	// A reader whose window left 98 behind ignores it, and keeps the
	// filter of the live partition in the same slot of its ring.
	live := 98 + int64(f.parts.Live)
	h := newFilters(t, 5000, 0.01, live)
	h.Add(d, live)
	if err := h.MergeSnapshot(bytes.NewReader(buf.Bytes()), int64(buf.Len()), nil); err != nil {
		t.Fatal(err)
	}
	for _, p := range probe(h, b) {
		if p.Maybe&^(1<<(f.parts.Live-1)) != 0 {
			t.Fatalf("a partition outside the window was merged: %b", p.Maybe)
		}
	}
	for i, p := range probe(h, d) {
		if p.Maybe&(1<<(f.parts.Live-1)) == 0 {
			t.Fatalf("d[%d] of live partition %d lost to a merge of partition 98", i, live)
		}
	}

	// Refused by accept, or damaged: nothing changes.
	k := newFilters(t, 5000, 0.01, 100)
	refused := errors.New("refused")
	if err := k.MergeSnapshot(bytes.NewReader(buf.Bytes()), int64(buf.Len()), func(SnapshotHeader) error { return refused }); !errors.Is(err, refused) {
		t.Fatalf("err = %v", err)
	}
	bad := flip(buf.Bytes(), headerSize+64)
	if err := k.MergeSnapshot(bytes.NewReader(bad), int64(len(bad)), nil); !errors.Is(err, ErrSnapshot) {
		t.Fatalf("damaged: err = %v", err)
	}
	for _, p := range probe(k, b) {
		if p.Maybe != 0 {
			t.Fatal("a refused merge changed the filters")
		}
	}
}

func probe(f *Filters, fps []shard.Fingerprint) []Probe {
	out := make([]Probe, len(fps))
	f.Test(fps, out)
	return out
}

// TestMergeSnapshotsKeepsEachFileApart: merged together, a damaged file
// and a refused one get their own errors and change nothing, while the
// good files around them are merged, into empty filters (no copy) and
// into filters already written (one copy).
func TestMergeSnapshotsKeepsEachFileApart(t *testing.T) {
	f := newFilters(t, 5000, 0.01, 100)
	ks := map[int64][]shard.Fingerprint{}
	var files [][]byte
	for _, p := range []int64{96, 97, 98, 99} {
		ks[p] = keys("p"+strconv.FormatInt(p, 10), 500)
		f.Add(ks[p], p)
		var buf bytes.Buffer
		if _, err := f.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
			t.Fatal(err)
		}
		files = append(files, buf.Bytes())
	}
	refused := errors.New("refused")
	srcs := []SnapshotSource{
		{R: bytes.NewReader(files[0]), Size: int64(len(files[0]))},
		{R: bytes.NewReader(flip(files[1], headerSize+100)), Size: int64(len(files[1]))},
		{R: bytes.NewReader(files[2]), Size: int64(len(files[2])), Accept: func(SnapshotHeader) error { return refused }},
		{R: bytes.NewReader(files[3]), Size: int64(len(files[3]))},
	}
	for _, written := range []bool{false, true} {
		g := newFilters(t, 5000, 0.01, 100)
		if written {
			g.Add(keys("other", 10), 100)
		}
		errs := g.MergeSnapshots(srcs)
		if errs[0] != nil || !errors.Is(errs[1], ErrSnapshot) || !errors.Is(errs[2], refused) || errs[3] != nil {
			t.Fatalf("written %v: errors %v, want nil, ErrSnapshot, refused, nil", written, errs)
		}
		for p, want := range map[int64]bool{96: true, 97: false, 98: false, 99: true} {
			bit := uint64(1) << (p - g.parts.Oldest(100))
			found := 0
			for _, pr := range probe(g, ks[p]) {
				if pr.Maybe&bit != 0 {
					found++
				}
			}
			if want && found != len(ks[p]) || !want && found > 25 {
				t.Fatalf("written %v: partition %d has %d of %d keys, want all: %v", written, p, found, len(ks[p]), want)
			}
		}
	}
}
