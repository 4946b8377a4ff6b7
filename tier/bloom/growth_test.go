package bloom

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/shard"
)

// growing returns Filters that grow, sized for n keys a partition over a
// 7-day window of day partitions.
func growing(t testing.TB, n int, newest int64) *Filters {
	t.Helper()
	f, err := New(&Options{Partitions: parts(t, 7*24*time.Hour, 24*time.Hour), ExpectedKeys: n, Grow: true}, newest)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// missing returns the keys of fps that no live filter holds.
func missing(f *Filters, fps []shard.Fingerprint) int {
	out := make([]Probe, len(fps))
	f.Test(fps, out)
	n := 0
	for _, p := range out {
		if p.Maybe == 0 {
			n++
		}
	}
	return n
}

// TestGrowthStartsSmallAndKeepsEveryKey: filters for 1M keys a partition
// start at about a MiB, grow step by step as keys arrive, end at their
// full size, and never lose a key: adds from four goroutines into three
// partitions race the growths, and every key whose Add returned is found
// by a probe at once, and all of them at the end.
func TestGrowthStartsSmallAndKeepsEveryKey(t *testing.T) {
	const n = 1_000_000
	f := growing(t, n, 10)
	if len(f.steps) < 4 {
		t.Fatalf("%d steps for %d keys a partition, want at least 4", len(f.steps), n)
	}
	f.Add(keys("first", 1), 10)
	if b := f.Bytes(); b > 2*minStepBytes {
		t.Fatalf("one key: %d bytes of filters, want about %d (full size %d)", b, minStepBytes, f.FullBytes())
	}
	var lost atomic.Int64
	var wg sync.WaitGroup
	per := int(f.growAt[len(f.growAt)-2]) // 4 × this over 3 partitions: past the last growth
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fps := keys(fmt.Sprintf("g%d-", g), per)
			for i := 0; i < per; i += 100 {
				batch := fps[i:min(i+100, per)]
				f.Add(batch, int64(8+i/100%3))
				lost.Add(int64(missing(f, batch)))
			}
		}()
	}
	wg.Wait()
	if l := lost.Load(); l > 0 {
		t.Fatalf("%d keys not found right after their Add returned", l)
	}
	for g := range 4 {
		if m := missing(f, keys(fmt.Sprintf("g%d-", g), per)); m > 0 {
			t.Fatalf("goroutine %d: %d of %d keys lost by the growths", g, m, per)
		}
	}
	if m := missing(f, keys("first", 1)); m > 0 {
		t.Fatal("the first key, added to the smallest ring, was lost")
	}
	if f.Bytes() != f.FullBytes() {
		t.Fatalf("after %d keys in each of 3 partitions: %d bytes, want the full %d", 4*per/3, f.Bytes(), f.FullBytes())
	}
}

// TestGrowthAcrossSnapshots: a snapshot written by a small ring loads into
// new filters (and grows them on), a partition sealed at one step merges
// into a ring of a larger one, and a snapshot from a larger ring grows a
// smaller one; no key is lost either way. A snapshot whose size is no step
// is refused and changes nothing. A filter that took a file's bits grows
// by copying them up.
func TestGrowthAcrossSnapshots(t *testing.T) {
	const n = 1_000_000
	small := growing(t, n, 10)
	early := keys("early", 500) // below the first growth
	small.Add(early, 9)
	var snap, sealed bytes.Buffer
	if _, err := small.WriteSnapshot(&snap, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	if _, err := small.WritePartition(&sealed, 9, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
		t.Fatal(err)
	}
	late := keys("late", int(small.growAt[len(small.growAt)-2])) // past every growth
	small.Add(late, 10)
	if small.Bytes() != small.FullBytes() {
		t.Fatalf("not grown: %d bytes of %d", small.Bytes(), small.FullBytes())
	}
	var big bytes.Buffer
	if _, err := small.WriteSnapshot(&big, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}

	// The small snapshot into new filters, which then grow.
	a := growing(t, n, 10)
	if err := a.ReadSnapshot(bytes.NewReader(snap.Bytes()), int64(snap.Len()), nil); err != nil {
		t.Fatal(err)
	}
	a.Add(late, 10)
	if m := missing(a, early) + missing(a, late); m > 0 {
		t.Fatalf("small snapshot, then growth: %d keys lost", m)
	}

	// The small sealed partition merged into a full ring.
	b := growing(t, n, 10)
	b.Add(late, 10)
	if err := b.MergeSnapshot(bytes.NewReader(sealed.Bytes()), int64(sealed.Len()), nil); err != nil {
		t.Fatal(err)
	}
	if m := missing(b, early) + missing(b, late); m > 0 {
		t.Fatalf("small partition merged into a grown ring: %d keys lost", m)
	}

	// The full snapshot into a ring still at its smallest.
	c := growing(t, n, 10)
	c.Add(keys("c", 10), 10)
	if err := c.MergeSnapshot(bytes.NewReader(big.Bytes()), int64(big.Len()), nil); err != nil {
		t.Fatal(err)
	}
	if c.Bytes() != c.FullBytes() {
		t.Fatalf("a full snapshot merged into a small ring left it at %d bytes", c.Bytes())
	}
	if m := missing(c, early) + missing(c, late) + missing(c, keys("c", 10)); m > 0 {
		t.Fatalf("full snapshot merged into a small ring: %d keys lost", m)
	}

	// A small partition merged into a small ring's filter of the same
	// partition, which then grows: the merged bits are not in the
	// filter's logged keys, so the growth copies the filter up instead
	// of rebuilding it from them (rebuilt, the merged keys were lost).
	d := growing(t, n, 10)
	own := keys("own", 300)
	d.Add(own, 9)
	if err := d.MergeSnapshot(bytes.NewReader(sealed.Bytes()), int64(sealed.Len()), nil); err != nil {
		t.Fatal(err)
	}
	d.Add(late, 9)
	if d.Bytes() != d.FullBytes() {
		t.Fatalf("not grown: %d bytes of %d", d.Bytes(), d.FullBytes())
	}
	if m := missing(d, early); m > 0 {
		t.Fatalf("a partition merged into a logged filter, then grown: %d of its %d keys lost", m, len(early))
	}
	if m := missing(d, own) + missing(d, late); m > 0 {
		t.Fatalf("a filter merged into, then grown: %d of its own keys lost", m)
	}

	// Other sizes are refused.
	other := growing(t, n/3, 10)
	if err := other.MergeSnapshot(bytes.NewReader(snap.Bytes()), int64(snap.Len()), nil); !errors.Is(err, ErrSnapshotParams) {
		t.Fatalf("a snapshot of other filters: %v, want ErrSnapshotParams", err)
	}
	fixed := newFilters(t, n, 0, 10)
	if err := fixed.MergeSnapshot(bytes.NewReader(snap.Bytes()), int64(snap.Len()), nil); !errors.Is(err, ErrSnapshotParams) {
		t.Fatalf("a growing ring's snapshot into filters that do not grow: %v, want ErrSnapshotParams", err)
	}
}

// TestGrowthReportsInherited: a filter restored from a snapshot of a small
// ring and grown to the full size by copying is reported Inherited (its
// bits were not thinned); one whose keys were all added since, rebuilt
// from its log, is not, nor is any filter of a ring that never grew.
func TestGrowthReportsInherited(t *testing.T) {
	const n = 1_000_000
	small := growing(t, n, 10)
	small.Add(keys("early", 500), 9)
	var snap bytes.Buffer
	if _, err := small.WriteSnapshot(&snap, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	inherited := func(f *Filters) map[int64]bool {
		m := map[int64]bool{}
		for _, p := range f.Partitions() {
			m[p.Partition] = p.Inherited
		}
		return m
	}
	if got := inherited(small); got[9] {
		t.Fatalf("a ring that never grew: %v", got)
	}
	g := growing(t, n, 10)
	if err := g.ReadSnapshot(bytes.NewReader(snap.Bytes()), int64(snap.Len()), nil); err != nil {
		t.Fatal(err)
	}
	g.Add(keys("late", int(g.growAt[len(g.growAt)-2])), 10)
	if g.Bytes() != g.FullBytes() {
		t.Fatalf("not grown: %d bytes of %d", g.Bytes(), g.FullBytes())
	}
	if got := inherited(g); !got[9] || got[10] {
		t.Fatalf("restored partition 9 then grown, partition 10 filled through the growths: inherited %v, want 9 only", got)
	}
	var big bytes.Buffer
	if _, err := g.WritePartition(&big, 10, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
		t.Fatal(err)
	}
	var small9 bytes.Buffer
	if _, err := small.WritePartition(&small9, 9, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
		t.Fatal(err)
	}
	// The full-size file first grows the ring; the small file is then
	// copied up into it, as a growth would: Inherited either way.
	for _, order := range [][]*bytes.Buffer{{&big, &small9}, {&small9, &big}} {
		h := growing(t, n, 10)
		var srcs []SnapshotSource
		for _, b := range order {
			srcs = append(srcs, SnapshotSource{R: bytes.NewReader(b.Bytes()), Size: int64(b.Len())})
		}
		for _, err := range h.MergeSnapshots(srcs) {
			if err != nil {
				t.Fatal(err)
			}
		}
		if got := inherited(h); !got[9] || got[10] {
			t.Fatalf("a small file of 9 and a full one of 10 merged (full first: %v): inherited %v, want 9 only", order[0] == &big, got)
		}
	}
}

// TestGrowthIgnoresAStaleCount: an add's count read from a filter that a
// Reset replaced (the add was in flight across it) does not grow the new
// ring; a count from the current filter does.
func TestGrowthIgnoresAStaleCount(t *testing.T) {
	f := growing(t, 1_000_000, 10)
	f.Add(keys("a", 10), 10)
	stale := f.cur.Load().filter(f, 10)
	f.Reset()
	f.Add(keys("b", 10), 10)
	small := f.Bytes()
	f.grow(stale, 10, f.growAt[len(f.growAt)-2])
	if f.Bytes() != small {
		t.Fatalf("a stale count grew the ring from %d to %d bytes", small, f.Bytes())
	}
	f.grow(f.cur.Load().filter(f, 10), 10, f.growAt[len(f.growAt)-2])
	if f.Bytes() != f.FullBytes() {
		t.Fatalf("the current filter's count left the ring at %d of %d bytes", f.Bytes(), f.FullBytes())
	}
	if m := missing(f, keys("b", 10)); m > 0 {
		t.Fatalf("%d keys lost", m)
	}
}
