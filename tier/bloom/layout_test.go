package bloom

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// liveCases are window shapes of every lane width class: one lane a word
// (33+ partitions), two, three, four, few, eight (the default) and more;
// one partition (a window of zero) is not a valid window, and its layout is
// covered by TestColumnScatterInverse.
var liveCases = []int{2, 3, 5, 7, 8, 9, 13, 17, 24, 33, 64}

func filtersOfLive(t testing.TB, live, n int, fp float64, newest int64) *Filters {
	t.Helper()
	p, err := tier.NewPartitions(time.Duration(live-1)*time.Hour, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if p.Live != live {
		t.Fatalf("live = %d, want %d", p.Live, live)
	}
	f, err := New(&Options{Partitions: p, ExpectedKeys: n, FalsePositive: fp}, newest)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestLayoutEveryWidth: for every lane width, a key added to a partition is
// found in exactly that partition's bit (no false negative, and the bit is
// the right one), a partition's filter survives WritePartition and
// MergeSnapshot into other filters bit for bit, and the measured rate at
// capacity is the model's.
func TestLayoutEveryWidth(t *testing.T) {
	for _, live := range liveCases {
		t.Run(strconv.Itoa(live), func(t *testing.T) {
			n := 4000
			if live > 16 {
				n = 1000
			}
			newest := int64(1000)
			f := filtersOfLive(t, live, n, 0.01, newest)
			oldest := f.parts.Oldest(newest)
			byPart := make([][]shard.Fingerprint, live)
			for i := range live {
				byPart[i] = keys(fmt.Sprintf("w%d-p%d-", live, i), n)
				f.Add(byPart[i], oldest+int64(i))
			}
			out := make([]Probe, n)
			for i := range live {
				f.Test(byPart[i], out)
				for j, pr := range out {
					if pr.Maybe&(1<<i) == 0 {
						t.Fatalf("partition %d key %d: probe %b lacks its bit", i, j, pr.Maybe)
					}
				}
			}
			absent := keys("absent-", 100_000)
			if got := windowRate(f, absent); got > 1.4*0.01 {
				t.Errorf("measured window rate %.4f, target 0.01 (model at fill %.4f)", got, f.EstimatedFalsePositive())
			}
			// Each partition's filter round-trips alone into empty filters.
			g := filtersOfLive(t, live, n, 0.01, newest)
			for i := range live {
				var buf bytes.Buffer
				if _, err := f.WritePartition(&buf, oldest+int64(i), SnapshotMeta{Kind: SnapshotPartition}); err != nil {
					t.Fatal(err)
				}
				if err := g.MergeSnapshot(bytes.NewReader(buf.Bytes()), int64(buf.Len()), nil); err != nil {
					t.Fatal(err)
				}
			}
			want, have := make([]Probe, len(absent)), make([]Probe, len(absent))
			f.Test(absent, want)
			g.Test(absent, have)
			for i := range want {
				if want[i] != have[i] {
					t.Fatalf("key %d: merged %b, source %b", i, have[i].Maybe, want[i].Maybe)
				}
			}
			r1, r2 := f.cur.Load(), g.cur.Load()
			for i := range r1.words {
				if r1.words[i] != r2.words[i] {
					t.Fatalf("word %d: merged %x, source %x", i, r2.words[i], r1.words[i])
				}
			}
		})
	}
}

// TestColumnScatterInverse: gathering a slot's bits and setting them in
// empty words gives back exactly that slot's bits, for every width.
func TestColumnScatterInverse(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, live := range append([]int{1}, liveCases...) {
		sz := Sizing(3000, 0.01, live)
		l := newLayout(live, sz.M, sz.K)
		words := make([]uint64, len64(l))
		for i := range words {
			words[i] = rng.Uint64() & l.replicate(1<<live-1|map[bool]uint64{true: ^uint64(0)}[live == 64])
		}
		col := make([]uint64, l.m/64)
		for s := range uint64(live) {
			l.column(words, s, col)
			back := make([]uint64, len(words))
			l.scatter(back, s, col)
			rep := l.replicate(1 << s)
			for i := range words {
				if back[i] != words[i]&rep {
					t.Fatalf("live %d slot %d word %d: %x, want %x", live, s, i, back[i], words[i]&rep)
				}
			}
		}
	}
}

// TestRotationClearsOnlyTheDroppedSlot: the partition that takes a dropped
// partition's slot starts empty, and the partitions still live keep every
// key, while adds to them run concurrently with the clearing.
func TestRotationClearsOnlyTheDroppedSlot(t *testing.T) {
	const n = 20_000
	f := newFilters(t, n, 0.01, 7)
	old := keys("old", n)
	f.Add(old, 0)
	kept := keys("kept", n)
	f.Add(kept, 1)
	more := keys("more", n)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < n; i += 100 {
			f.Add(more[i:i+100], 2)
		}
	})
	f.Add(keys("new", 1), 8) // drops 0; 8 takes its slot
	wg.Wait()
	out := make([]Probe, n)
	oldest := f.Test(old, out)
	if oldest != 1 {
		t.Fatalf("oldest %d", oldest)
	}
	hits := 0
	for _, p := range out {
		if p.Maybe&(1<<(8-oldest)) != 0 {
			hits++
		}
	}
	if hits > n/50 {
		t.Fatalf("%d of %d keys of the dropped partition still found in the partition that took its slot", hits, n)
	}
	for name, ks := range map[string][]shard.Fingerprint{"kept": kept, "more": more} {
		p := map[string]int64{"kept": 1, "more": 2}[name]
		f.Test(ks, out)
		for i, pr := range out {
			if pr.Maybe&(1<<(p-oldest)) == 0 {
				t.Fatalf("%s key %d lost by the rotation: %b", name, i, pr.Maybe)
			}
		}
	}
}

// TestMergeKeepsConcurrentAdds: keys added while a merge copies the ring
// are in the merged ring (Add repeats into the new words).
func TestMergeKeepsConcurrentAdds(t *testing.T) {
	const n = 50_000
	src := newFilters(t, n, 0.01, 7)
	src.Add(keys("sealed", n), 5)
	var buf bytes.Buffer
	if _, err := src.WritePartition(&buf, 5, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
		t.Fatal(err)
	}
	f := newFilters(t, n, 0.01, 7)
	live := keys("live", n)
	f.Add(live[:1], 7)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; i < n; i += 50 {
			f.Add(live[i:i+50], 7)
		}
	})
	for range 20 {
		if err := f.MergeSnapshot(bytes.NewReader(buf.Bytes()), int64(buf.Len()), nil); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	out := make([]Probe, n)
	oldest := f.Test(live, out)
	for i, p := range out {
		if p.Maybe&(1<<(7-oldest)) == 0 {
			t.Fatalf("key %d added during a merge is lost: %b", i, p.Maybe)
		}
	}
	f.Test(keys("sealed", n), out)
	for i, p := range out {
		if p.Maybe&(1<<(5-oldest)) == 0 {
			t.Fatalf("merged key %d missing: %b", i, p.Maybe)
		}
	}
}

// linesTouched is the number of distinct 64-byte lines a probe of fp reads.
func (f *Filters) linesTouched(fp shard.Fingerprint) int {
	r := f.cur.Load()
	if r.valid == 0 {
		return 0
	}
	l := &f.lay
	c := l.start(fp)
	acc := r.valid
	seen := map[uint64]bool{}
	for i := 0; i < l.k; i++ {
		w, sh := l.next(&c, i)
		seen[w/8] = true // words is page-aligned: 8 words a line
		if acc &= r.words[w] >> sh; acc == 0 {
			break
		}
	}
	return len(seen)
}

// TestLinesPerProbeDoNotGrow: a new key's probe reads at most two cache
// lines whether one partition or all eight hold keys.
func TestLinesPerProbeDoNotGrow(t *testing.T) {
	const n = 20_000
	f := newFilters(t, n, 0.01, 7)
	absent := keys("absent", 20_000)
	for p := 0; p < 8; p++ {
		f.Add(keys("p"+strconv.Itoa(p), n), int64(p))
		total, most := 0, 0
		for _, fp := range absent {
			l := f.linesTouched(fp)
			total += l
			most = max(most, l)
		}
		t.Logf("%d partitions full: %.3f lines a new key, at most %d", p+1, float64(total)/float64(len(absent)), most)
		if most > 2 || most > Sizing(n, 0.01, 8).LinesPerProbe {
			t.Fatalf("%d partitions: a probe read %d lines", p+1, most)
		}
	}
}

// TestAddInFlightDuringDropLeavesNoBits: an Add into partition p that is
// still writing when p leaves the window must not leave bits in p's slot
// once the slot is p+Live's: they would be false positives for the new
// partition (in a bloom-only store, a new message dropped as a duplicate).
// One goroutine adds batches of distinct keys to p while the window moves
// past p and p+Live gets its slot; no key of p may then be reported in
// p+Live above the filters' false-positive rate.
func TestAddInFlightDuringDropLeavesNoBits(t *testing.T) {
	const live, n, batch = 2, 1 << 16, 2048
	var flagged, total int
	for round := range 40 {
		f := filtersOfLive(t, live, n, 0.01, 0)
		var (
			added [][]shard.Fingerprint
			stop  = make(chan struct{})
			done  = make(chan struct{})
		)
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				fps := keys(fmt.Sprintf("r%d-b%d-", round, i), batch)
				f.Add(fps, 0)
				added = append(added, fps)
			}
		}()
		time.Sleep(time.Duration(200+rand.IntN(800)) * time.Microsecond)
		f.Rotate(live) // partition 0 leaves the window
		f.Add(keys(fmt.Sprintf("r%d-new", round), 1), live)
		close(stop)
		<-done
		for _, fps := range added {
			out := make([]Probe, len(fps))
			oldest := f.Test(fps, out)
			for _, p := range out {
				total++
				if p.Maybe&(1<<(live-oldest)) != 0 {
					flagged++
				}
			}
		}
	}
	// The partition holds one key: its false-positive rate is ~0.
	if total == 0 {
		t.Fatal("no keys added")
	}
	if rate := float64(flagged) / float64(total); rate > 0.001 {
		t.Fatalf("%d of %d keys of the dropped partition are reported in its slot's new partition (%.4f)", flagged, total, rate)
	}
	t.Logf("%d of %d flagged", flagged, total)
}
