package bloom

import (
	"math"
	"math/bits"
	"sync/atomic"

	"github.com/tierdedup/tierdedup/shard"
)

// layout is where a key's bits live in the interleaved ring.
//
// Every word holds lanes of width live bits, one lane per position: bit s
// of a lane is the bit of the filter in slot s. A position therefore holds
// the bits of every live partition, and one load answers for all of them. A
// key's k positions fall in two blocks of blockWords words (one 64-byte
// cache line when lanes ≥ 8, that is up to 8 live partitions), chosen
// independently, k/2 positions in each; a probe reads at most two blocks,
// whatever the number of partitions holding keys.
//
// Position q of one filter (the order its snapshot record lists its bits)
// is lane q%lanes of word q/lanes.
type layout struct {
	width      uint64 // bits per lane: the number of live partitions
	lanes      uint64 // lanes per word
	blockWords uint64 // words per block, a multiple of 8
	blocks     uint64 // blocks in the ring
	m          uint64 // positions per filter: blocks·blockWords·lanes, a multiple of 64
	k          int    // hashes per key, even
}

func newLayout(live int, m uint64, k int) layout {
	l := layout{width: uint64(live), lanes: 64 / uint64(live), k: k}
	// At least 64 positions a block: fewer would need many more bits a key
	// for the same rate.
	l.blockWords = 8 * ((8 + l.lanes - 1) / l.lanes)
	if per := l.blockWords * l.lanes; m > 0 {
		l.blocks = m / per
		l.m = m
	}
	return l
}

// positions is the number of positions of one block.
func (l layout) positions() uint64 { return l.blockWords * l.lanes }

// linesPerProbe is the most cache lines one probe (or add) touches.
func (l layout) linesPerProbe() int { return int(2 * l.blockWords / 8) }

// blockStep is the smallest block count whose positions are a multiple of
// 64, so a filter's bits encode as whole words.
func (l layout) blockStep() uint64 {
	p := l.positions()
	g := uint64(64)
	for p%g != 0 {
		g /= 2
	}
	return 64 / g
}

// size returns the positions per filter and the (even) hash count that meet
// the per-filter false-positive rate per for n keys, by the layout's own
// rate (fp); k is 0 when no k up to MaxK reaches it.
func (l layout) size(n int, per float64) (m uint64, k int) {
	// Start from a classic filter's bits a key, which a blocked one needs
	// more of; search upward by 1 %.
	c := -math.Log(per) / (math.Ln2 * math.Ln2)
	step := l.blockStep()
	for range 400 {
		blocks := uint64(math.Ceil(c * float64(n) / float64(l.positions())))
		blocks = max(step, (blocks+step-1)/step*step)
		t := l
		t.blocks, t.m = blocks, blocks*l.positions()
		for k := 2; k <= MaxK; k += 2 {
			t.k = k
			if t.fp(float64(n)) <= per {
				return t.m, k
			}
		}
		c *= 1.01
	}
	return l.positions() * step, 0
}

// fp is the false-positive rate of one filter of the layout holding n keys:
// each of the query's two blocks holds a Poisson(2n/blocks) number of keys,
// each setting k/2 of its positions, and the query is a false positive when
// its k/2 positions of both blocks are set.
func (l layout) fp(n float64) float64 {
	if l.blocks == 0 || l.k == 0 {
		return 1
	}
	lambda := 2 * n / float64(l.blocks)
	if !(lambda >= 0) || lambda > 1<<20 {
		return 1 // no count, or a filter a million times over capacity
	}
	half := float64(l.k / 2)
	miss := 1 - 1/float64(l.positions())
	lo := max(0, math.Floor(lambda-12*math.Sqrt(lambda)-12))
	hi := lambda + 12*math.Sqrt(lambda) + 24
	var block float64
	for x := lo; x <= hi; x++ {
		lg, _ := math.Lgamma(x + 1)
		w := math.Exp(-lambda + x*math.Log(math.Max(lambda, 1e-300)) - lg)
		if x == 0 {
			w = math.Exp(-lambda)
		}
		block += w * math.Pow(1-math.Pow(miss, half*x), half)
	}
	return block * block
}

// cursor walks a key's positions: word index and lane shift of each.
type cursor struct {
	base [2]uint64
	s    uint64
}

func (l *layout) start(fp shard.Fingerprint) cursor {
	b1, _ := bits.Mul64(fp.Hi, l.blocks)
	b2, _ := bits.Mul64(fp.Lo, l.blocks)
	return cursor{base: [2]uint64{b1 * l.blockWords, b2 * l.blockWords}, s: fp.Hi ^ bits.RotateLeft64(fp.Lo, 32)}
}

// next returns position i's word and the shift of its lane; positions
// alternate between the two blocks, so both blocks' loads are in flight
// from the first two positions on.
//
// Each position is drawn from a Weyl sequence seeded by the fingerprint
// and mixed (MurmurHash3's finaliser): double hashing's positions, which
// step by a constant, fall on each other too often in blocks this small
// (measured: five times the false-positive rate at 10⁻³).
func (l *layout) next(p *cursor, i int) (word, shift uint64) {
	x := p.s
	p.s += 0x9e3779b97f4a7c15
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	t := (x >> 32) * l.blockWords
	return p.base[i&1] + t>>32, (uint64(uint32(t)) * l.lanes >> 32) * l.width
}

// test returns the lane bits (one per slot, within acc) set at every
// position of the key.
func (l *layout) test(words []uint64, fp shard.Fingerprint, acc uint64) uint64 {
	p := l.start(fp)
	for i := 0; i < l.k; i++ {
		w, sh := l.next(&p, i)
		if acc &= atomic.LoadUint64(&words[w]) >> sh; acc == 0 {
			return 0
		}
	}
	return acc
}

// add sets the key's bits in the slot whose lane bit is bit.
func (l *layout) add(words []uint64, fp shard.Fingerprint, bit uint64) {
	p := l.start(fp)
	for i := 0; i < l.k; i++ {
		w, sh := l.next(&p, i)
		if b := bit << sh; atomic.LoadUint64(&words[w])&b == 0 {
			atomic.OrUint64(&words[w], b)
		}
	}
}

// setPlain sets the key's bits as add does, with plain writes: words must
// not be shared yet (a ring being built).
func (l *layout) setPlain(words []uint64, fp shard.Fingerprint, bit uint64) {
	p := l.start(fp)
	for i := 0; i < l.k; i++ {
		w, sh := l.next(&p, i)
		words[w] |= bit << sh
	}
}

// replicate returns slots' bits repeated in every lane of a word.
func (l *layout) replicate(slots uint64) uint64 {
	var rep uint64
	for i := uint64(0); i < l.lanes; i++ {
		rep |= slots << (i * l.width)
	}
	return rep
}

// clear clears the slots' bits everywhere, atomically: concurrent adds to
// other slots are kept.
func (l *layout) clear(words []uint64, slots uint64) {
	if slots == 0 || words == nil {
		return
	}
	rep := l.replicate(slots)
	for i := range words {
		if atomic.LoadUint64(&words[i])&rep != 0 {
			atomic.AndUint64(&words[i], ^rep)
		}
	}
}

// column writes slot s's filter, in position order, into out (m/64 words).
func (l *layout) column(words []uint64, s uint64, out []uint64) {
	clear(out)
	switch l.lanes {
	case 64: // one partition: the words are the filter
		for i := range out {
			out[i] = atomic.LoadUint64(&words[i])
		}
	case 8: // byte lanes: gather bit s of each byte
		for i := range words {
			x := atomic.LoadUint64(&words[i]) >> s & 0x0101010101010101
			out[i>>3] |= (x * 0x0102040810204080 >> 56) << (8 * (i & 7))
		}
	default:
		q := uint64(0)
		for i := range words {
			w := atomic.LoadUint64(&words[i]) >> s
			for j := uint64(0); j < l.lanes; j++ {
				out[q>>6] |= (w >> (j * l.width) & 1) << (q & 63)
				q++
			}
		}
	}
}

// spread8[b] has bit 8j set for each bit j of b.
var spread8 = func() (t [256]uint64) {
	for b := range t {
		for j := range 8 {
			t[b] |= uint64(b>>j&1) << (8 * j)
		}
	}
	return t
}()

// scatter sets in words (not shared: plain writes) slot s's bits of the
// filter col (m/64 words, in position order).
func (l *layout) scatter(words []uint64, s uint64, col []uint64) {
	l.scatterRange(words, s, col, 0, len(words))
}

// scatterMany is scatterRange for several filters at once, filter r's
// bits cols[r] in slot slots[r]: at 8 lanes (the default window's 8 live
// partitions) each word is read and written once for all of them, not
// once a filter (BenchmarkMergeSealed, 7 sealed files of 12.5M keys:
// 762 ms before, 327 ms with one pass over ranges in parallel); other
// lane counts take a pass a filter.
func (l *layout) scatterMany(words []uint64, slots []uint64, cols [][]uint64, lo, hi int) {
	if l.lanes != 8 || lo%8 != 0 || hi%8 != 0 {
		for r := range cols {
			l.scatterRange(words, slots[r], cols[r], lo, hi)
		}
		return
	}
	for j := lo / 8; j < hi/8; j++ {
		var acc [8]uint64
		for r, col := range cols {
			c := col[j]
			if c == 0 {
				continue
			}
			s := slots[r]
			for k := range 8 {
				acc[k] |= spread8[byte(c>>(8*k))] << s
			}
		}
		w := words[j*8 : j*8+8]
		for k := range w {
			w[k] |= acc[k]
		}
	}
}

// scatterRange is scatter over words[lo:hi] only: goroutines given
// disjoint ranges write disjoint words.
func (l *layout) scatterRange(words []uint64, s uint64, col []uint64, lo, hi int) {
	switch l.lanes {
	case 64:
		for i := lo; i < hi; i++ {
			words[i] |= col[i]
		}
	case 8:
		for i := lo; i < hi; i++ {
			words[i] |= spread8[byte(col[i>>3]>>(8*(i&7)))] << s
		}
	default:
		q := uint64(lo) * l.lanes
		for i := lo; i < hi; i++ {
			var w uint64
			for j := uint64(0); j < l.lanes; j++ {
				w |= (col[q>>6] >> (q & 63) & 1) << (j*l.width + s)
				q++
			}
			words[i] |= w
		}
	}
}
