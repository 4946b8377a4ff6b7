package engine

import (
	"bytes"
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

func (e *Engine) checkKeys(keys [][]byte) error {
	for i, k := range keys {
		switch {
		case len(k) == 0:
			return &KeyError{Index: i, Len: 0, Err: ErrEmptyKey}
		case len(k) > e.maxKey:
			return &KeyError{Index: i, Len: len(k), Err: ErrKeyTooLong}
		}
	}
	return nil
}

func (e *Engine) claim(ctx context.Context, ns *Namespace, keys [][]byte, digests []Digest, out []Claim, mark bool) error {
	n := len(keys)
	if len(out) != n || (digests != nil && len(digests) != n) {
		return fmt.Errorf("%w: %d keys, %d digests, %d claims", ErrBatch, n, len(digests), len(out))
	}
	if err := e.checkKeys(keys); err != nil {
		return err
	}
	now, slot, err := e.start(ctx)
	if err != nil {
		return err
	}
	defer e.finish(slot)
	b := e.getBatch(n)
	defer e.putBatch(b)
	e.fingerprints(b, ns.name, keys, true)
	leaseUntil := now + e.lease
	e.mem.Acquire(b.fps, b.tokens, now, leaseUntil, e.parts.Expiry(e.parts.Of(now)), b.res)

	cand := b.cand[:0]
	var c tally
	for i := range keys {
		var d Digest
		if digests != nil {
			d = digests[i]
		}
		out[i] = Claim{Key: keys[i], ns: ns, fp: b.fps[i], digest: d}
		switch r := b.res[i]; r.Status {
		case tier.Committed:
			c.memHits++
			out[i].Outcome = Duplicate
			if conflicts(d, r.Digest) {
				out[i].Outcome = Conflict
			}
			out[i].digest = r.Digest
			out[i].Result, out[i].CommittedAt = r.Result, r.At
		case tier.Held:
			out[i].Outcome = InFlight
		case tier.Poisoned:
			if r.Expired {
				c.leaseExpiries++
			}
			out[i].Outcome = Poison
		case tier.TakenOver:
			c.leaseExpiries++
			fallthrough
		default: // Acquired
			out[i].token, out[i].LeaseUntil = b.tokens[i], leaseUntil
			cand = append(cand, i)
		}
	}
	c.memMisses = uint64(len(cand))
	b.cand = cand
	if err := e.persistExpiries(ctx, b, ns, keys, now); err != nil {
		// Give back the claims this call acquired: it answers nothing.
		for j, i := range cand {
			b.cfps[j], b.ctokens[j], b.actions[j] = out[i].fp, out[i].token, memory.Drop
		}
		m := len(cand)
		e.mem.Settle(b.cfps[:m], b.ctokens[:m], b.actions[:m], b.expires[:m], b.digests[:m], nil)
		c.errors++
		e.stats.add(&c)
		return err
	}
	if len(cand) > 0 {
		if err := e.resolve(ctx, b, ns, out, &c, now, mark); err != nil {
			c.errors++
			e.stats.add(&c)
			return err
		}
		if len(cand) < n {
			repeatsFollow(b.res, out)
		}
	}
	for i := range out {
		c.count(out[i].Outcome)
	}
	c.claims = uint64(n)
	e.stats.add(&c)
	return nil
}

// repeatsFollow gives a key repeated in a batch the answer its first
// occurrence got from a slower tier: while that occurrence was being decided
// memory held its claim, so the repeats saw InFlight. Duplicate, Conflict
// and Poison follow; a first occurrence that turned out New keeps its
// repeats InFlight: it holds the claim. res
// are memory's answers to the batch: the first occurrence is the earliest
// one memory did not answer Held.
func repeatsFollow(res []memory.Result, out []Claim) {
	for i := range out {
		if out[i].Outcome != InFlight || res[i].Status != tier.Held {
			continue
		}
		for first := range i {
			if out[first].fp != out[i].fp || res[first].Status == tier.Held {
				continue
			}
			switch out[first].Outcome {
			case Poison:
				out[i].Outcome = Poison
			case Duplicate, Conflict:
				out[i].Outcome = Duplicate
				out[i].Result, out[i].CommittedAt = bytes.Clone(out[first].Result), out[first].CommittedAt
				if conflicts(out[i].digest, out[first].digest) {
					out[i].Outcome = Conflict
				}
			}
			break
		}
	}
}

// persistExpiries makes durable the attempt counts that lease expiries
// reached in this claim call (an exact tier whose claims live in the engine,
// with MaxAttempts only), so a restart sees them too.
func (e *Engine) persistExpiries(ctx context.Context, b *batch, ns *Namespace, keys [][]byte, now int64) error {
	if e.where != tier.ClaimsInEngine || e.maxAttempts == 0 {
		return nil
	}
	reqs := b.reqs[:0]
	for i := range keys {
		if r := b.res[i]; r.Expired {
			reqs = append(reqs, tier.Request{NS: ns.name, Key: keys[i], Attempts: r.Attempts})
			b.cfps[len(reqs)-1] = b.fps[i]
		}
	}
	b.reqs = reqs
	if len(reqs) == 0 {
		return nil
	}
	err := e.writeAttempts(ctx, b.cfps[:len(reqs)], e.parts.Of(now), reqs, b.st[:len(reqs)])
	clear(reqs)
	return err
}
