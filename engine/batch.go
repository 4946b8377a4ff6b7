package engine

import (
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// batch is the scratch space of one call, pooled so that steady-state calls
// allocate nothing per key.
type batch struct {
	// Per key of the call.
	fps    []shard.Fingerprint
	tokens []uint64
	res    []memory.Result
	// Per key being decided or committed: cand[j] is its index in the call.
	cand     []int
	cfps     []shard.Fingerprint
	ctokens  []uint64
	probes   []bloom.Probe
	actions  []memory.Action
	ok       []bool
	expires  []int64
	digests  []tier.Digest
	attempts []uint16
	marks    []bool
	slide    []bool
	st       []tier.Status
	results  [][]byte
	// Per key sent to the exact tier: qidx[q] is its index in cand (or, in
	// a release, in the call).
	reqs []tier.Request
	ans  []tier.Answer
	qidx []int
	// MarkBatch's own claims and their commit errors.
	claims []Claim
	errs   []error
	// A merged commit's New claims per span, before and after fencing,
	// and the records it writes.
	news, kept []int
	writes     []Write
	// repeats maps each repeat of a key in the call to its first
	// occurrence (repeatsOf); first is its scratch. Kept with the batch,
	// so that finding repeats allocates nothing in steady state.
	repeats map[int]int
	first   map[shard.Fingerprint]int
	n       int // keys of the call using it
}

// repeatsOf maps the index of each repeat of a key in fps to its first
// occurrence; empty when no key repeats. Small batches are scanned
// pairwise, larger ones through a map. The result is b's until the next
// call.
func (b *batch) repeatsOf(fps []shard.Fingerprint) map[int]int {
	if b.repeats == nil {
		b.repeats = map[int]int{}
	}
	clear(b.repeats)
	if len(fps) <= 16 {
		for i := 1; i < len(fps); i++ {
			for j := range i {
				if fps[j] == fps[i] {
					b.repeats[i] = j
					break
				}
			}
		}
		return b.repeats
	}
	if b.first == nil {
		b.first = make(map[shard.Fingerprint]int, len(fps))
	}
	clear(b.first)
	for i, fp := range fps {
		if j, ok := b.first[fp]; ok {
			b.repeats[i] = j
			continue
		}
		b.first[fp] = i
	}
	return b.repeats
}

func (e *Engine) getBatch(n int) *batch {
	b, _ := e.scratch.Get().(*batch)
	if b == nil {
		b = &batch{}
	}
	if cap(b.fps) < n {
		c := max(n, 256)
		*b = batch{
			fps: make([]shard.Fingerprint, c), tokens: make([]uint64, c), res: make([]memory.Result, c),
			cand: make([]int, 0, c), cfps: make([]shard.Fingerprint, c), ctokens: make([]uint64, c),
			probes: make([]bloom.Probe, c), actions: make([]memory.Action, c), ok: make([]bool, c),
			expires: make([]int64, c), digests: make([]tier.Digest, c), attempts: make([]uint16, c),
			marks: make([]bool, c), slide: make([]bool, c), st: make([]tier.Status, c), results: make([][]byte, c),
			reqs: make([]tier.Request, 0, c), ans: make([]tier.Answer, c), qidx: make([]int, 0, c),
			claims: make([]Claim, c), errs: make([]error, c),
		}
	}
	b.fps, b.tokens, b.res = b.fps[:n], b.tokens[:n], b.res[:n]
	b.n = n
	return b
}

// fingerprints hashes keys in namespace name into b.fps and, with claims,
// gives each key a fresh claim token in b.tokens.
func (e *Engine) fingerprints(b *batch, name string, keys [][]byte, claims bool) {
	for i, k := range keys {
		b.fps[i] = shard.Sum(e.hasher, name, k)
	}
	if claims {
		n := uint64(len(keys))
		first := e.tokens.Add(n) - n + 1
		for i := range keys {
			b.tokens[i] = first + uint64(i)
		}
	}
}

// candidates copies the fingerprints of the keys b.cand names into
// b.cfps and returns them.
func (b *batch) candidates() []shard.Fingerprint {
	cfps := b.cfps[:len(b.cand)]
	for j, i := range b.cand {
		cfps[j] = b.fps[i]
	}
	return cfps
}

// filterMasks sets probes[j].Maybe to the live partitions the exact tier
// may hold the key of cfps[j] in, and returns the partition the masks
// count from and whether a zero mask proves the key absent: the local
// store's filters when there are some (see tier.Filters.Masks, which
// answers "no" only while they are warm), every live partition otherwise.
func (e *Engine) filterMasks(cfps []shard.Fingerprint, probes []bloom.Probe) (oldest int64, proves bool) {
	if e.local == nil {
		return e.allLive(probes[:len(cfps)]), false
	}
	return e.local.Masks(cfps, probes)
}

// allLive sets every probe to name every live partition, and returns the
// oldest.
func (e *Engine) allLive(probes []bloom.Probe) (oldest int64) {
	return tier.AllLive(e.parts, e.current.Load(), probes)
}

func (e *Engine) putBatch(b *batch) {
	// Drop references to the caller's keys: no call uses more than its n
	// entries (the capacity may be a far larger call's).
	clear(b.reqs[:b.n])
	clear(b.claims[:b.n])
	clear(b.errs[:b.n])
	clear(b.writes[:cap(b.writes)])
	b.writes = b.writes[:0]
	e.scratch.Put(b)
}
