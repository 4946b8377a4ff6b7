package engine

import (
	"context"

	"github.com/tierdedup/tierdedup/internal/hooks"

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
	var fps []shard.Fingerprint
	part := e.parts.Of(now)
	for q, j := range b.qidx {
		if !d.slide[j] {
			continue
		}
		i := b.cand[j]
		// Dated now: every judge of a commit's age (a namespace window,
		// one added later, the archive) counts from its last arrival.
		reqs = append(reqs, tier.Request{NS: ns.name, Key: out[i].Key, Digest: d.digests[j], Result: out[i].Result, At: now})
		if out[i].CommittedAt != 0 {
			out[i].CommittedAt = now // the record it answers from, once this returns
		}
		if b.ans[q].Partition < part {
			// The current partition's filter already holds a key whose
			// record is in it.
			fps = append(fps, d.fps[j])
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	e.counts.RLock() // ordered against Forgets, as commits are
	defer e.counts.RUnlock()
	if h := hooks.BeforeDurable.Load(); h != nil {
		(*h)()
	}
	if e.local != nil && len(fps) > 0 {
		e.local.Add(fps, part)
	}
	if err := e.exact.Commit(ctx, part, reqs, make([]tier.Status, len(reqs))); err != nil {
		e.stats.errors.Add(1)
		return e.tierError(err)
	}
	e.stats.refreshes.Add(uint64(len(reqs)))
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
