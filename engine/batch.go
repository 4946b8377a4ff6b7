package engine

import (
	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// batch is the scratch space of one call, pooled so that steady-state calls
// allocate nothing per key.
type batch struct {
	fps      []shard.Fingerprint
	tokens   []uint64
	res      []memory.Result
	cand     []int // indices of the keys being decided or committed
	cfps     []shard.Fingerprint
	ctokens  []uint64
	probes   []bloom.Probe
	actions  []memory.Action
	ok       []bool
	expires  []int64
	digests  []tier.Digest
	attempts []uint16
	errs     []error
	marks    []bool
	st       []tier.Status
	queries  []pebble.Query
	qidx     []int
	hits     []pebble.Hit
	recs     []pebble.Record
	claims   []Claim
	rreqs    []redis.Request
	rres     []redis.Result
	rst      []tier.Status
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
			expires: make([]int64, c), digests: make([]tier.Digest, c), attempts: make([]uint16, c), errs: make([]error, c), marks: make([]bool, c), st: make([]tier.Status, c),
			queries: make([]pebble.Query, 0, c), qidx: make([]int, 0, c), hits: make([]pebble.Hit, c),
			recs: make([]pebble.Record, c), claims: make([]Claim, c),
			rreqs: make([]redis.Request, c), rres: make([]redis.Result, c), rst: make([]tier.Status, c),
		}
	}
	b.fps, b.tokens, b.res = b.fps[:n], b.tokens[:n], b.res[:n]
	return b
}

func (e *Engine) putBatch(b *batch) {
	clear(b.queries[:cap(b.queries)]) // drop references to caller keys
	clear(b.claims[:cap(b.claims)])
	clear(b.errs[:cap(b.errs)])
	e.scratch.Put(b)
}
