package bloom

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tierdedup/tierdedup/shard"
)

// mergeHits counts the keys of fps whose probe names partition p.
func mergeHits(f *Filters, fps []shard.Fingerprint, p int64) int {
	out := make([]Probe, len(fps))
	oldest := f.Test(fps, out)
	if p < oldest || p-oldest >= int64(f.parts.Live) {
		return 0
	}
	n := 0
	for _, pr := range out {
		if pr.Maybe&(1<<(p-oldest)) != 0 {
			n++
		}
	}
	return n
}

// TestMergeSnapshotsConcurrent: MergeSnapshots of several files
// (partition files and a whole snapshot, into filters that start with no
// words) runs again and again while adders write into the live partitions
// (some a partition ahead, which rotates), a rotator moves the window on
// and probes read. Every key added to a partition still live at the end,
// and every key of the merged files, must be found in its partition.
func TestMergeSnapshotsConcurrent(t *testing.T) {
	const n = 20_000
	src := newFilters(t, n, 0.01, 13)
	srcKeys := map[int64][]shard.Fingerprint{}
	var files [][]byte
	for p := int64(10); p <= 13; p++ {
		srcKeys[p] = keys(fmt.Sprintf("src-%d-", p), 1500)
		src.Add(srcKeys[p], p)
		var buf bytes.Buffer
		if _, err := src.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
			t.Fatal(err)
		}
		files = append(files, buf.Bytes())
	}
	var whole bytes.Buffer
	if _, err := src.WriteSnapshot(&whole, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	files = append(files, whole.Bytes())
	srcs := func() []SnapshotSource {
		out := make([]SnapshotSource, len(files))
		for i, b := range files {
			out[i] = SnapshotSource{R: bytes.NewReader(b), Size: int64(len(b))}
		}
		return out
	}

	f := newFilters(t, n, 0.01, 9) // nothing written: the first merge copies no ring
	var cur atomic.Int64
	cur.Store(9)
	type added struct {
		fps []shard.Fingerprint
		p   int64
	}
	var (
		mu   sync.Mutex
		adds []added
		stop atomic.Bool
		wg   sync.WaitGroup
	)
	for w := range 3 {
		wg.Go(func() {
			var mine []added
			for i := 0; !stop.Load(); i++ {
				p := cur.Load() - int64(i%3) + 1 // one ahead, the current, one behind
				fps := keys(fmt.Sprintf("w%d-%d-", w, i), 16)
				f.Add(fps, p)
				mine = append(mine, added{fps, p})
			}
			mu.Lock()
			adds = append(adds, mine...)
			mu.Unlock()
		})
	}
	wg.Go(func() {
		out := make([]Probe, 64)
		probe := keys("probe-", 64)
		for !stop.Load() {
			f.Test(probe, out)
			_ = f.EstimatedFalsePositive()
		}
	})
	var merges sync.WaitGroup
	merges.Go(func() {
		for range 40 {
			for i, err := range f.MergeSnapshots(srcs()) {
				if err != nil {
					t.Errorf("file %d: %v", i, err)
				}
			}
		}
	})
	merges.Go(func() {
		for p := int64(10); p <= 15; p++ {
			f.Rotate(p)
			cur.Store(p)
			for range 3 {
				_ = f.MergeSnapshots(srcs()[:1])
			}
		}
	})
	merges.Wait()
	// Once more with the window past every file's partitions (the early
	// merges found them ahead of the newest and ignored them), the adders
	// still running.
	for i, err := range f.MergeSnapshots(srcs()) {
		if err != nil {
			t.Errorf("file %d: %v", i, err)
		}
	}
	stop.Store(true)
	wg.Wait()

	newest := f.newestPartition()
	oldest := f.parts.Oldest(newest)
	if newest < 13 || newest > 16 || oldest > 10 {
		t.Fatalf("newest %d oldest %d: the test's window assumption broke", newest, oldest)
	}
	lost := 0
	for _, a := range adds {
		if a.p < oldest {
			continue
		}
		if got := mergeHits(f, a.fps, a.p); got != len(a.fps) {
			if lost++; lost <= 3 {
				t.Errorf("partition %d: %d of %d keys added concurrently with merges found", a.p, got, len(a.fps))
			}
		}
	}
	for p, fps := range srcKeys {
		if got := mergeHits(f, fps, p); got != len(fps) {
			t.Errorf("merged partition %d: %d of %d keys found", p, got, len(fps))
		}
	}
	t.Logf("%d adds checked, newest %d, %d lost", len(adds), newest, lost)
}

// editSnapshot returns a copy of snapshot b with the u64 at off set to v
// (big endian if big) and its checksum made to match: only the content is
// wrong.
func editSnapshot(b []byte, off int, v uint64, big bool) []byte {
	c := append([]byte{}, b...)
	if big {
		binary.BigEndian.PutUint64(c[off:], v)
	} else {
		binary.LittleEndian.PutUint64(c[off:], v)
	}
	return resum(c)
}

// resum rewrites a snapshot's trailer to match its content, so that only
// the content is wrong.
func resum(b []byte) []byte {
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

// TestRefusedFileChangesNothing: a snapshot whose checksum holds
// but whose second record is inconsistent (a repeated partition, a
// partition outside its window, a wrong inner header), merged among good
// files, is refused whole: the keys of its first, sound record do not
// appear (nothing changed), while the good files around it, two of them
// for the same partition from different writers, are merged as a union.
// ReadSnapshot of it changes nothing either.
func TestRefusedFileChangesNothing(t *testing.T) {
	const n = 5000
	a := newFilters(t, n, 0.01, 9)
	k8, k9 := keys("a8-", 800), keys("a9-", 800)
	a.Add(k8, 8)
	a.Add(k9, 9)
	var buf bytes.Buffer
	if _, err := a.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	good := buf.Bytes()
	m, _, _ := a.Params()
	second := headerSize + int(recordSize(m))
	if p := int64(binary.LittleEndian.Uint64(good[headerSize:])); p != 8 {
		t.Fatalf("first record of partition %d, want 8", p)
	}
	edit := func(off int, v uint64, big bool) []byte { return editSnapshot(good, off, v, big) }
	// Two writers' files for partition 7, one for partition 9.
	b7, c7, c9 := newFilters(t, n, 0.01, 9), newFilters(t, n, 0.01, 9), newFilters(t, n, 0.01, 9)
	kb7, kc7, kc9 := keys("b7-", 800), keys("c7-", 800), keys("c9-", 800)
	b7.Add(kb7, 7)
	c7.Add(kc7, 7)
	c9.Add(kc9, 9)
	part := func(f *Filters, p int64) []byte {
		var buf bytes.Buffer
		if _, err := f.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	f7b, f7c, f9c := part(b7, 7), part(c7, 7), part(c9, 9)
	for name, bad := range map[string][]byte{
		"repeated partition": edit(second, 8, false),
		"partition too new":  edit(second, 10, false),
		"partition too old":  edit(second, 1, false),
		"inner k":            edit(second+24, 3, true),
	} {
		for _, written := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/written=%v", name, written), func(t *testing.T) {
				g := newFilters(t, n, 0.01, 9)
				other := keys("g9-", 100)
				if written {
					g.Add(other, 9)
				}
				src := func(b []byte) SnapshotSource { return SnapshotSource{R: bytes.NewReader(b), Size: int64(len(b))} }
				errs := g.MergeSnapshots([]SnapshotSource{src(f7b), src(bad), src(f7c), src(f9c)})
				if errs[0] != nil || !errors.Is(errs[1], ErrSnapshot) || errs[2] != nil || errs[3] != nil {
					t.Fatalf("errors %v; want nil, ErrSnapshot, nil, nil", errs)
				}
				if got := mergeHits(g, k8, 8); got > 40 {
					t.Errorf("the refused file's first record was merged: %d of %d of its keys found", got, len(k8))
				}
				for _, c := range []struct {
					name string
					fps  []shard.Fingerprint
					p    int64
				}{{"b7", kb7, 7}, {"c7", kc7, 7}, {"c9", kc9, 9}} {
					if got := mergeHits(g, c.fps, c.p); got != len(c.fps) {
						t.Errorf("%s: %d of %d keys after the merge", c.name, got, len(c.fps))
					}
				}
				if written {
					if got := mergeHits(g, other, 9); got != len(other) {
						t.Errorf("keys added before the merge: %d of %d", got, len(other))
					}
				}
				// ReadSnapshot of the same file changes nothing.
				if err := g.ReadSnapshot(bytes.NewReader(bad), int64(len(bad)), nil); !errors.Is(err, ErrSnapshot) {
					t.Fatalf("ReadSnapshot: %v", err)
				}
				if got := mergeHits(g, kc9, 9); got != len(kc9) {
					t.Errorf("after a refused ReadSnapshot: %d of %d keys", got, len(kc9))
				}
				if err := g.CheckSnapshot(bytes.NewReader(bad), int64(len(bad)), nil); !errors.Is(err, ErrSnapshot) {
					t.Errorf("CheckSnapshot: %v", err)
				}
			})
		}
	}
}

// TestMergeAheadAndBehind: a snapshot written by filters whose
// window is ahead of the reader's (a later newest) merges the partitions
// both windows hold and ignores the rest without an error; one whose
// newest is behind the reader merges its still-live partitions; a
// partition the reader dropped is not revived by a merge (its slot holds
// a later partition).
func TestMergeAheadAndBehind(t *testing.T) {
	const n = 5000
	w := newFilters(t, n, 0.01, 20)
	k := map[int64][]shard.Fingerprint{}
	for _, p := range []int64{13, 16, 20} {
		k[p] = keys(fmt.Sprintf("w%d-", p), 500)
		w.Add(k[p], p)
	}
	var buf bytes.Buffer
	if _, err := w.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	file := buf.Bytes()
	r := newFilters(t, n, 0.01, 16) // window 9..16
	mine := keys("r12-", 500)
	r.Add(mine, 12)
	if err := r.MergeSnapshot(bytes.NewReader(file), int64(len(file)), nil); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[int64]bool{13: true, 16: true} {
		if got := mergeHits(r, k[p], p); want && got != len(k[p]) {
			t.Errorf("partition %d: %d of %d", p, got, len(k[p]))
		}
	}
	if got := mergeHits(r, mine, 12); got != len(mine) {
		t.Errorf("the reader's own keys: %d of %d", got, len(mine))
	}
	// Partition 20 was ignored: rotating to it finds none of its keys.
	r.Rotate(20)
	if got := mergeHits(r, k[20], 20); got > 25 {
		t.Errorf("partition 20, ahead of the reader at the merge, has %d of %d keys after the rotation", got, len(k[20]))
	}
	// Now the reader is at 20 (window 13..20): the file of a writer at 16
	// holding partition 12 (dropped) and 13.
	old := newFilters(t, n, 0.01, 16)
	k12, k13 := keys("o12-", 500), keys("o13-", 500)
	old.Add(k12, 12)
	old.Add(k13, 13)
	buf.Reset()
	if _, err := old.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	file = buf.Bytes()
	if err := r.MergeSnapshot(bytes.NewReader(file), int64(len(file)), nil); err != nil {
		t.Fatal(err)
	}
	if got := mergeHits(r, k13, 13); got != len(k13) {
		t.Errorf("partition 13 from a file behind: %d of %d", got, len(k13))
	}
	// Partition 12 shares its slot with 20: the merge must not put 12's
	// keys into 20's lane.
	if got := mergeHits(r, k12, 20); got > 25 {
		t.Errorf("dropped partition 12's keys show in partition 20: %d of %d", got, len(k12))
	}
}
