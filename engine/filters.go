package engine

import (
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// BloomPartition is one live partition's Bloom filter: its configured
// target beside what it was measured (or, bloom-only, estimated) to let
// through. Stats.Bloom.Partitions lists them, oldest first.
type BloomPartition struct {
	// Start is when the partition begins.
	Start time.Time
	// Keys counts the keys added to its filter.
	Keys int64
	// Checked counts new keys (the store did not hold them) probed against
	// this filter, over the most recent bloom.MeasureGeneration to twice
	// that many since Open; FalsePositives, those it answered "maybe" for,
	// each a disk read the filter should have saved. Zero in bloom-only,
	// where nothing can tell a false positive.
	Checked, FalsePositives uint64
	// MeasuredFP is FalsePositives/Checked (zero before a check);
	// TargetFP the filter's own target (the whole-window FalsePositive
	// spread over the live filters); EstimatedFP the rate the filter's
	// formula gives for Keys keys.
	MeasuredFP, TargetFP, EstimatedFP float64
	// OverTarget reports a rate above twice TargetFP: measured with
	// confidence (at least bloom.MinFalsePositives false positives), or in
	// bloom-only estimated from Keys. RecommendedExpectedKeys is then the
	// Options.ExpectedKeys that would size it for its keys (the current
	// partition's projected to its end); zero otherwise.
	OverTarget              bool
	RecommendedExpectedKeys int
	// Sealed reports a closed partition whose filter the store saved with
	// a seal: no write reaches it any more, and a restart loads it rather
	// than rebuilding it (the embedded store).
	Sealed bool
	// Inherited reports a filter that grew to its full size by copying
	// the bits a file restored at a smaller size (the store reopened
	// before its filters had grown): copying does not thin them, so it
	// lets more through than its keys alone would, and a larger
	// ExpectedKeys is not what it lacks (RecommendedExpectedKeys stays
	// zero while it holds fewer keys than ExpectedKeys). It meets its
	// target once its partition leaves the window.
	Inherited bool
}

// observeFilters counts, for the filters of the embedded store, the keys of
// one resolve the store found absent (b.ans) or the filters proved new, and
// the false positives among them: filters whose "maybe" the store overturned.
// Only warm filters are measured (proves): a rebuilding filter's masks are
// forced. It warns, once a partition, of a filter measured over twice its
// target.
func (e *Engine) observeFilters(b *batch, oldest, now int64) {
	var buf [16]uint64
	maybes := buf[:0]
	absent := len(b.cand) - len(b.qidx) // the filters proved them new
	for q, j := range b.qidx {
		if b.ans[q].Status != tier.Absent {
			continue
		}
		m := b.probes[j].Maybe
		if m != 0 && e.forgotten.has(b.fps[b.cand[j]]) {
			continue // forgotten: the filter rightly holds it
		}
		absent++
		if m != 0 {
			maybes = append(maybes, m)
		}
	}
	for _, p := range e.local.Observe(oldest, absent, maybes) {
		e.warnFilter(p, now)
	}
}

// warnFilter logs and counts a filter found over twice its target.
func (e *Engine) warnFilter(p bloom.PartitionStats, now int64) {
	e.stats.bloomOverTarget.Add(1)
	bp := e.bloomPartition(p, now)
	how := "estimated from its keys: bloom-only has no store to measure against"
	rate := bp.EstimatedFP
	if p.Checked > 0 {
		how = "measured: " + strconv.FormatUint(p.FalsePositives, 10) + " of the last " + strconv.FormatUint(p.Checked, 10) + " new keys probed read the store for nothing"
		rate = bp.MeasuredFP
	}
	advice := fmt.Sprintf("set ExpectedKeys to %d to restore the target", bp.RecommendedExpectedKeys)
	if bp.RecommendedExpectedKeys == 0 {
		advice = "it grew to its full size from bits restored at a smaller size, which growing does not thin; it meets its target once it leaves the window, and ExpectedKeys need not change"
	}
	e.logger.Printf("tierdedup: Bloom filter of the partition starting %s: false-positive rate %.3g, %.1f× its target %.3g (%s); it holds %d keys against ExpectedKeys %d: %s",
		bp.Start.UTC().Format(time.RFC3339), rate, rate/bp.TargetFP, bp.TargetFP, how, bp.Keys, e.opts.ExpectedKeys, advice)
}

// bloomPartition is p as Stats reports it at engine time now.
func (e *Engine) bloomPartition(p bloom.PartitionStats, now int64) BloomPartition {
	start := p.Partition * e.parts.Length
	bp := BloomPartition{
		Start: time.Unix(0, start), Keys: p.Keys, Checked: p.Checked, FalsePositives: p.FalsePositives,
		MeasuredFP: p.MeasuredFP(), TargetFP: p.TargetFP, EstimatedFP: p.EstimatedFP, OverTarget: p.OverTarget,
	}
	bp.Sealed = e.local != nil && e.local.Sealed(p.Partition)
	if e.exact != nil {
		// Judged by measure alone where a store can tell a false
		// positive: a filter's keys count refreshes and re-adds too.
		bp.OverTarget = bloom.MeasuredOverTarget(p.FalsePositives, p.Checked, p.TargetFP)
	}
	bp.Inherited = p.Inherited
	if bp.OverTarget && !(p.Inherited && p.Keys < int64(e.opts.ExpectedKeys)) {
		bp.RecommendedExpectedKeys = recommendKeys(p.Keys, now-start, e.parts.Length)
	}
	return bp
}

// recommendKeys is the ExpectedKeys for a partition of length that holds
// keys after elapsed of it: its keys projected to its end (a partition
// under a tenth through is projected from a tenth, so its first minutes do
// not multiply a burst), rounded up to two significant digits.
func recommendKeys(keys, elapsed, length int64) int {
	n := float64(keys)
	if elapsed < length {
		n *= float64(length) / float64(max(elapsed, length/10, 1))
	}
	if n < 1 {
		return 1
	}
	unit := math.Pow(10, math.Floor(math.Log10(n))-1)
	// Up, but not for a float's error on a round figure.
	return int(min(math.Ceil(n/unit-1e-9)*unit, MaxExpectedKeys))
}

// forgottenKeys is the set of the keys Forget removed most recently (up to
// forgottenCap), which the filters still hold: a "maybe" for one that the
// store finds absent is the filter right, not a false positive. Older
// forgets fall out first; one read again after that counts as a false
// positive, so a workload that forgets and re-sends more keys than the
// cap overstates the rate by those.
type forgottenKeys struct {
	n    atomic.Int64 // entries held, read without mu
	mu   sync.Mutex
	set  map[shard.Fingerprint]struct{}
	ring []shard.Fingerprint
	next int
}

const forgottenCap = 1 << 16

func (f *forgottenKeys) add(fps []shard.Fingerprint) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.set == nil {
		f.set = make(map[shard.Fingerprint]struct{})
	}
	for _, fp := range fps {
		if _, ok := f.set[fp]; ok {
			continue
		}
		if len(f.ring) < forgottenCap {
			f.ring = append(f.ring, fp)
		} else {
			delete(f.set, f.ring[f.next])
			f.ring[f.next] = fp
			f.next = (f.next + 1) % forgottenCap
		}
		f.set[fp] = struct{}{}
	}
	f.n.Store(int64(len(f.set)))
}

// has reports whether fp was forgotten recently; one atomic load when
// nothing was.
func (f *forgottenKeys) has(fp shard.Fingerprint) bool {
	if f.n.Load() == 0 {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.set[fp]
	return ok
}
