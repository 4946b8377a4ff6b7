package engine

import (
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// decideAll decides, into d, each candidate the exact tier answered
// (b.ans[q] for request q).
func (e *Engine) decideAll(d decision, b *batch, ns *Namespace, out []Claim, c *tally, now int64, p purpose, proves bool) error {
	for q, j := range b.qidx {
		a := &b.ans[q]
		if a.Expired {
			c.leaseExpiries++
		}
		if err := e.decide(d, j, &out[b.cand[j]], a, b.reqs[q].Token, b.res[b.cand[j]].Attempts, b.marks[j], ns, c, now, p, proves); err != nil {
			return err
		}
		other := a.Status == tier.Held || a.Status == tier.Committed && a.Token != b.reqs[q].Token
		if a.Unsettled || b.marks[j] && other {
			// The mark's first message may still commit the key later: the
			// key's next call adopts that commit (tier.Answer.Unsettled).
			// A retry that found the key another's adopted nothing: the
			// earlier calls' messages may still land, so the memory it
			// took stays.
			cl := &out[b.cand[j]]
			e.retries.remember([]shard.Fingerprint{cl.fp}, []uint64{cl.firstToken()}, []int64{now + e.window}, nil, []bool{true}, now)
		}
	}
	return nil
}

// decide answers one candidate j (claim cl, memory's attempt count
// memAttempts) from the exact tier's answer a to the request that carried
// token; retried reports a retry of a mark whose reply was lost.
func (e *Engine) decide(d decision, j int, cl *Claim, a *tier.Answer, token tier.Token, memAttempts uint16, retried bool, ns *Namespace, c *tally, now int64, p purpose, proves bool) error {
	switch a.Status {
	case tier.Absent:
		cl.Outcome = New
		if proves {
			c.bloomFalsePositives++
		}
	case tier.Acquired:
		cl.Outcome = New
		d.attempts[j], cl.attempts = a.Attempts, a.Attempts
		if p == forMarkInTier {
			// Committed by the tier in the same step.
			d.commit(j, now+ns.cacheFor, cl.digest)
			c.commits++
		}
	case tier.Released:
		// Not committed, but its claims failed before: the stored count,
		// or this process's if higher, decides Poison.
		cl.Outcome = New
		if e.maxAttempts == 0 {
			return nil
		}
		d.attempts[j] = max(a.Attempts, memAttempts)
		if int(d.attempts[j]) >= e.maxAttempts {
			cl.Outcome = Poison
			d.actions[j], d.expires[j] = memory.Poison, e.parts.Expiry(a.Partition)
		}
	case tier.Poisoned:
		// Its attempts, by any process, reached MaxAttempts.
		cl.Outcome = Poison
		d.actions[j], d.attempts[j] = memory.Drop, a.Attempts
	case tier.Held:
		cl.Outcome = InFlight
		d.actions[j] = memory.Drop
	case tier.Committed:
		e.decideCommitted(d, j, cl, a, token, retried, ns, c, now, p)
	default:
		return fmt.Errorf("%w: exact tier answered %v", ErrStorage, a.Status)
	}
	return nil
}

// decideCommitted answers a candidate the exact tier holds committed:
// New again past its namespace's window, New for the retry of a mark whose
// reply was lost, Duplicate or Conflict otherwise (cached in memory when
// the tier dates the commit).
func (e *Engine) decideCommitted(d decision, j int, cl *Claim, a *tier.Answer, token tier.Token, retried bool, ns *Namespace, c *tally, now int64, p purpose) {
	if ns.expired(a.Partition, a.At, now) {
		// Older than the namespace's own window: the key is new again, and
		// its commit will write a newer record.
		cl.Outcome = New
		return
	}
	if a.Token == token && (retried || p == forMarkInTier) {
		// The commit of a mark whose reply was lost: the caller never
		// learnt it was New, so it still is. A mark's token is this
		// call's own, so a commit carrying it is this call's even when
		// the call did not fail: the client retried the command itself
		// after losing the reply of an attempt the server applied.
		cl.Outcome = New
		if p == forMarkInTier {
			// This mark's retry: committed, as a mark is.
			d.commit(j, now+ns.cacheFor, cl.digest)
			c.commits++
		} else {
			// A claim: its commit finds its own and succeeds; its release
			// must undo the commit, or a message never processed would
			// stay a duplicate.
			cl.undo = true
		}
		return
	}
	c.storeHits++
	cl.Outcome = Duplicate
	if conflicts(cl.digest, a.Digest) {
		cl.Outcome = Conflict
	}
	d.digests[j], cl.digest = a.Digest, a.Digest
	if a.Result != nil {
		cl.Result, cl.CommittedAt = a.Result, a.At
	}
	d.actions[j] = memory.Drop
	if a.Partition >= 0 && ns.refreshes(a.Partition, now) {
		// Re-committed in the current partition before the call answers
		// (refresh), and cached as a commit made now.
		d.slide[j] = true
		if a.Result == nil {
			d.actions[j], d.expires[j] = memory.Commit, ns.cacheUntil(now)
		}
		return
	}
	if a.Partition >= 0 && a.Result == nil {
		// Cached until its partition expires, or the namespace's window
		// ends. A tier that cannot date the commit (another process's, in a
		// shared tier) is not cached: memory must never outlive it. Nor is
		// a commit with a result: the tier answers with it.
		d.actions[j], d.expires[j] = memory.Commit, e.parts.Expiry(a.Partition)
		if ns.window > 0 {
			at := a.At
			if at == 0 {
				at = (a.Partition + 1) * e.parts.Length
			}
			d.expires[j] = min(d.expires[j], at+ns.window)
		}
		if ns.sliding {
			d.expires[j] = min(d.expires[j], ns.cacheUntil(now))
		}
	}
}
