package engine

import (
	"context"

	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/tier/memory"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// refresh re-commits, in the current partition, the keys of a sliding
// namespace that this resolve found committed in an older one (d.slide;
// with a namespace window, every duplicate), with their digest and result,
// so their window counts from now. It runs while memory still holds the
// candidates' claims, so no other call of this process decides them
// meanwhile, and it is durable (the filter first, as for every write)
// before the call answers: a refresh lost in a crash could let a key that
// kept arriving expire under its last duplicate. The record is dated now, so
// whatever judges its age (a namespace window, one added later, the
// archive) counts from the last arrival; CommittedAt then tells the last
// refresh. A failure fails the call, as a claim's read
// failure does: every candidate is given back.
func (e *Engine) refresh(ctx context.Context, b *batch, ns *Namespace, out []Claim, d decision, now int64) error {
	var reqs []tier.Request
	var adds []shard.Fingerprint
	part := e.parts.Of(now)
	for q, j := range b.qidx {
		if !d.slide[j] {
			continue
		}
		i := b.cand[j]
		reqs = append(reqs, refreshRequest(&out[i], now))
		if out[i].CommittedAt != 0 {
			out[i].CommittedAt = now // the record it answers from, once this returns
		}
		if b.ans[q].Partition < part {
			adds = append(adds, d.fps[j])
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	if err := e.writeRefreshes(ctx, part, reqs, adds, nil); err != nil {
		return err
	}
	e.stats.refreshes.Add(uint64(len(reqs)))
	return nil
}

// refreshRequest is the re-commit of c, a duplicate the exact tier
// answered (its digest and result are the commit's), dated at its arrival
// at: every judge of a commit's age (a namespace window, one added later,
// the archive) counts from the last arrival.
func refreshRequest(c *Claim, at int64) tier.Request {
	return tier.Request{NS: c.ns.name, Key: c.Key, Digest: c.digest, Result: c.Result, At: at}
}

// writeRefreshes writes refresh records into partition part, with the
// callers' records writes (none: nil), in one durable write: ordered
// against Forgets, as commits are, and the filter of part told first of
// adds, the keys whose record is in an older partition (the current
// partition's filter already holds a key whose record is in it; each add
// counts in its keys).
func (e *Engine) writeRefreshes(ctx context.Context, part int64, reqs []tier.Request, adds []shard.Fingerprint, writes []Write) error {
	e.counts.RLock()
	defer e.counts.RUnlock()
	if h := hooks.BeforeDurable.Load(); h != nil {
		(*h)()
	}
	if e.local != nil && len(adds) > 0 {
		e.local.Add(adds, part)
	}
	st := make([]tier.Status, len(reqs))
	var err error
	if len(writes) > 0 {
		err = e.writer.CommitWith(ctx, part, reqs, writes, st)
	} else {
		err = e.exact.Commit(ctx, part, reqs, st)
	}
	if err != nil {
		e.stats.errors.Add(1)
		return e.tierError(err)
	}
	return nil
}

// touch refreshes, in memory-only, the committed entries that a sliding
// namespace's duplicates hit (res[i] Committed): each expires a window
// from now. Memory is the only record there.
func (e *Engine) touch(b *batch, ns *Namespace, n int, now int64) {
	fps := b.cfps[:0]
	for i := range n {
		if b.res[i].Status == tier.Committed {
			fps = append(fps, b.fps[i])
		}
	}
	if len(fps) > 0 {
		// Entries committed by this same call are current already: not
		// refreshes.
		e.stats.refreshes.Add(uint64(e.mem.Touch(fps, now, now+ns.cacheFor)))
	}
}

// deferRefresh is refresh for MarkBatch: the re-commits are written in the
// same durable write as the batch's New keys (commitSpans), so a batch
// pays one sync, not two. Each refreshed candidate keeps its memory claim
// (Keep) until that write: no other call of this process decides the key
// meanwhile, as with refresh, and MarkBatch answers only once the write is
// durable. The claim is then settled as a commit made at arrival (or
// dropped, if the write failed; MarkBatch then fails as a whole).
func (e *Engine) deferRefresh(b *batch, out []Claim, d decision, now int64) {
	for q, j := range b.qidx {
		if !d.slide[j] {
			continue
		}
		i := b.cand[j]
		out[i].refreshAt, out[i].refreshFrom = now, b.ans[q].Partition
		if out[i].CommittedAt != 0 {
			out[i].CommittedAt = now // the record it answers from, once MarkBatch returns
		}
		d.actions[j] = memory.Keep
	}
}

// refreshes is a MarkBatch's deferred refreshes (deferRefresh) that still
// hold their memory claims, pinned for the write that carries them.
type refreshes struct {
	idx    []int // the claims' indices
	fps    []shard.Fingerprint
	tokens []uint64
	reqs   []tier.Request
	from   []int64 // the partition each key's record was found in
}

// filterAdds returns the fingerprints the filter of partition part must
// add (writeRefreshes): those whose record is in an older partition.
func (r *refreshes) filterAdds(part int64) []shard.Fingerprint {
	var fps []shard.Fingerprint
	for j, p := range r.from {
		if p < part {
			fps = append(fps, r.fps[j])
		}
	}
	return fps
}

// pinRefreshes pins the memory claims of claims' deferred refreshes
// (memory.Table.Begin) and returns those still held. A claim whose lease
// ended meanwhile is left out: its refresh is not written (another call
// may own the key now, and a late re-commit could undo its Forget); its
// Duplicate stands, decided while the claim was held.
func (e *Engine) pinRefreshes(claims []Claim, now int64) *refreshes {
	var r *refreshes
	for i := range claims {
		if claims[i].refreshAt == 0 {
			continue
		}
		if r == nil {
			r = &refreshes{}
		}
		r.idx = append(r.idx, i)
		r.fps = append(r.fps, claims[i].fp)
		r.tokens = append(r.tokens, claims[i].token)
	}
	if r == nil {
		return nil
	}
	st := make([]tier.Status, len(r.idx))
	e.mem.Begin(r.fps, r.tokens, now, st)
	var lost []int // indices into r of the claims whose lease ended
	k := 0
	for j, i := range r.idx {
		if st[j] != tier.OK {
			lost = append(lost, j)
			continue
		}
		c := &claims[i]
		r.idx[k], r.fps[k], r.tokens[k] = i, r.fps[j], r.tokens[j]
		r.from = append(r.from, c.refreshFrom)
		r.reqs = append(r.reqs, refreshRequest(c, c.refreshAt))
		k++
	}
	if len(lost) > 0 {
		// Their claims go, if still theirs: a claim left to expire in
		// memory would count as a failed attempt at the next mark (with
		// MaxAttempts, a committed key answered Poison).
		fps, tokens := make([]shard.Fingerprint, len(lost)), make([]uint64, len(lost))
		for n, j := range lost {
			fps[n], tokens[n] = r.fps[j], r.tokens[j]
		}
		dropClaims(e, fps, tokens)
	}
	r.idx, r.fps, r.tokens = r.idx[:k], r.fps[:k], r.tokens[:k]
	if k == 0 {
		return nil
	}
	return r
}

// dropClaims removes the memory claims tokens hold (Settle Drop); a key
// another call holds now is left alone.
func dropClaims(e *Engine, fps []shard.Fingerprint, tokens []uint64) {
	actions := make([]memory.Action, len(fps))
	for j := range actions {
		actions[j] = memory.Drop
	}
	e.mem.Settle(fps, tokens, actions, make([]int64, len(fps)), make([]tier.Digest, len(fps)), nil)
}

// finish ends the pinned refreshes once their write is known: written,
// each claim becomes a committed entry, as a commit made at its arrival;
// not written, each claim is dropped (the call fails, and answers
// nothing). It clears the requests' references to the caller's keys.
func (r *refreshes) finish(e *Engine, claims []Claim, written bool) {
	n := len(r.idx)
	ok := make([]bool, n)
	expires := make([]int64, n)
	digests := make([]tier.Digest, n)
	var results [][]byte
	for j, i := range r.idx {
		c := &claims[i]
		ok[j], expires[j], digests[j] = written, c.ns.cacheUntil(c.refreshAt), c.digest
		if len(c.Result) > 0 {
			if results == nil {
				results = make([][]byte, n)
			}
			results[j] = c.Result
		}
	}
	e.mem.FinishResults(r.fps, r.tokens, ok, expires, digests, results, claims[r.idx[0]].refreshAt)
	if !written {
		dropClaims(e, r.fps, r.tokens)
	} else {
		e.stats.refreshes.Add(uint64(n))
	}
	clear(r.reqs)
}

// dropRefreshes gives back the memory claims of claims' deferred refreshes
// that no write carried (MarkBatch failed before its commit).
func (e *Engine) dropRefreshes(claims []Claim) {
	var fps []shard.Fingerprint
	var tokens []uint64
	for i := range claims {
		if claims[i].refreshAt != 0 {
			fps, tokens = append(fps, claims[i].fp), append(tokens, claims[i].token)
		}
	}
	if len(fps) > 0 {
		dropClaims(e, fps, tokens)
	}
}
