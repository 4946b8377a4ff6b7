package bloom

import (
	"math"
	"math/bits"

	"github.com/tierdedup/tierdedup/tier"
)

// PartitionStats are one live filter's figures (tier.FilterStats: the
// engine reads them through tier.Filters, which names no filter library).
type PartitionStats = tier.FilterStats

// MeasureGeneration is how many checks a filter's measured rate is
// counted over before the older half is dropped: the rate reported is over
// the last MeasureGeneration to 2 × MeasureGeneration checks.
const MeasureGeneration = 1 << 15

// MinFalsePositives is the fewest false positives a measured rate is judged
// on: below it, chance alone can double a rate.
const MinFalsePositives = 20

// MeasuredOverTarget reports whether fps false positives in checked probes
// show a rate above twice target with confidence: at least
// MinFalsePositives, and still above it two standard deviations (of a
// Poisson count) lower. A filter at its target passes it with a chance of
// about 10⁻⁵ per check once the count is large.
func MeasuredOverTarget(fps, checked uint64, target float64) bool {
	if fps < MinFalsePositives || checked == 0 {
		return false
	}
	f := float64(fps)
	return (f-2*math.Sqrt(f))/float64(checked) > 2*target
}

// Observe counts the probes of keys the exact tier found absent: absent
// keys were probed against the ring whose oldest partition was oldest (the
// value Test returned), and maybes holds the non-zero Maybe masks among
// them, their false positives. Each live filter counts absent checks, and
// each bit of a mask one false positive of its partition. It returns the
// filters this call made measurably over twice their target, each once in
// the filters' life (nil, without allocating, otherwise).
func (f *Filters) Observe(oldest int64, absent int, maybes []uint64) (over []PartitionStats) {
	if absent == 0 {
		return nil
	}
	r := f.cur.Load()
	var hit uint64
	if len(maybes) > 0 {
		var per [64]uint64 // false positives per partition oldest+d
		for _, m := range maybes {
			hit |= m
			for ; m != 0; m &= m - 1 {
				per[bits.TrailingZeros64(m)]++
			}
		}
		for h := hit; h != 0; h &= h - 1 {
			d := bits.TrailingZeros64(h)
			if fl := r.filter(f, oldest+int64(d)); fl != nil {
				fl.fps.Add(per[d])
			}
		}
	}
	// The checks after their false positives, so a generation that turns
	// now takes both.
	for d := range int64(f.parts.Live) {
		fl := r.filter(f, oldest+d)
		if fl == nil {
			continue
		}
		if fl.checked.Add(uint64(absent)) >= MeasureGeneration && fl.turning.CompareAndSwap(false, true) {
			// The current generation becomes the previous one. An Observe
			// adding meanwhile may count a few checks in either: a
			// rounding error on tens of thousands.
			fl.prevFPs.Store(fl.fps.Swap(0))
			fl.prevChecked.Store(fl.checked.Swap(0))
			fl.turning.Store(false)
		}
	}
	for hit != 0 {
		d := int64(bits.TrailingZeros64(hit))
		hit &= hit - 1
		fl := r.filter(f, oldest+d)
		if fl == nil || fl.warned.Load() {
			continue
		}
		if fps, checked := fl.measured(); !MeasuredOverTarget(fps, checked, f.perFP) {
			continue
		}
		if fl.warned.CompareAndSwap(false, true) {
			over = append(over, f.stats(fl))
		}
	}
	return over
}

// Overfilled reports partition p's filter once, the first time it is
// called after its keys made the formula's rate twice its target: the
// check of a filter with no exact tier behind it (bloom-only), whose
// false positives cannot be measured. One atomic load when it is not.
func (f *Filters) Overfilled(p int64) (PartitionStats, bool) {
	fl := f.cur.Load().filter(f, p)
	if fl == nil || fl.adds.Load() < f.over || fl.warned.Load() || !fl.warned.CompareAndSwap(false, true) {
		return PartitionStats{}, false
	}
	return f.stats(fl), true
}

// Partitions returns the live filters' figures, oldest first.
func (f *Filters) Partitions() []PartitionStats {
	r := f.cur.Load()
	oldest := f.parts.Oldest(r.newest)
	var out []PartitionStats
	for d := range int64(f.parts.Live) {
		if fl := r.filter(f, oldest+d); fl != nil {
			out = append(out, f.stats(fl))
		}
	}
	return out
}

// measured returns the filter's false positives and checks over its
// current and previous generations.
func (fl *filter) measured() (fps, checked uint64) {
	return fl.fps.Load() + fl.prevFPs.Load(), fl.checked.Load() + fl.prevChecked.Load()
}

func (f *Filters) stats(fl *filter) PartitionStats {
	s := PartitionStats{Partition: fl.part, Keys: fl.adds.Load(), TargetFP: f.perFP, Inherited: fl.inherited.Load()}
	s.FalsePositives, s.Checked = fl.measured()
	s.EstimatedFP = f.cur.Load().lay.fp(float64(s.Keys))
	if s.Checked > 0 {
		s.OverTarget = MeasuredOverTarget(s.FalsePositives, s.Checked, f.perFP)
	} else {
		s.OverTarget = s.Keys >= f.over
	}
	return s
}

// overfullKeys returns the fewest keys at which the layout's formula gives
// a filter more than twice the per-filter target per.
func (l layout) overfullKeys(per float64) int64 {
	lo, hi := int64(0), int64(1)
	for l.fp(float64(hi)) <= 2*per {
		if hi > 1<<50 {
			return math.MaxInt64
		}
		lo, hi = hi, hi*2
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if l.fp(float64(mid)) <= 2*per {
			lo = mid
		} else {
			hi = mid
		}
	}
	return hi
}
