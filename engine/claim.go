package engine

import (
	"bytes"
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
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

func (e *Engine) claim(ctx context.Context, ns *Namespace, keys [][]byte, digests []Digest, out []Claim, p purpose) error {
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
	if ns.sliding && e.memoryOnly() {
		e.touch(b, ns, n, now)
	}

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
		if err := e.resolve(ctx, b, ns, out, &c, now, p); err != nil {
			c.errors++
			e.stats.add(&c)
			return err
		}
		if len(cand) < n {
			repeatsFollow(b.res, out)
		}
		if p == forClaim && e.durableClaims && !ownNamespace(ns.name) {
			if err := e.persistClaims(ctx, b, ns, out, now); err != nil {
				c.errors++
				e.stats.add(&c)
				return err
			}
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

// persistClaims makes each New claim of this call durable as an attempt
// (Options.DurableClaims): the key's count, one more than memory settled
// it with, is written before the claim is answered, so a crash that
// abandons the claim leaves it counted. If the write fails, the call's New
// claims are given back and it answers the error.
func (e *Engine) persistClaims(ctx context.Context, b *batch, ns *Namespace, out []Claim, now int64) error {
	reqs := b.reqs[:0]
	fps := b.cfps[:0]
	for _, i := range b.cand {
		if out[i].Outcome != New {
			continue
		}
		a := e.mem.Attempts(out[i].fp, out[i].token)
		out[i].durable, out[i].attempts, out[i].durablePart = true, a, e.parts.Of(now)
		reqs = append(reqs, tier.Request{NS: ns.name, Key: out[i].Key, Attempts: a + 1})
		fps = append(fps, out[i].fp)
	}
	b.reqs = reqs
	if len(reqs) == 0 {
		return nil
	}
	e.counts.RLock() // the claim holds its key: ordered against Forgets only
	err := e.writeAttempts(ctx, fps, e.parts.Of(now), reqs, b.st[:len(reqs)])
	e.counts.RUnlock()
	clear(reqs)
	if err == nil {
		return nil
	}
	m := 0
	for _, i := range b.cand {
		if out[i].Outcome == New {
			b.cfps[m], b.ctokens[m], b.actions[m] = out[i].fp, out[i].token, memory.Drop
			m++
		}
	}
	e.mem.Settle(b.cfps[:m], b.ctokens[:m], b.actions[:m], b.expires[:m], b.digests[:m], nil)
	return err
}

// Claim claims key in the default namespace; see Namespace.Claim.
func (e *Engine) Claim(ctx context.Context, key []byte) (Claim, error) {
	return e.def.Claim(ctx, key)
}

// ClaimBatch claims keys in the default namespace; see Namespace.ClaimBatch.
func (e *Engine) ClaimBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Claim) error {
	return e.def.ClaimBatch(ctx, keys, digests, out)
}

// Claim asks whether key is new. New grants a claim leased for
// Options.Lease: the caller must Commit it after processing or Release it
// after a failure. Any other outcome grants nothing.
func (n *Namespace) Claim(ctx context.Context, key []byte) (Claim, error) {
	return n.ClaimDigest(ctx, key, Digest{})
}

// ClaimDigest is Claim with the payload's digest: a key committed with a
// different digest answers Conflict, and a New claim stores d on Commit.
func (n *Namespace) ClaimDigest(ctx context.Context, key []byte, d Digest) (Claim, error) {
	keys := [1][]byte{key}
	digests := [1]Digest{d}
	var out [1]Claim
	err := n.e.claim(ctx, n, keys[:], digests[:], out[:], forClaim)
	return out[0], err
}

// ClaimBatch claims every key at once, one Claim per key in out (which must
// have len(keys)); digests is nil or one per key. A key repeated in the
// batch is New at most once, its repeats InFlight. On error no claim is
// held and out is unspecified.
func (n *Namespace) ClaimBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Claim) error {
	return n.e.claim(ctx, n, keys, digests, out, forClaim)
}

// Claim is the answer to a claim for one key and, when Outcome is New, the
// handle that commits or releases it. The caller owns it; Key aliases the
// caller's key bytes, which must stay unchanged until Commit or Release: a
// claim whose key changed (a reused read buffer) is refused with
// ErrLeaseLost and changes nothing.
type Claim struct {
	Outcome Outcome
	// undo: New over the caller's own commit in a shared tier, made by a
	// mark whose reply was lost; a release must undo that commit.
	undo bool
	Key  []byte
	// LeaseUntil is when the claim stops excluding other workers, in Unix
	// nanoseconds of the engine's clock (New only).
	LeaseUntil int64
	// Result is a small result stored with the key's commit, so a
	// duplicate can answer what the first processing answered (an API's
	// response, a created resource's ID). For a New claim, set it before
	// Commit (at most Options.MaxResultSize bytes; empty stores none); for
	// a Duplicate or Conflict it is the result the key's commit stored,
	// nil if none (the caller's copy).
	Result []byte
	// CommittedAt is when the commit that stored Result was made, in Unix
	// nanoseconds of the committing engine's clock (Duplicate or Conflict
	// with a Result; zero otherwise). In a sliding namespace of the
	// embedded store it is the key's last refresh, which re-committed it
	// dated then (NamespaceOptions.Sliding).
	CommittedAt int64
	// Version is the entity's stored version (Advance): the one a New
	// claim replaces (0 for none), or the one that made the answer
	// Duplicate or Stale.
	Version uint64
	// advance: a claim of an entity's version (Advance): its release keeps
	// the version it replaced and counts no attempt.
	advance bool

	ns     *Namespace
	fp     shard.Fingerprint
	token  uint64 // the memory tier's claim
	rtoken uint64 // the counter of the owner token in a shared tier
	// earlier is the counter of the oldest token of this key's earlier
	// calls whose replies were lost (tier.Request.Earlier), 0 for none.
	earlier uint64
	// attempts is the count a shared tier's claim carried when acquired:
	// a give-back that undoes the claim's commit restores it; with
	// durable, the count before this claim's attempt was written.
	attempts uint16
	// durable: the claim's attempt was written when it was answered
	// (Options.DurableClaims): an uncounted give-back writes attempts back.
	durable bool
	// durablePart is the partition that holds the durable claim's attempt:
	// an Extend into a later partition writes it there again, so it lives
	// as long as the claim may (see Engine.Extend).
	durablePart int64
	// digest is the caller's payload digest, or, once a slower tier answered
	// Duplicate or Conflict (the claim is not owned and commits nothing),
	// the digest it found committed: a repeat of the key in the batch
	// compares its own with it.
	digest Digest
	// refreshAt, when not zero, is the arrival time of a MarkBatch's
	// duplicate in a sliding namespace whose refresh is written with the
	// batch's commits (deferRefresh); its memory claim (token) is held
	// until then. refreshFrom is the partition its record was found in.
	refreshAt, refreshFrom int64
}

// firstToken is the counter of the oldest token the key's calls sent
// since its last answer: this call's, or an earlier one whose reply was
// lost (what a retry must adopt).
func (c *Claim) firstToken() uint64 {
	if c.earlier != 0 {
		return c.earlier
	}
	return c.rtoken
}

// Owned reports whether the caller holds the key and must Commit or Release.
func (c *Claim) Owned() bool { return c.Outcome == New }
