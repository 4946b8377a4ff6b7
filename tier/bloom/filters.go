package bloom

import (
	"errors"
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// ErrOptions reports invalid Options.
var ErrOptions = errors.New("bloom: invalid options")

// MaxK bounds the hash count; a target false-positive rate of 10⁻⁹ per filter
// needs 30.
const MaxK = 32

// DefaultExpectedKeys is the per-partition key count filters are sized for
// when Options leave it zero.
const DefaultExpectedKeys = 10_000_000

// DefaultFalsePositive is the whole-window false-positive target when
// Options leave it zero. In the default configuration a false positive costs
// one disk read, not a wrong answer.
const DefaultFalsePositive = 0.01

// Options size the filters.
type Options struct {
	// Partitions is the retention partitioning; required.
	Partitions tier.Partitions
	// ExpectedKeys is the number of keys one partition is expected to hold.
	// Zero means DefaultExpectedKeys.
	ExpectedKeys int
	// FalsePositive is the target probability that a key absent from the
	// whole window is reported as maybe present by any live filter, in
	// (0, 1). Zero means DefaultFalsePositive. Each of the Live filters is
	// sized for 1-(1-FalsePositive)^(1/Live), about FalsePositive/Live.
	FalsePositive float64
	// Grow starts the filters at a small fraction of the size ExpectedKeys
	// asks for and grows them as their partitions receive keys (see
	// growth.go): ExpectedKeys becomes the ceiling. Only filters whose
	// snapshots may be refused for their size use it (a cache of an exact
	// store, which rebuilds them): growing rounds the full size up to a
	// multiple of its steps, so a snapshot of the same ExpectedKeys
	// written without Grow has other parameters.
	Grow bool
}

// Validate reports every invalid field at once.
func (o *Options) Validate() error {
	var errs []error
	if o.Partitions.Length <= 0 || o.Partitions.Live < 1 || o.Partitions.Live > tier.MaxLive {
		errs = append(errs, fmt.Errorf("%w: Partitions %+v", ErrOptions, o.Partitions))
	}
	if o.ExpectedKeys < 0 {
		errs = append(errs, fmt.Errorf("%w: ExpectedKeys %d is negative", ErrOptions, o.ExpectedKeys))
	}
	if fp := o.FalsePositive; fp != 0 && len(errs) == 0 {
		if err := CheckFalsePositive(fp, max(o.ExpectedKeys, 1), o.Partitions.Live); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrOptions, err))
		}
	} else if fp != 0 && !(fp > 0 && fp < 1) {
		errs = append(errs, fmt.Errorf("%w: FalsePositive %v is outside (0, 1)", ErrOptions, fp))
	}
	return errors.Join(errs...)
}

// Probe is the answer for one key (tier.Probe): bit i of Maybe set means
// partition Oldest+i may hold it. Zero Maybe means no live filter holds it.
type Probe = tier.Probe

// Filters is a ring of per-partition Bloom filters stored interleaved (see
// the package documentation): one probe reads the bits of every live
// partition at once. It is safe for concurrent use: probes and adds read the
// current ring without locking, and writers (rotation, a new partition's
// filter, restore) publish a new ring.
type Filters struct {
	parts tier.Partitions
	lay   layout   // the full size (ExpectedKeys)
	perFP float64  // per-filter false-positive target
	over  int64    // keys at which the formula's rate passes 2 × perFP
	steps []layout // the sizes a ring may have, smallest first; the last is lay
	// growAt[i] is the add count of one filter at which a ring of size
	// steps[i] grows (growth.go); the last is never reached.
	growAt []int64

	mu   sync.Mutex           // serialises writers of cur
	cur  atomic.Pointer[ring] // read without mu; replaced, never modified, under mu
	_pad [64]byte             // keep writers' cache line away from readers'
}

// ring is an immutable view of the live filters. Measured: a RWMutex here
// cost 7 % of the default configuration's CPU on two cores, its reader count
// bouncing between them. Only the bits in words and the busy counts change
// in place (atomically): adds set the bits, and rotation clears a dropped
// partition's slot before any later partition is given it.
//
// busy counts the adds writing through this ring, striped so that adds on
// two cores rarely share a counter's cache line. A writer that replaces the
// ring waits for them (publish): once it holds mu after a publish, no add
// writes through any ring but the current one. That is what lets rotation
// clear a dropped slot, and a merge copy the words, without an add of the
// dropped partition (or one straddling the copy) writing after them.
type ring struct {
	newest int64
	lay    *layout   // the ring's size: one of Filters.steps
	step   int       // its index in Filters.steps
	words  []uint64  // the interleaved filters; nil until a filter is first written
	slots  []*filter // slots[slot(p)]: the partition whose bits lane bit slot(p) holds, nil if none
	valid  uint64    // bit s set: slots[s] is a live partition of this ring
	// copying marks the ring published while a merge copies words into
	// the ring that replaces it: adds wait for the merge (on mu) and start
	// again on the new ring.
	copying bool
	busy    [busyStripes]busyCount
}

const busyStripes = 8

type busyCount struct {
	n atomic.Int64
	_ [56]byte
}

// publish makes next the current ring and waits until no add still writes
// through the ring it replaced. f.mu must be held. An add counts itself on
// its ring before it checks that the ring is still current (Add), and
// publish swaps the ring before it reads the counts: with both atomic, an
// add either sees the new ring and starts again, or is seen and waited for.
func (f *Filters) publish(next *ring) {
	old := f.cur.Swap(next)
	for i := range old.busy {
		for old.busy[i].n.Load() != 0 {
			runtime.Gosched()
		}
	}
}

type filter struct {
	part int64
	adds atomic.Int64
	// checked and fps are Observe's counts of the current measuring
	// generation, prevChecked and prevFPs the last full one's (see
	// MeasureGeneration); warned is set once the filter was reported over
	// its target (Observe, Overfilled).
	checked, fps, prevChecked, prevFPs atomic.Uint64
	turning, warned                    atomic.Bool
	// keys is what the last growth rebuilds the filter from (growth.go):
	// every fingerprint added to it while the ring is below its full
	// size, in the order added, while logState is logging. A filter whose
	// log was dropped, or that holds a file's bits the log does not
	// account for, is copied up instead.
	keysMu   sync.Mutex
	keys     []shard.Fingerprint
	logState logState
	// inherited is set when a growth copied the filter's bits up without
	// its log (PartitionStats.Inherited).
	inherited atomic.Bool
}

// New returns empty Filters whose newest partition is newest.
func New(opts *Options, newest int64) (*Filters, error) {
	if opts == nil {
		return nil, fmt.Errorf("%w: nil options", ErrOptions)
	}
	o := *opts
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.ExpectedKeys == 0 {
		o.ExpectedKeys = DefaultExpectedKeys
	}
	if o.FalsePositive == 0 {
		o.FalsePositive = DefaultFalsePositive
	}
	sz := Sizing(o.ExpectedKeys, o.FalsePositive, o.Partitions.Live)
	f := &Filters{parts: o.Partitions, lay: newLayout(o.Partitions.Live, sz.M, sz.K), perFP: sz.PerFilter}
	f.setSteps(o.Grow, o.ExpectedKeys)
	f.over = f.lay.overfullKeys(f.perFP)
	f.cur.Store(&ring{newest: newest, lay: &f.steps[0], slots: make([]*filter, o.Partitions.Live)})
	return f, nil
}

// Params returns bits per filter, hashes per key and the per-filter
// false-positive target.
func (f *Filters) Params() (m uint64, k int, perFilter float64) { return f.lay.m, f.lay.k, f.perFP }

// Bytes returns the memory held by the filters' ring: the whole ring once
// any filter has been written, nothing before. LogBytes is the memory of
// their key logs besides.
func (f *Filters) Bytes() int64 { return int64(len(f.cur.Load().words)) * 8 }

// LogBytes returns the memory of the keys the filters logged while the
// ring is below its full size (growth.go): 16 B a key the newest
// partition's filter took, at most about a sixteenth of its capacity at
// the ring's current size; nothing once the ring is full.
func (f *Filters) LogBytes() int64 {
	var n int64
	for _, fl := range f.cur.Load().slots {
		if fl != nil {
			fl.keysMu.Lock()
			n += int64(cap(fl.keys)) * int64(unsafe.Sizeof(shard.Fingerprint{}))
			fl.keysMu.Unlock()
		}
	}
	return n
}

// FullBytes returns the memory the filters take at their full size
// (ExpectedKeys): Bytes once they have grown to it.
func (f *Filters) FullBytes() int64 { return int64(len64(f.lay)) * 8 }

// newestPartition returns the newest partition.
func (f *Filters) newestPartition() int64 { return f.cur.Load().newest }

// Rotate makes p the newest partition, dropping the filters that fall out of
// the window. A p at or below the newest partition changes nothing, so a
// clock that steps back never drops a filter early. It returns the number of
// filters dropped.
func (f *Filters) Rotate(p int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rotateLocked(p)
}

// rotateLocked publishes the ring of newest p and clears the slots of the
// dropped filters. Probes still holding the previous ring may see a dropped
// partition's bits vanish while it is cleared: that partition is out of the
// window for every later reading of the clock. The slot is given to a later
// partition only after it is clear, so no key of a live partition is ever
// cleared.
func (f *Filters) rotateLocked(p int64) int {
	r := f.cur.Load()
	if p <= r.newest {
		return 0
	}
	next := &ring{newest: p, lay: r.lay, step: r.step, words: r.words, slots: slices.Clone(r.slots)}
	oldest := f.parts.Oldest(p)
	var dropped uint64
	for s, fl := range next.slots {
		if fl != nil && fl.part < oldest {
			next.slots[s] = nil
			dropped |= 1 << s
		}
	}
	next.valid = r.valid &^ dropped
	f.publish(next) // no add of a dropped partition writes after this
	next.lay.clear(next.words, dropped)
	return bits.OnesCount64(dropped)
}

// Test probes each key against every live filter; out must have len(fps).
// It does not allocate.
func (f *Filters) Test(fps []shard.Fingerprint, out []Probe) (oldest int64) {
	r := f.cur.Load()
	oldest = f.parts.Oldest(r.newest)
	if r.valid == 0 {
		clear(out[:len(fps)])
		return oldest
	}
	s0 := uint(f.slot(oldest))
	live := uint(f.parts.Live)
	all := uint64(1)<<live - 1
	if live == 64 {
		all = ^uint64(0)
	}
	for i := range fps {
		acc := r.lay.test(r.words, fps[i], r.valid)
		// Lane bit s is partition oldest+(s-s0) mod live.
		out[i] = Probe{Maybe: (acc>>s0 | acc<<(live-s0)) & all}
	}
	return oldest
}

// Add records keys in partition p. A p older than the window is ignored; a p
// newer than the newest rotates first.
//
// The add counts itself on the ring it writes through, then checks that the
// ring is still current: if a writer replaced it, the add starts again on
// the new one (where a dropped p is no longer live), and a writer that
// replaced it after the check waits for the add to finish (publish). A ring
// being copied by a merge makes the add wait for the merge.
func (f *Filters) Add(fps []shard.Fingerprint, p int64) {
	if len(fps) == 0 {
		return
	}
	for {
		r := f.cur.Load()
		if r.copying {
			f.mu.Lock() // the merge holds mu until it publishes
			f.mu.Unlock()
			continue
		}
		fl := r.filter(f, p)
		if fl == nil {
			if r, fl = f.create(p); fl == nil {
				return
			}
		}
		if n := fl.adds.Load() + int64(len(fps)); n >= f.growAt[r.step] {
			f.grow(fl, p, n) // before the keys land in a ring too small for them
			if f.cur.Load() != r {
				continue
			}
		}
		busy := &r.busy[fps[0].Lo%busyStripes].n
		busy.Add(1)
		if f.cur.Load() != r {
			busy.Add(-1)
			continue
		}
		if r.step < len(f.steps)-1 {
			fl.log(fps) // before its bits: a growth that waited for this add finds them
		}
		bit := uint64(1) << f.slot(p)
		for i := range fps {
			r.lay.add(r.words, fps[i], bit)
		}
		busy.Add(-1)
		fl.adds.Add(int64(len(fps)))
		return
	}
}

// filter returns partition p's filter, or nil if it is not live or not yet
// allocated.
func (r *ring) filter(f *Filters, p int64) *filter {
	if p > r.newest || p < f.parts.Oldest(r.newest) {
		return nil
	}
	fl := r.slots[f.slot(p)]
	if fl == nil || fl.part != p {
		return nil
	}
	return fl
}

// create rotates to p if it is newer and gives p its slot if it is live,
// publishing a new ring.
func (f *Filters) create(p int64) (*ring, *filter) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rotateLocked(p)
	r := f.cur.Load()
	if fl := r.filter(f, p); fl != nil {
		return r, fl
	}
	if p < f.parts.Oldest(r.newest) {
		return r, nil
	}
	fl := &filter{part: p}
	if p < r.newest {
		fl.logState = dropped // an older partition's: see below
	}
	next := f.assign(r, fl)
	for _, fl := range next.slots {
		if fl != nil && fl.part < p {
			// An older partition takes few keys from now on: its bits
			// copied up at the last growth stay far below its target, and
			// its log would only hold memory (growth.go).
			fl.dropLog()
		}
	}
	f.publish(next)
	return next, next.slots[f.slot(p)]
}

// assign returns a copy of r with fl in its partition's slot (whose bits
// are clear: a slot is cleared when its partition is dropped), allocating the
// ring's words on first use.
func (f *Filters) assign(r *ring, fl *filter) *ring {
	next := &ring{newest: r.newest, lay: r.lay, step: r.step, words: r.words, slots: slices.Clone(r.slots), valid: r.valid}
	if next.words == nil {
		next.words = make([]uint64, len64(*next.lay))
	}
	s := f.slot(fl.part)
	next.slots[s] = fl
	next.valid |= 1 << s
	return next
}

func (f *Filters) slot(p int64) int64 {
	live := int64(f.parts.Live)
	return (p%live + live) % live
}

// Reset drops every filter; the engine calls it before rebuilding from the
// durable tier.
func (f *Filters) Reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.cur.Load()
	f.publish(&ring{newest: r.newest, lay: r.lay, step: r.step, slots: make([]*filter, len(r.slots))})
}

// EstimatedFalsePositive returns the theoretical whole-window false-positive
// rate of the filters as filled now: each filter's rate in the blocked
// layout (blockedFP) from the keys added to it, combined over the live
// filters.
func (f *Filters) EstimatedFalsePositive() float64 {
	none := 1.0
	r := f.cur.Load()
	for _, fl := range r.slots {
		if fl == nil || fl.part < f.parts.Oldest(r.newest) {
			continue
		}
		none *= 1 - r.lay.fp(float64(fl.adds.Load()))
	}
	return 1 - none
}
