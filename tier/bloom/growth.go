package bloom

import (
	"math"
	"runtime/debug"
	"slices"
)

// Growth (Options.Grow): a ring starts at a small fraction of its full size
// and doubles (or more) as its partitions receive keys, so filters sized
// for ten million keys a partition cost about a MiB while they hold a
// few.
//
// A ring grows without its keys: every block is copied into the blocks
// that replace it. A key's block is the high bits of its fingerprint times
// the block count (layout.start), so in a ring d times larger the key's
// block is one of the d copies of its block in the smaller one, and
// positions inside a block do not depend on the block count. Every key
// added before the growth therefore finds all its bits in the grown ring:
// growing never loses a key (no false negative), and answers for the keys
// it holds exactly as the smaller ring did.
//
// What growing cannot do is thin the bits already set: a grown ring keeps
// the fraction of its bits the smaller one had set, and only the keys
// added after it spread over the larger ring. A ring therefore grows early,
// before its fullest filter holds 1/growEarly of the keys its size is
// meant for (a batch that would pass that grows it first): each doubling
// then carries about 1/(2·growEarly) of the next size's capacity. Measured
// (TestGrowthKeepsTheRate, three doublings): a partition filled through the
// growths meets 1.6 times its per-filter target at capacity, one that
// opens after the last growth its target (1.06 times). Only the
// partitions live while the ring grew carry that; a ring grows once in a
// store's life (a snapshot or checkpoint restores its size), or again
// after a crash whose filters are rebuilt from the store.
//
// Each growth copies the ring while adds wait (probes go on): a ring of
// the default size (≈ 150 MiB) grows from about a MiB through seven
// doublings, the last copying 74 MiB into 148. After one that replaces a
// ring of releaseBytes or more, the filters ask the runtime, in the
// background, to collect and return freed memory to the OS
// (debug.FreeOSMemory): the replaced copies would otherwise stay resident
// until the heap next reached its goal. This is the one place the
// repository calls it; it runs at most a few times in a store's life.

// Snapshots and sealed partitions record the size they were written at;
// reading one of a smaller step copies its blocks up (place), one of a
// larger step grows the ring first. A size that is not one of the steps is
// refused (ErrSnapshotParams), as any other parameter is.

const (
	// growEarly: a ring grows when its fullest filter holds 1/growEarly
	// of the keys its size is meant for.
	growEarly = 16
	// minStepBytes is about the smallest ring a growing Filters starts
	// at; maxSteps bounds the doublings up to the full size.
	minStepBytes = 1 << 20
	maxSteps     = 10
	// releaseBytes: a growth that replaces a ring of at least this many
	// bytes returns the freed memory to the OS (debug.FreeOSMemory).
	releaseBytes = 8 << 20
)

// setSteps sets the sizes a ring may take: only the full size, or (grow)
// the full size rounded up to a multiple of its halvings down to about
// minStepBytes, each step twice the one before.
func (f *Filters) setSteps(grow bool, expectedKeys int) {
	full := f.lay
	n := 0
	if grow {
		minBlocks := uint64(minStepBytes / (8 * full.blockWords))
		for n < maxSteps && full.blocks>>(n+1) >= minBlocks {
			n++
		}
	}
	if n > 0 {
		unit := full.blockStep() << n
		blocks := (full.blocks + unit - 1) / unit * unit
		full = newLayout(f.parts.Live, blocks*full.positions(), full.k)
		f.lay = full
	}
	f.steps = make([]layout, n+1)
	f.growAt = make([]int64, n+1)
	for i := range f.steps {
		shift := uint(n - i)
		f.steps[i] = newLayout(f.parts.Live, (full.blocks>>shift)*full.positions(), full.k)
		f.growAt[i] = max(1, int64(expectedKeys>>shift)/growEarly)
	}
	f.growAt[n] = math.MaxInt64
}

// stepOf returns the step whose size is m bits a filter, or false.
func (f *Filters) stepOf(m uint64) (int, bool) {
	for i := range f.steps {
		if f.steps[i].m == m {
			return i, true
		}
	}
	return 0, false
}

// stepFor returns the smallest step whose growth point is above adds.
func (f *Filters) stepFor(adds int64) int {
	i := 0
	for i < len(f.steps)-1 && adds >= f.growAt[i] {
		i++
	}
	return i
}

// grow makes the ring at least the step a filter of adds keys needs: the
// adds wait (a marker ring) while the words are copied up, then start again
// on the grown ring (Add).
func (f *Filters) grow(adds int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.cur.Load()
	to := f.stepFor(adds)
	if to <= cur.step {
		return // another add grew it
	}
	f.publish(cur.marker()) // no add writes cur.words while they are copied
	f.publish(f.grown(cur, to))
	if uint64(len(cur.words))*8 >= releaseBytes {
		// The copy just replaced is garbage the collector frees at its
		// next cycle, but the runtime keeps freed pages resident until the
		// heap reaches its goal again (twice the live heap with GOGC=100):
		// without this, a default engine at 1M keys stayed at 457 MiB of
		// RSS where it needs 338 (dedupbench footprint). At most a few
		// times in a store's life, in the background: adds do not wait.
		go debug.FreeOSMemory()
	}
}

// grown returns a copy of r (not shared: its words are read with plain
// loads) at step to, its blocks copied up.
func (f *Filters) grown(r *ring, to int) *ring {
	next := &ring{newest: r.newest, lay: &f.steps[to], step: to, slots: slices.Clone(r.slots), valid: r.valid}
	if r.words != nil {
		next.words = r.lay.copyUp(r.words, next.lay)
	}
	return next
}

// copyUp returns words (a ring of layout l) as a ring of the larger layout
// to: block i of l becomes blocks i·d to i·d+d-1 of to, d = to.blocks /
// l.blocks (a power of two).
func (l *layout) copyUp(words []uint64, to *layout) []uint64 {
	out := make([]uint64, len64(*to))
	d := to.blocks / l.blocks
	bw := l.blockWords
	for i := range l.blocks {
		src := words[i*bw : (i+1)*bw]
		for c := range d {
			copy(out[(i*d+c)*bw:], src)
		}
	}
	return out
}
