package bloom

import (
	"fmt"
	"math"

	bitsbloom "github.com/bits-and-blooms/bloom/v3"

	"github.com/tierdedup/tierdedup/tier"
)

// Size is the shape of each filter of a ring.
type Size struct {
	// M is the bits of one filter (a multiple of 64), K the hashes per key.
	M uint64
	K int
	// PerFilter is each filter's false-positive target at capacity; Window
	// the union's over the live filters (the configured rate).
	PerFilter, Window float64
	// Bytes is the memory of the whole ring (every live filter).
	Bytes int64
	// LinesPerProbe is the most 64-byte cache lines one probe reads,
	// whatever the number of partitions holding keys.
	LinesPerProbe int
}

// CheckFalsePositive is the one rule for a whole-window false-positive
// target: in (0, 1), and reachable with at most MaxK hashes per key by live
// filters of expectedKeys keys.
func CheckFalsePositive(fp float64, expectedKeys, live int) error {
	if !(fp > 0 && fp < 1) {
		return fmt.Errorf("FalsePositive %v is outside (0, 1)", fp)
	}
	if live < 1 || live > tier.MaxLive {
		return fmt.Errorf("%d live partitions is outside [1, %d]", live, tier.MaxLive)
	}
	// The rule is a classic filter's optimal hash count: the blocked
	// layout reaches any rate with fewer hashes and ever more bits, which
	// is no way to size a filter.
	per := -math.Expm1(math.Log1p(-fp) / float64(live))
	if _, k := bitsbloom.EstimateParameters(uint(max(expectedKeys, 1)), per); k > MaxK {
		return fmt.Errorf("FalsePositive %v needs %d hashes per key, max %d", fp, k, MaxK)
	}
	if sz := Sizing(expectedKeys, fp, live); sz.K == 0 {
		return fmt.Errorf("FalsePositive %v is out of the layout's reach", fp)
	}
	return nil
}

// Sizing is the one rule that sizes the filters, for them, for the
// engine's option checks and for capacity plans: live filters of
// expectedKeys keys each, whose union meets the whole-window rate window.
// It sizes for the blocked layout's own false-positive rate (blockedFP), a
// little above a classic filter's for the same bits.
func Sizing(expectedKeys int, window float64, live int) Size {
	live = min(max(live, 1), tier.MaxLive)
	per := -math.Expm1(math.Log1p(-window) / float64(live))
	lay := newLayout(live, 0, 0)
	m, k := lay.size(max(expectedKeys, 1), per)
	lay = newLayout(live, m, k)
	return Size{M: m, K: k, PerFilter: per, Window: window, Bytes: int64(len64(lay)) * 8, LinesPerProbe: lay.linesPerProbe()}
}

func len64(l layout) uint64 { return l.blocks * l.blockWords }
