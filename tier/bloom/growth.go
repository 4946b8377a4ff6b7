package bloom

import (
	"math"
	"runtime/debug"
	"slices"

	"github.com/tierdedup/tierdedup/shard"
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
// What copying cannot do is thin the bits already set: a block's copies
// also hold its sibling's keys, so a grown ring keeps the fraction of its
// bits the smaller one had set, and through seven doublings these added
// up to about a fifth of a partition's capacity (2.5 times the per-filter
// target at capacity). That matters only for a filter that goes on
// filling after the growth: the newest partition's. So the newest
// partition's filter logs the fingerprints added to it while the ring is
// below its full size (filter.keys, 16 B a key, at most about
// 1/growEarly of its capacity plus a batch an adder), and the growth to
// the full size builds it anew from them, as if it had been full size
// from the start, then drops the log. A filter stops logging, and drops
// its log, when a newer partition's filter is created: from then on its
// partition takes few keys, and its copied bits stay far below its target
// (a filter at the growth holds at most 1/growEarly of its keys, plus what
// it inherited: at most about a fifth of its capacity). Growths below the
// full size copy every filter up.
//
// A filter whose bits came from a file (place: a snapshot, a sealed
// partition or checkpoint read at a smaller size) has no log either, and
// is copied up; if it is the newest partition's and fills on, it misses
// its target as before (2.5 times at capacity after seven doublings). It
// is reported Inherited (PartitionStats), so that the engine's warning
// does not ask for a larger ExpectedKeys, and meets its target once it
// leaves the window. Measured (TestGrowthKeepsTheRate, three doublings): a
// partition filled through the growths meets its per-filter target at
// capacity (1.0 times; 1.6 copied), as does one that opens after the last
// growth.
//
// Each growth copies (or, the last, rebuilds) the ring while adds wait
// (probes go on): a ring of the default size (≈ 150 MiB) grows from about
// a MiB through seven doublings, the last from 74 MiB into 148 and about
// 312k logged keys. After one that replaces a
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
// on the grown ring (Add). fl is partition p's filter the count was read
// from: if the current ring no longer holds it (a Reset or a snapshot
// read replaced the filters), the count is stale and nothing grows.
func (f *Filters) grow(fl *filter, p int64, adds int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.cur.Load()
	if cur.filter(f, p) != fl {
		return // the caller starts again on the current ring
	}
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
// loads) at step to, its blocks copied up. Growing to the full size, a
// filter whose keys are logged is built anew from them instead, as if it
// had been that size from the start (when every live filter is logged,
// nothing is copied), and the logs are dropped: no growth follows. Below
// the full size the inherited bits are left: a filter there holds at most
// 1/growEarly of its keys, far below its target, and the last growth
// rebuilds it from all its keys. No add may write r's words or log a key
// meanwhile (the caller holds mu, and r is either not yet published or
// replaced by a marker).
func (f *Filters) grown(r *ring, to int) *ring {
	next := &ring{newest: r.newest, lay: &f.steps[to], step: to, slots: slices.Clone(r.slots), valid: r.valid}
	if r.words == nil {
		return next
	}
	full := to == len(f.steps)-1
	if !full {
		next.words = r.lay.copyUp(r.words, next.lay)
		return next
	}
	var logged uint64
	for s, fl := range next.slots {
		if fl == nil || r.valid>>s&1 == 0 {
			continue
		}
		switch fl.state() {
		case logging:
			logged |= 1 << s
		case fromFile:
			fl.inherited.Store(true) // a file's bits copied up, below
		}
	}
	if logged == r.valid {
		next.words = make([]uint64, len64(*next.lay))
	} else {
		next.words = r.lay.copyUp(r.words, next.lay)
		next.lay.clear(next.words, logged)
	}
	for s, fl := range next.slots {
		if logged>>s&1 == 1 {
			fl.replay(next.lay, next.words, 1<<s)
		}
		if fl != nil {
			fl.dropLog()
		}
	}
	return next
}

// logState is what a filter's key log accounts for.
type logState uint8

const (
	// logging: every key whose bits the filter holds is in its log.
	logging logState = iota
	// dropped: no log (its partition is no longer the newest, or the ring
	// is full), and every bit is its own keys'.
	dropped
	// fromFile: no log, and bits a file brought (place), perhaps copied
	// up from a smaller size.
	fromFile
)

// log records fps as added to the filter while it is logging.
func (fl *filter) log(fps []shard.Fingerprint) {
	fl.keysMu.Lock()
	if fl.logState == logging {
		fl.keys = append(fl.keys, fps...)
	}
	fl.keysMu.Unlock()
}

// state returns the filter's log state.
func (fl *filter) state() logState {
	fl.keysMu.Lock()
	defer fl.keysMu.Unlock()
	return fl.logState
}

// placed drops the filter's log for a file's bits it now holds.
func (fl *filter) placed() {
	fl.keysMu.Lock()
	fl.keys, fl.logState = nil, fromFile
	fl.keysMu.Unlock()
}

// dropLog drops the filter's log, unless a file's bits already did: its
// partition is no longer the newest, or the ring is full.
func (fl *filter) dropLog() {
	fl.keysMu.Lock()
	fl.keys = nil
	if fl.logState == logging {
		fl.logState = dropped
	}
	fl.keysMu.Unlock()
}

// replay sets the logged keys' bits in words (of layout l, not shared
// yet) in the lane of bit.
func (fl *filter) replay(l *layout, words []uint64, bit uint64) {
	fl.keysMu.Lock()
	defer fl.keysMu.Unlock()
	for _, fp := range fl.keys {
		l.setPlain(words, fp, bit)
	}
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
