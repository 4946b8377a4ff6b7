package bloom

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/shard"
)

// Attacks on the growth that rebuilds logged filters (growth.go: every
// filter logs its keys while the ring is below its full size, the growth
// to the full size builds the logged ones anew and drops every log; a
// filter placed from a file is unlogged and copied up). Each test pushes
// a ring through its last growth while something else happens, then
// checks the three promises: no key whose Add returned (or that a merged
// file held) is lost from its partition; a partition filled through every
// growth meets its per-filter target at capacity; logs stay bounded and
// are dropped at the full size.
//
// All of them use growing(1M keys a partition, 7 day partitions: live 8,
// four steps, the last growth at 31 250 keys a filter). The false-positive
// measurements (filling partitions to 1M keys) are skipped under -race.

const glaN = 1_000_000

// glaBlackBox skips the checks of the logs' contents before a growth
// (glaCheckLogged), to see that a fault is also caught by what the public
// API answers; set it only to check the tests against a broken filter.
const glaBlackBox = false

// glaLog is one live filter's log as seen from outside a growth.
type glaLog struct {
	part     int64
	n        int // logged keys
	cap      int // the log's capacity, in keys
	unlogged bool
	adds     int64
}

// glaLogs returns the current ring's step and its live filters' logs.
func glaLogs(f *Filters) (step int, logs map[int64]glaLog) {
	r := f.cur.Load()
	logs = map[int64]glaLog{}
	for s, fl := range r.slots {
		if fl == nil || r.valid>>s&1 == 0 {
			continue
		}
		fl.keysMu.Lock()
		logs[fl.part] = glaLog{part: fl.part, n: len(fl.keys), cap: cap(fl.keys), unlogged: fl.logState != logging, adds: fl.adds.Load()}
		fl.keysMu.Unlock()
	}
	return r.step, logs
}

// glaLast returns the index of the full step and the add count of one
// filter at which the ring grows to it.
func glaLast(f *Filters) (last int, at int64) {
	last = len(f.steps) - 1
	return last, f.growAt[last-1]
}

// glaCheckDropped fails unless the ring is at its full size and no live
// filter holds a log (one created at the full size never logged: its
// unlogged flag is not set, and need not be).
func glaCheckDropped(t *testing.T, f *Filters, what string) {
	t.Helper()
	step, logs := glaLogs(f)
	if last, _ := glaLast(f); step != last || f.Bytes() != f.FullBytes() {
		t.Fatalf("%s: ring at step %d (%d bytes), want the full step %d (%d bytes)", what, step, f.Bytes(), last, f.FullBytes())
	}
	for p, l := range logs {
		if l.n != 0 {
			t.Fatalf("%s: at the full size, partition %d still logs %d keys (unlogged %v)", what, p, l.n, l.unlogged)
		}
	}
}

// glaCheckLogged fails unless, of parts' filters, the newest partition's
// is logged with exactly its add count (no add in flight) and the older
// ones hold no log (dropped when a newer partition's filter was created),
// and each of unlogged is not logged and holds no log.
func glaCheckLogged(t *testing.T, f *Filters, parts, unlogged []int64, what string) {
	t.Helper()
	if glaBlackBox {
		return
	}
	_, logs := glaLogs(f)
	newest := f.cur.Load().newest
	for _, p := range parts {
		l, ok := logs[p]
		if p == newest && (!ok || l.unlogged || int64(l.n) != l.adds) {
			t.Fatalf("%s: newest partition %d: %+v (present %v), want logged with every add", what, p, l, ok)
		}
		if p < newest && (!ok || !l.unlogged || l.n != 0) {
			t.Fatalf("%s: partition %d, older than the newest %d: %+v (present %v), want its log dropped", what, p, newest, l, ok)
		}
	}
	for _, p := range unlogged {
		l, ok := logs[p]
		if !ok || !l.unlogged || l.n != 0 {
			t.Fatalf("%s: partition %d: %+v (present %v), want unlogged with no log", what, p, l, ok)
		}
	}
}

// glaAbsentIn returns how many of fps partition p's bit does not name.
func glaAbsentIn(f *Filters, fps []shard.Fingerprint, p int64) int {
	return len(fps) - mergeHits(f, fps, p)
}

// glaRate is the fraction of absent whose probe names partition p.
func glaRate(f *Filters, absent []shard.Fingerprint, p int64) float64 {
	return float64(mergeHits(f, absent, p)) / float64(len(absent))
}

// glaAdd adds fps to p in batches of batch.
func glaAdd(f *Filters, fps []shard.Fingerprint, p int64, batch int) {
	for i := 0; i < len(fps); i += batch {
		f.Add(fps[i:min(i+batch, len(fps))], p)
	}
}

// glaFillRate fills partition p to glaN keys and returns its measured
// rate against fresh absent keys.
func glaFillRate(f *Filters, p int64, tag string) float64 {
	_, logs := glaLogs(f)
	if more := glaN - int(logs[p].adds); more > 0 {
		glaAdd(f, keys(fmt.Sprintf("fill-%s-%d-", tag, p), more), p, 4096)
	}
	return glaRate(f, keys("absent-"+tag, 400_000), p)
}

// glaInterleave adds n keys (prefix-p-i) to each of parts, in batches
// of 256 taken in turn, so that every one of them goes through the
// growths it passes holding its share of keys; they are acknowledged in k.
func glaInterleave(f *Filters, k *glaKeyed, prefix string, parts []int64, n int) {
	all := map[int64][]shard.Fingerprint{}
	for _, p := range parts {
		all[p] = keys(fmt.Sprintf("%s-%d-", prefix, p), n)
	}
	for i := 0; i < n; i += 256 {
		for _, p := range parts {
			f.Add(all[p][i:min(i+256, n)], p)
		}
	}
	for _, p := range parts {
		k.add(p, all[p])
	}
}

// glaKeyed is a ledger of keys acknowledged by Add, by partition.
type glaKeyed struct {
	mu sync.Mutex
	by map[int64][]shard.Fingerprint
	n  atomic.Int64
}

func (k *glaKeyed) add(p int64, fps []shard.Fingerprint) {
	k.mu.Lock()
	if k.by == nil {
		k.by = map[int64][]shard.Fingerprint{}
	}
	k.by[p] = append(k.by[p], fps...)
	k.mu.Unlock()
	k.n.Add(int64(len(fps)))
}

func (k *glaKeyed) get(p int64) []shard.Fingerprint { return k.tail(p, -1) }

// tail returns the newest n keys of p (all if n < 0).
func (k *glaKeyed) tail(p int64, n int) []shard.Fingerprint {
	k.mu.Lock()
	defer k.mu.Unlock()
	fps := k.by[p]
	if n >= 0 {
		fps = fps[len(fps)-min(len(fps), n):]
	}
	return append([]shard.Fingerprint(nil), fps...)
}

// glaCheckAll fails for any acknowledged key whose partition does not
// name it.
func glaCheckAll(t *testing.T, f *Filters, k *glaKeyed, what string) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	for p, fps := range k.by {
		if m := glaAbsentIn(f, fps, p); m > 0 {
			step, logs := glaLogs(f)
			t.Fatalf("%s: %d of %d keys acknowledged in partition %d lost (step %d, logs %+v)", what, m, len(fps), p, step, logs)
		}
	}
}

// glaAdders runs workers goroutines, each adding per keys (prefix-gW-i) in
// batches of batch to the partition part(w, i) gives, checking each batch
// in its partition as soon as Add returns, acknowledging it to k. It
// returns the first error.
func glaAdders(f *Filters, k *glaKeyed, prefix string, workers, per, batch int, part func(w, i int) int64) error {
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fps := keys(fmt.Sprintf("%s-g%d-", prefix, w), per)
			for i := 0; i*batch < per; i++ {
				b := fps[i*batch : min((i+1)*batch, per)]
				p := part(w, i)
				f.Add(b, p)
				if m := glaAbsentIn(f, b, p); m > 0 {
					step, _ := glaLogs(f)
					errs <- fmt.Errorf("%s worker %d: %d of %d keys not in partition %d right after their Add returned (step %d)", prefix, w, m, len(b), p, step)
					return
				}
				k.add(p, b)
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// glaProbers tests acknowledged keys of parts until stop closes, sending
// the first one absent from its partition to errs.
func glaProbers(f *Filters, k *glaKeyed, parts []int64, stop <-chan struct{}, errs chan<- error) *sync.WaitGroup {
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 99))
			for {
				select {
				case <-stop:
					return
				default:
				}
				p := parts[rng.IntN(len(parts))]
				b := k.tail(p, 512)
				if len(b) == 0 {
					runtime.Gosched()
					continue
				}
				if m := glaAbsentIn(f, b, p); m > 0 {
					select {
					case errs <- fmt.Errorf("prober: %d of the newest %d keys of partition %d absent", m, len(b), p):
					default:
					}
					return
				}
			}
		}()
	}
	return &wg
}

// TestGrowthLogConcurrentLastGrowth: five logged partitions are filled to
// just below the last growth point, then six goroutines add batches to
// all five (probers and a WritePartition loop racing them) through the
// last growth. Every key is found in its partition at once and at the
// end, every partition file written during the growth holds the keys
// acknowledged before it was written, the newest partition's log is
// exact before the growth (the older ones' dropped) and gone after, and
// the newest partition, filled on to capacity, meets its per-filter
// target. (An older one filled on to capacity would not: its bits are
// copied up; partitions older than the newest take few keys.)
func TestGrowthLogConcurrentLastGrowth(t *testing.T) {
	f := growing(t, glaN, 10) // live 3..10
	last, at := glaLast(f)
	parts := []int64{6, 7, 8, 9, 10}
	var k glaKeyed
	glaInterleave(f, &k, "pre", parts, int(at)-2500)
	if step, _ := glaLogs(f); step != last-1 {
		t.Fatalf("after filling below the last growth point: step %d, want %d", step, last-1)
	}
	glaCheckLogged(t, f, parts, nil, "below the last growth")

	stop := make(chan struct{})
	errs := make(chan error, 4)
	pw := glaProbers(f, &k, parts, stop, errs)
	type written struct {
		file  []byte
		acked []shard.Fingerprint
		step  int
	}
	var files []written
	var ww sync.WaitGroup
	ww.Add(1)
	go func() {
		defer ww.Done()
		for len(files) < 40 {
			select {
			case <-stop:
				return
			default:
			}
			acked := k.get(9)
			step, _ := glaLogs(f)
			var buf bytes.Buffer
			if _, err := f.WritePartition(&buf, 9, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
				errs <- err
				return
			}
			files = append(files, written{buf.Bytes(), acked, step})
		}
	}()
	per := 12000
	err := glaAdders(f, &k, "conc", 6, per, 100, func(w, i int) int64 { return parts[(w+i)%len(parts)] })
	close(stop)
	pw.Wait()
	ww.Wait()
	close(errs)
	if err != nil {
		t.Fatal(err)
	}
	for err := range errs {
		t.Fatal(err)
	}
	glaCheckAll(t, f, &k, "after the concurrent last growth")
	glaCheckDropped(t, f, "after the concurrent last growth")
	steps := map[int]int{}
	for i, w := range files {
		g := growing(t, glaN, 10)
		if err := g.MergeSnapshot(bytes.NewReader(w.file), int64(len(w.file)), nil); err != nil {
			t.Fatal(err)
		}
		if m := glaAbsentIn(g, w.acked, 9); m > 0 {
			t.Fatalf("partition file %d (written at step %d): %d of the %d keys acknowledged before it missing", i, w.step, m, len(w.acked))
		}
		steps[w.step]++
	}
	t.Logf("%d partition files checked, by the step seen before writing: %v", len(files), steps)
	if raceOn {
		return
	}
	for _, p := range []int64{10} {
		r := glaFillRate(f, p, "conc")
		t.Logf("partition %d filled through every growth, 6 adders at the last: %.5f, target %.5f (%.2f×)", p, r, f.perFP, r/f.perFP)
		if r > 1.3*f.perFP {
			t.Errorf("partition %d: rate %.5f at capacity, %.2f× its target %.5f", p, r, r/f.perFP, f.perFP)
		}
	}
}

// TestGrowthLogMergeSealedAroundLastGrowth: partition files (written at
// the smallest step, at the step after and at the step below full) are
// merged into logged filters of the same partitions just before the last
// growth, while adders push the ring through it, and just after it. The
// merged keys and every acknowledged key survive; the merged filters are
// unlogged (copied up), the newest partition's (11, not merged) rebuilt
// from its log; it meets its target at capacity.
func TestGrowthLogMergeSealedAroundLastGrowth(t *testing.T) {
	src := growing(t, glaN, 10)
	_, at := glaLast(src)
	sealed := map[int64][]shard.Fingerprint{
		9:  keys("sealed-9-", 3000),                // step 0
		8:  keys("sealed-8-", int(src.growAt[0])),  // step 1
		10: keys("sealed-10-", int(src.growAt[1])), // step 2 (below full)
	}
	var srcFiles [][]byte
	for _, p := range []int64{9, 8, 10} {
		src.Add(sealed[p], p)
		var buf bytes.Buffer
		if _, err := src.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition}); err != nil {
			t.Fatal(err)
		}
		srcFiles = append(srcFiles, buf.Bytes())
	}
	if step, _ := glaLogs(src); step != 2 {
		t.Fatalf("source at step %d, want 2", step)
	}
	sources := func() []SnapshotSource {
		var s []SnapshotSource
		for _, b := range srcFiles {
			s = append(s, SnapshotSource{R: bytes.NewReader(b), Size: int64(len(b))})
		}
		return s
	}
	modes := []string{"before", "during", "during", "during", "during", "after"}
	if raceOn {
		modes = []string{"before", "during", "during", "after"}
	}
	orders := map[string]int{}
	for i, mode := range modes {
		f := growing(t, glaN, 10)
		last, _ := glaLast(f)
		var k glaKeyed
		for _, p := range []int64{7, 8, 9, 10, 11} {
			fps := keys(fmt.Sprintf("own-%d-%d-", i, p), int(at)-2000)
			glaAdd(f, fps, p, 256)
			k.add(p, fps)
		}
		merge := func() (before, after int) {
			before, _ = glaLogs(f)
			for j, err := range f.MergeSnapshots(sources()) {
				if err != nil {
					t.Errorf("merge %d: %v", j, err)
				}
			}
			after, _ = glaLogs(f)
			return before, after
		}
		if mode == "before" {
			merge()
			glaCheckLogged(t, f, []int64{7, 11}, []int64{8, 9, 10}, "merged below the last growth")
		}
		var merged sync.WaitGroup
		if mode == "during" {
			threshold := []int64{0, 2500, 5000, 7500}[i-1] // acknowledged concurrent keys before the merge
			merged.Add(1)
			go func() {
				defer merged.Done()
				for k.n.Load() < 5*(int64(at)-2000)+threshold {
					runtime.Gosched()
				}
				b, a := merge()
				mu := fmt.Sprintf("merge at step %d→%d", b, a)
				orders[mu]++
			}()
		}
		err := glaAdders(f, &k, fmt.Sprintf("m%d", i), 4, 3000, 100, func(w, i int) int64 { return int64(7 + (w+i)%5) })
		merged.Wait()
		if err != nil {
			t.Fatal(err)
		}
		if mode == "after" {
			if step, _ := glaLogs(f); step != last {
				t.Fatalf("not grown before the merge: step %d", step)
			}
			merge()
		}
		what := fmt.Sprintf("iteration %d (merge %s the last growth)", i, mode)
		glaCheckAll(t, f, &k, what)
		for p, fps := range sealed {
			if m := glaAbsentIn(f, fps, p); m > 0 {
				t.Fatalf("%s: %d of the %d keys merged into partition %d lost", what, m, len(fps), p)
			}
		}
		glaCheckDropped(t, f, what)
		if i == 0 && !raceOn {
			r := glaFillRate(f, 11, "merge")
			t.Logf("%s: partition 11 (the newest, logged beside merged filters) at capacity: %.5f, target %.5f (%.2f×)", what, r, f.perFP, r/f.perFP)
			if r > 1.3*f.perFP {
				t.Errorf("%s: partition 11 rate %.5f, %.2f× its target", what, r, r/f.perFP)
			}
		}
	}
	t.Logf("merges during the growth: %v", orders)
}

// TestGrowthLogSmallSnapshotThenGrow: a snapshot written at step 0 is
// read into new filters (its two filters unlogged), new partitions are
// logged beside them, keys go to both kinds, and adders push the mixed
// ring through the last growth. Every key survives; the logged partition
// filled on to capacity meets its target (its lane cleared of the copied
// bits and rebuilt). Then the same snapshot is read into filters that
// had grown to the step below full (the ring shrinks back, its logged
// filters replaced), which grow again.
func TestGrowthLogSmallSnapshotThenGrow(t *testing.T) {
	src := growing(t, glaN, 10)
	snapKeys := map[int64][]shard.Fingerprint{8: keys("snap-8-", 3000), 9: keys("snap-9-", int(src.growAt[0])-500)}
	src.Add(snapKeys[8], 8)
	glaAdd(src, snapKeys[9], 9, 1000)
	if step, _ := glaLogs(src); step != 0 {
		t.Fatalf("source at step %d, want 0", step)
	}
	var snap bytes.Buffer
	if _, err := src.WriteSnapshot(&snap, SnapshotMeta{Kind: SnapshotCache}); err != nil {
		t.Fatal(err)
	}
	read := func(f *Filters) {
		t.Helper()
		if err := f.ReadSnapshot(bytes.NewReader(snap.Bytes()), int64(snap.Len()), nil); err != nil {
			t.Fatal(err)
		}
	}

	f := growing(t, glaN, 10)
	last, at := glaLast(f)
	read(f)
	if step, _ := glaLogs(f); step != 0 {
		t.Fatalf("after reading a step-0 snapshot: step %d", step)
	}
	glaCheckLogged(t, f, nil, []int64{8, 9}, "read from a snapshot")
	var k glaKeyed
	for p, fps := range snapKeys {
		k.add(p, fps)
	}
	// 7 and 10 (logged) and 9 (read) in turn through the growths below
	// full: 9's adds count the snapshot's, so it takes fewer.
	glaInterleave(f, &k, "mixed", []int64{7, 10}, int(at)-3000-len(snapKeys[9]))
	more9 := keys("mixed-9-", int(at)-3000-2*len(snapKeys[9]))
	glaAdd(f, more9, 9, 256)
	k.add(9, more9)
	glaInterleave(f, &k, "mixed-more", []int64{7, 10}, len(snapKeys[9]))
	if step, _ := glaLogs(f); step != last-1 {
		t.Fatalf("mixed ring at step %d, want %d", step, last-1)
	}
	glaCheckLogged(t, f, []int64{7, 10}, []int64{8, 9}, "mixed ring below the last growth")
	err := glaAdders(f, &k, "mix", 6, 3000, 128, func(w, i int) int64 { return []int64{7, 8, 9, 10}[(w+i)%4] })
	if err != nil {
		t.Fatal(err)
	}
	glaCheckAll(t, f, &k, "mixed ring grown")
	glaCheckDropped(t, f, "mixed ring grown")
	if !raceOn {
		r10 := glaFillRate(f, 10, "mixed")
		r9 := glaFillRate(f, 9, "mixed")
		t.Logf("at capacity: logged partition 10 %.5f (%.2f×), copied partition 9 %.5f (%.2f×), target %.5f", r10, r10/f.perFP, r9, r9/f.perFP, f.perFP)
		if r10 > 1.3*f.perFP {
			t.Errorf("logged partition 10 in a mixed ring: rate %.5f, %.2f× its target %.5f", r10, r10/f.perFP, f.perFP)
		}
	}

	// The snapshot read over filters at the step below full.
	g := growing(t, glaN, 10)
	gone := keys("gone-", int(at)-1000)
	glaAdd(g, gone, 10, 512)
	glaAdd(g, keys("gone7-", 500), 7, 512)
	read(g)
	glaCheckLogged(t, g, nil, []int64{8, 9}, "snapshot read over a larger ring")
	if step, _ := glaLogs(g); step != 0 {
		t.Fatalf("a step-0 snapshot read over a step-%d ring left step %d", last-1, step)
	}
	var k2 glaKeyed
	for p, fps := range snapKeys {
		k2.add(p, fps)
	}
	if err := glaAdders(g, &k2, "shrunk", 4, int(at)/2, 256, func(w, i int) int64 { return int64(9 + w%2) }); err != nil {
		t.Fatal(err)
	}
	glaCheckAll(t, g, &k2, "snapshot read over a larger ring, grown again")
	glaCheckDropped(t, g, "snapshot read over a larger ring, grown again")
	if h := mergeHits(g, gone, 10); h > len(gone)/20 {
		t.Fatalf("%d of %d keys added before the snapshot was read are back in partition 10 (a log that outlived ReadSnapshot?)", h, len(gone))
	}
}

// TestGrowthLogRotateDuringLastGrowth: the oldest live partition (logged,
// just below the last growth point) is dropped by rotation while adders
// push the ring through the last growth, and the new partition takes its
// slot and receives keys. Each round rotates at another moment. Every key
// of a live partition survives in its own partition; the dropped
// partition's keys do not show in the new partition's lane (no log or bit
// of the dropped filter carried into the slot); the new partition filled
// to capacity meets its target.
func TestGrowthLogRotateDuringLastGrowth(t *testing.T) {
	rounds := []int{0, 1, 2, 3, 4, -1}
	if raceOn {
		rounds = []int{0, 2, -1}
	}
	for ri, when := range rounds {
		f := growing(t, glaN, 10) // live 3..10; 11 takes 3's slot
		last, at := glaLast(f)
		dropped := keys(fmt.Sprintf("old-%d-", ri), int(at)-4000)
		glaAdd(f, dropped, 3, 256)
		var k glaKeyed
		for _, p := range []int64{9, 10} {
			fps := keys(fmt.Sprintf("rot-%d-%d-", ri, p), int(at)-3000)
			glaAdd(f, fps, p, 256)
			k.add(p, fps)
		}
		glaCheckLogged(t, f, []int64{3, 9, 10}, nil, "before the rotation")
		var newest atomic.Int64
		newest.Store(10)
		var rotated sync.WaitGroup
		var stepAt atomic.Int64
		if when >= 0 {
			rotated.Add(1)
			go func() {
				defer rotated.Done()
				for k.n.Load() < 2*(int64(at)-3000)+int64(when)*1200 {
					runtime.Gosched()
				}
				s, _ := glaLogs(f)
				stepAt.Store(int64(s))
				newest.Store(11)
				f.Rotate(11) // or an add to 11 did, just before
			}()
		}
		// Workers 0-1 add to the newest partition (3 until it is dropped:
		// those keys are not acknowledged), 2-5 to 9 and 10.
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for w := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fps := keys(fmt.Sprintf("rw-%d-%d-", ri, w), 4000)
				for i := 0; i < len(fps); i += 100 {
					b := fps[i:min(i+100, len(fps))]
					p := int64(9 + w%2)
					if w < 2 {
						if p = newest.Load(); p == 10 {
							p = 3 // the partition about to be dropped
						}
					}
					f.Add(b, p)
					if p == 3 {
						continue
					}
					if m := glaAbsentIn(f, b, p); m > 0 {
						errs <- fmt.Errorf("round %d worker %d: %d keys absent from partition %d after Add", ri, w, m, p)
						return
					}
					k.add(p, b)
				}
			}()
		}
		wg.Wait()
		rotated.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if when < 0 { // after the growth
			if step, _ := glaLogs(f); step != last {
				t.Fatalf("round %d: not grown before the rotation", ri)
			}
			stepAt.Store(int64(last))
			f.Rotate(11)
		}
		fresh := keys(fmt.Sprintf("new-%d-", ri), 3000)
		glaAdd(f, fresh, 11, 300)
		k.add(11, fresh)
		what := fmt.Sprintf("round %d (rotation at step %d)", ri, stepAt.Load())
		glaCheckAll(t, f, &k, what)
		glaCheckDropped(t, f, what)
		if h := mergeHits(f, dropped, 11); h > len(dropped)/100 {
			t.Fatalf("%s: %d of %d keys of the dropped partition 3 show in partition 11, which took its slot", what, h, len(dropped))
		}
		t.Logf("%s: %d keys of the dropped partition in 11's lane", what, mergeHits(f, dropped, 11))
		if ri == 0 && !raceOn {
			r := glaFillRate(f, 11, "rot")
			t.Logf("%s: partition 11 at capacity: %.5f (%.2f× target %.5f)", what, r, r/f.perFP, f.perFP)
			if r > 1.3*f.perFP {
				t.Errorf("%s: partition 11 rate %.5f, %.2f× its target", what, r, r/f.perFP)
			}
		}
	}
}

// TestGrowthLogResetDuringGrowth: Reset lands at a different moment of
// the growths in each round while adders go on. Keys whose Add began after
// Reset returned survive; keys whose Add returned before Reset began are
// gone (no log of a dropped filter is replayed); the ring still reaches
// its full size with no log, and a partition filled after the Reset
// through the last growth meets its target.
func TestGrowthLogResetDuringGrowth(t *testing.T) {
	// Partition 10 starts with 3000 keys; concurrent keys go half to 10:
	// it passes the growth points (7812, 15625, 31250) at about 9.6k,
	// 25k and 56k of them.
	thresholds := []int64{0, 8000, 16000, 30000, 50000, 60000}
	if raceOn {
		thresholds = []int64{0, 16000, 60000}
	}
	for ri, th := range thresholds {
		f := growing(t, glaN, 10)
		last, at := glaLast(f)
		var before []shard.Fingerprint
		pre := keys(fmt.Sprintf("rs-pre-%d-", ri), 3000)
		glaAdd(f, pre, 10, 256)
		before = append(before, pre...)
		var started, done, finished atomic.Bool
		var stepAt atomic.Int64
		var acked atomic.Int64
		var resetWG sync.WaitGroup
		resetWG.Add(1)
		go func() {
			defer resetWG.Done()
			for acked.Load() < th && !finished.Load() {
				runtime.Gosched()
			}
			s, _ := glaLogs(f)
			stepAt.Store(int64(s))
			started.Store(true)
			f.Reset()
			done.Store(true)
		}()
		var mu sync.Mutex
		var k glaKeyed
		var wg sync.WaitGroup
		errs := make(chan error, 4)
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				fps := keys(fmt.Sprintf("rs-%d-%d-", ri, w), int(at)/2)
				for i := 0; i < len(fps); i += 200 {
					b := fps[i:min(i+200, len(fps))]
					p := int64(9 + w%2)
					after := done.Load()
					f.Add(b, p)
					if after {
						if m := glaAbsentIn(f, b, p); m > 0 {
							errs <- fmt.Errorf("round %d: %d keys added after the Reset absent from partition %d", ri, m, p)
							return
						}
						k.add(p, b)
					} else if !started.Load() {
						mu.Lock()
						before = append(before, b...)
						mu.Unlock()
					}
					acked.Add(int64(len(b)))
				}
			}()
		}
		wg.Wait()
		finished.Store(true)
		resetWG.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		what := fmt.Sprintf("round %d (Reset at step %d)", ri, stepAt.Load())
		// Push on through the last growth after the Reset.
		more := keys(fmt.Sprintf("rs-more-%d-", ri), int(at)+500)
		glaAdd(f, more, 10, 500)
		k.add(10, more)
		glaCheckAll(t, f, &k, what)
		glaCheckDropped(t, f, what)
		out := make([]Probe, len(before))
		f.Test(before, out)
		back := 0
		for _, p := range out {
			if p.Maybe != 0 {
				back++
			}
		}
		t.Logf("%s: %d of %d keys added before it found afterwards", what, back, len(before))
		if back > len(before)/50 {
			t.Fatalf("%s: %d of %d keys whose Add returned before the Reset are still found", what, back, len(before))
		}
		if ri == 0 && !raceOn {
			r := glaFillRate(f, 10, "reset")
			t.Logf("%s: partition 10 at capacity: %.5f (%.2f× target %.5f)", what, r, r/f.perFP, f.perFP)
			if r > 1.3*f.perFP {
				t.Errorf("%s: partition 10 rate %.5f, %.2f× its target", what, r, r/f.perFP)
			}
		}
		_ = last
	}
}

// TestGrowthLogMergeLargerStepGrows: a partition file or snapshot written
// at a larger step grows a ring of logged filters when merged (place grows
// it): from the smallest step straight to the full size (the logged
// filters rebuilt and their logs dropped), from the smallest to the step
// below full (logs kept, exact), concurrently with adders to the logged
// partitions, and with files of several steps in one MergeSnapshots in
// either order. Every key survives; a partition logged through the
// steps and rebuilt by the merge's growth meets its target.
func TestGrowthLogMergeLargerStepGrows(t *testing.T) {
	src := growing(t, glaN, 10)
	last, at := glaLast(src)
	big9 := keys("big-9-", int(at)+100)
	glaAdd(src, big9, 9, 4096)
	big8 := keys("big-8-", 700)
	src.Add(big8, 8)
	write := func(f *Filters, p int64) []byte {
		var buf bytes.Buffer
		var err error
		if p < 0 {
			_, err = f.WriteSnapshot(&buf, SnapshotMeta{Kind: SnapshotCache})
		} else {
			_, err = f.WritePartition(&buf, p, SnapshotMeta{Kind: SnapshotPartition})
		}
		if err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	bigPart, bigSnap := write(src, 9), write(src, -1)
	mid := growing(t, glaN, 10)
	mid9 := keys("mid-9-", int(mid.growAt[last-2])+100)
	glaAdd(mid, mid9, 9, 4096)
	if step, _ := glaLogs(mid); step != last-1 {
		t.Fatalf("mid source at step %d", step)
	}
	midPart := write(mid, 9)
	small := growing(t, glaN, 10)
	small7 := keys("small-7-", 900)
	small.Add(small7, 7)
	smallPart := write(small, 7)
	src1 := func(b []byte) SnapshotSource { return SnapshotSource{R: bytes.NewReader(b), Size: int64(len(b))} }
	mergeOK := func(f *Filters, bs ...[]byte) {
		t.Helper()
		var s []SnapshotSource
		for _, b := range bs {
			s = append(s, src1(b))
		}
		for i, err := range f.MergeSnapshots(s) {
			if err != nil {
				t.Fatalf("merge %d: %v", i, err)
			}
		}
	}

	// A: logged filters through steps 0..last-1, then a full-step file.
	t.Run("to-full", func(t *testing.T) {
		f := growing(t, glaN, 10)
		var k glaKeyed
		own10 := keys("a-10-", int(at)-200)
		glaAdd(f, own10, 10, 256)
		k.add(10, own10)
		own8 := keys("a-8-", 2000)
		f.Add(own8, 8)
		k.add(8, own8)
		glaCheckLogged(t, f, []int64{8, 10}, nil, "before the merge")
		mergeOK(f, bigPart)
		k.add(9, big9)
		glaCheckAll(t, f, &k, "a full-step file merged into a logged ring")
		glaCheckDropped(t, f, "a full-step file merged into a logged ring")
		if !raceOn {
			r := glaFillRate(f, 10, "tofull")
			t.Logf("partition 10 logged through every step, rebuilt by a merge's growth: %.5f (%.2f× target %.5f)", r, r/f.perFP, f.perFP)
			if r > 1.3*f.perFP {
				t.Errorf("partition 10 rate %.5f, %.2f× its target", r, r/f.perFP)
			}
		}
	})

	// B: from step 0 to the step below full: the logs stay, exact.
	t.Run("to-mid", func(t *testing.T) {
		f := growing(t, glaN, 10)
		var k glaKeyed
		own10 := keys("b-10-", 3000)
		f.Add(own10, 10)
		k.add(10, own10)
		own8 := keys("b-8-", 1000)
		f.Add(own8, 8)
		k.add(8, own8)
		mergeOK(f, midPart)
		if step, _ := glaLogs(f); step != last-1 {
			t.Fatalf("a step-%d file merged into a step-0 ring: step %d", last-1, step)
		}
		glaCheckLogged(t, f, []int64{8, 10}, []int64{9}, "grown by a merge below full")
		k.add(9, mid9)
		more := keys("b-10-more-", int(at))
		glaAdd(f, more, 10, 512)
		k.add(10, more)
		glaCheckAll(t, f, &k, "grown by a merge, then by adds")
		glaCheckDropped(t, f, "grown by a merge, then by adds")
	})

	// C: a full-step snapshot (partitions 8, 9) merged while adders write
	// into the logged partitions 8 and 10 below the last growth.
	t.Run("concurrent", func(t *testing.T) {
		rounds := 6
		if raceOn {
			rounds = 3
		}
		for r := range rounds {
			f := growing(t, glaN, 10)
			var k glaKeyed
			for _, p := range []int64{8, 10} {
				fps := keys(fmt.Sprintf("c-%d-%d-", r, p), int(at)-2500)
				glaAdd(f, fps, p, 256)
				k.add(p, fps)
			}
			var mw sync.WaitGroup
			mw.Add(1)
			go func() {
				defer mw.Done()
				for k.n.Load() < 2*(int64(at)-2500)+int64(r)*400 {
					runtime.Gosched()
				}
				for i, err := range f.MergeSnapshots([]SnapshotSource{src1(bigSnap)}) {
					if err != nil {
						t.Errorf("merge %d: %v", i, err)
					}
				}
			}()
			err := glaAdders(f, &k, fmt.Sprintf("c%d", r), 4, 1500, 100, func(w, i int) int64 { return []int64{8, 10}[(w+i)%2] })
			mw.Wait()
			if err != nil {
				t.Fatal(err)
			}
			k.add(9, big9)
			k.add(8, big8)
			what := fmt.Sprintf("round %d", r)
			glaCheckAll(t, f, &k, what)
			glaCheckDropped(t, f, what)
		}
	})

	// D: files of steps 0 and full in one MergeSnapshots, either order,
	// into a step-1 ring with logged partitions 7 and 10.
	t.Run("mixed-steps", func(t *testing.T) {
		for _, order := range []string{"small-first", "full-first"} {
			f := growing(t, glaN, 10)
			var k glaKeyed
			own7 := keys("d-7-"+order, 1000)
			f.Add(own7, 7)
			k.add(7, own7)
			own10 := keys("d-10-"+order, int(f.growAt[0])+100)
			glaAdd(f, own10, 10, 512)
			k.add(10, own10)
			if step, _ := glaLogs(f); step != 1 {
				t.Fatalf("%s: step %d, want 1", order, step)
			}
			if order == "small-first" {
				mergeOK(f, smallPart, bigPart)
			} else {
				mergeOK(f, bigPart, smallPart)
			}
			k.add(7, small7)
			k.add(9, big9)
			glaCheckAll(t, f, &k, order)
			glaCheckDropped(t, f, order)
		}
	})
}

// TestGrowthLogBounded: keys added one goroutine at a time in batches of
// every size to five partitions: below the full size the newest
// partition's log holds exactly its adds (the older ones' none), never more than the last growth point plus
// one batch; at the full size none. With concurrent adders, the bound is
// the growth point plus a batch an adder. A batch large enough to pass
// every growth point grows a ring straight to its full size. Filters
// dropped by rotation or Reset, with their logs, are collected.
func TestGrowthLogBounded(t *testing.T) {
	f := growing(t, glaN, 10)
	last, at := glaLast(f)
	rng := rand.New(rand.NewPCG(5, 6))
	maxBatch := 2000
	peak, peakCap := 0, 0
	for i := 0; ; i++ {
		b := 1 + rng.IntN(maxBatch)
		p := int64(6 + rng.IntN(5))
		f.Add(keys(fmt.Sprintf("bd-%d-", i), b), p)
		step, logs := glaLogs(f)
		if step == last {
			glaCheckDropped(t, f, "single adder")
			break
		}
		newest := f.cur.Load().newest
		for q, l := range logs {
			if q == newest && (l.unlogged || int64(l.n) != l.adds) {
				t.Fatalf("step %d, newest partition %d: %+v, want a log of every add", step, q, l)
			}
			if q < newest && (!l.unlogged || l.n != 0) {
				t.Fatalf("step %d, partition %d older than the newest %d: %+v, want its log dropped", step, q, newest, l)
			}
			if l.n > int(at)+maxBatch {
				t.Fatalf("partition %d logs %d keys, over the last growth point %d plus a batch", q, l.n, at)
			}
			peak, peakCap = max(peak, l.n), max(peakCap, l.cap)
		}
	}
	t.Logf("single adder: largest log %d keys, %d of capacity (%d bytes, not in Bytes()), last growth point %d", peak, peakCap, peakCap*16, at)

	// Concurrent adders, each checking the logs after every batch.
	g := growing(t, glaN, 10)
	const workers, batch = 6, 500
	var wg sync.WaitGroup
	var worst atomic.Int64
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fps := keys(fmt.Sprintf("bc-%d-", w), int(at))
			for i := 0; i < len(fps); i += batch {
				g.Add(fps[i:min(i+batch, len(fps))], int64(9+w%2))
				_, logs := glaLogs(g)
				for _, l := range logs {
					for {
						old := worst.Load()
						if int64(l.n) <= old || worst.CompareAndSwap(old, int64(l.n)) {
							break
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	glaCheckDropped(t, g, "concurrent adders")
	t.Logf("concurrent adders: largest log %d keys (bound %d)", worst.Load(), int(at)+workers*batch)
	if worst.Load() > at+workers*batch {
		t.Fatalf("a log reached %d keys, over %d + %d adders × %d", worst.Load(), at, workers, batch)
	}

	// One batch past every growth point: straight to the full size.
	h := growing(t, glaN, 10)
	huge := keys("huge-", int(at)+10)
	h.Add(huge, 10)
	glaCheckDropped(t, h, "one batch past every growth point")
	if m := glaAbsentIn(h, huge, 10); m > 0 {
		t.Fatalf("one batch past every growth point: %d keys lost", m)
	}

	// Dropped filters, logs and all, are collected.
	d := growing(t, glaN, 3)
	d.Add(keys("drop-3-", 5000), 3)
	d.Add(keys("drop-2-", 5000), 2)
	var collected atomic.Int32
	for _, p := range []int64{2, 3} {
		r := d.cur.Load()
		fl := r.slots[d.slot(p)]
		if fl == nil || fl.part != p {
			t.Fatalf("no filter for partition %d", p)
		}
		runtime.AddCleanup(fl, func(*atomic.Int32) { collected.Add(1) }, &collected)
	}
	d.Rotate(10) // drops 2 (3 is the oldest of 3..10)
	d.Add(keys("drop-10-", 100), 10)
	d.Reset() // drops 3 and 10
	d.Add(keys("drop-after-", 100), 10)
	deadline := time.Now().Add(5 * time.Second)
	for collected.Load() < 2 && time.Now().Before(deadline) {
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	if c := collected.Load(); c < 2 {
		t.Fatalf("%d of 2 filters dropped (rotation, Reset) with their logs collected", c)
	}
	runtime.KeepAlive(d)
}
