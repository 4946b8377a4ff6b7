package bloom

import (
	"bytes"
	"errors"
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
