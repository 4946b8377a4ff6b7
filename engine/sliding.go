package engine

import (
	"context"

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
// kept arriving expire under its last duplicate. With a namespace window
// the record is dated now (the window counts from its time); otherwise it
// keeps its commit's time. A failure fails the call, as a claim's read
// failure does: every candidate is given back.
func (e *Engine) refresh(ctx context.Context, b *batch, ns *Namespace, out []Claim, d decision, now int64) error {
	var reqs []tier.Request
	var fps []shard.Fingerprint
	for q, j := range b.qidx {
		if !d.slide[j] {
			continue
		}
		i := b.cand[j]
		at := b.ans[q].At
		if ns.window > 0 || at == 0 {
			at = now
		}
		reqs = append(reqs, tier.Request{NS: ns.name, Key: out[i].Key, Digest: d.digests[j], Result: out[i].Result, At: at})
		fps = append(fps, d.fps[j])
	}
	if len(reqs) == 0 {
		return nil
	}
	part := e.parts.Of(now)
	e.counts.RLock() // ordered against Forgets, as commits are
	defer e.counts.RUnlock()
	if h := beforeDurable.Load(); h != nil {
		(*h)()
	}
	if e.local != nil {
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
		e.mem.Touch(fps, now, now+ns.cacheFor)
		e.stats.refreshes.Add(uint64(len(fps)))
	}
}
