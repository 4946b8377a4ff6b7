package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/internal/hooks"
	"github.com/tierdedup/tierdedup/tier"
)

// MarkIfAbsent marks key in the default namespace; see
// Namespace.MarkIfAbsent.
func (e *Engine) MarkIfAbsent(ctx context.Context, key []byte) (Outcome, error) {
	return e.def.MarkIfAbsent(ctx, key)
}

// MarkBatch marks keys in the default namespace; see Namespace.MarkBatch.
func (e *Engine) MarkBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Outcome) error {
	return e.def.MarkBatch(ctx, keys, digests, out)
}

// MarkIfAbsent claims and commits key in one call: New means it was absent
// and is now marked (durably, as configured), Duplicate or Conflict that it
// was marked before, InFlight that a two-phase claim holds it. While the
// call runs it holds the key as a claim does, so a concurrent call of the
// same key may see it InFlight until the mark is durable; a mark whose
// lease ended before its commit (a stall longer than the Lease, or an
// Options.Clock that moved past the Lease while the call ran) answers
// InFlight and marks nothing: the message is redelivered and its next
// mark decides it.
func (n *Namespace) MarkIfAbsent(ctx context.Context, key []byte) (Outcome, error) {
	keys := [1][]byte{key}
	var out [1]Outcome
	err := n.MarkBatch(ctx, keys[:], nil, out[:])
	return out[0], err
}

// MarkBatch is MarkIfAbsent for a batch, one Outcome per key in out (which
// must have len(keys)), with one durable write for the whole batch. A key
// repeated in the batch is New once and Duplicate after.
func (n *Namespace) MarkBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Outcome) error {
	if len(out) != len(keys) {
		return fmt.Errorf("%w: %d keys, %d outcomes", ErrBatch, len(keys), len(out))
	}
	// Close waits for the whole mark: its claim is committed or given
	// back in every tier before Close returns.
	ctx, done, err := n.e.hold(ctx)
	if err != nil {
		return err
	}
	defer done()
	if n.e.memoryOnly() {
		return n.markInMemory(ctx, keys, digests, out)
	}
	b := n.e.getBatch(len(keys))
	defer n.e.putBatch(b)
	claims, errs := b.claims[:len(keys)], b.errs[:len(keys)]
	// A tier that marks in one step (Marker) commits every New key in
	// the claim itself.
	p := forMark
	if n.marksInTier() {
		p = forMarkInTier
	}
	if err := n.e.claim(ctx, n, keys, digests, claims, p); err != nil {
		return err
	}
	if h := hooks.MarkBeforeCommit.Load(); h != nil {
		(*h)()
	}
	if p == forMarkInTier {
		clear(errs)
	} else if err := n.e.commitMarks(ctx, claims, errs); err != nil && !errors.Is(err, ErrLeaseLost) {
		// Nothing is known to be durable (a failed Pebble batch wrote
		// nothing; a Redis commit whose reply was lost is remembered, so
		// the retry of this mark is New): give the claims back.
		gctx, cancel := giveBackContext(ctx)
		if rerr := n.e.releaseAs(gctx, claims, nil, true); rerr != nil && !errors.Is(rerr, ErrLeaseLost) {
			err = errors.Join(err, fmt.Errorf("giving the claims back: %w", rerr))
		}
		cancel()
		// Sliding duplicates whose refresh no write carried: their claims
		// go too (those the failed write carried are gone already).
		n.e.dropRefreshes(claims)
		return err
	}
	for i := range claims {
		out[i] = claims[i].Outcome
		if out[i] == New && errs[i] != nil {
			// Its lease ended and another worker took the key over
			// before the commit: someone else holds it now.
			out[i] = InFlight
			continue
		}
		if out[i] == InFlight {
			// A repeat of a key marked earlier in this batch is a duplicate
			// of it, now that it is committed.
			for j := range i {
				if claims[j].Outcome == New && errs[j] == nil && claims[j].fp == claims[i].fp {
					out[i] = Duplicate
					if conflicts(claims[i].digest, claims[j].digest) {
						out[i] = Conflict
					}
					break
				}
			}
		}
	}
	clear(errs)
	return nil
}

// memoryOnly reports an engine whose memory tier is its only tier: no
// exact tier, no filters, no archive.
func (e *Engine) memoryOnly() bool {
	return e.exact == nil && e.local == nil && e.arch == nil
}

// markInMemory is MarkBatch on a memory-only engine: each key is visited
// once, claimed and committed in the same step under its stripe's lock
// (memory.Table.Mark), where a claim and a commit would visit it three
// times (acquire, begin, finish): memory is the only tier, so there is
// nothing slower to ask and nothing durable to wait for between them. The
// answers are the claim-then-commit path's: a key repeated in the batch
// finds its first occurrence committed and is a Duplicate (or Conflict).
func (n *Namespace) markInMemory(ctx context.Context, keys [][]byte, digests []Digest, out []Outcome) error {
	e := n.e
	if digests != nil && len(digests) != len(keys) {
		return fmt.Errorf("%w: %d keys, %d digests", ErrBatch, len(keys), len(digests))
	}
	if err := e.checkKeys(keys); err != nil {
		return err
	}
	now, slot, err := e.start(ctx)
	if err != nil {
		return err
	}
	defer e.finish(slot)
	k := len(keys)
	b := e.getBatch(k)
	defer e.putBatch(b)
	e.fingerprints(b, n.name, keys, true)
	res := b.res[:k]
	e.mem.Mark(b.fps[:k], b.tokens[:k], digests, now, now+e.lease, e.parts.Expiry(e.parts.Of(now)), now+n.cacheFor, res)
	if n.sliding {
		e.touch(b, n, k, now)
	}
	var c tally
	for i := range res {
		switch r := &res[i]; r.Status {
		case tier.Committed:
			c.memHits++
			out[i] = Duplicate
			var d Digest
			if digests != nil {
				d = digests[i]
			}
			if conflicts(d, r.Digest) {
				out[i] = Conflict
			}
		case tier.Held:
			out[i] = InFlight // another caller's claim (ClaimBatch)
		case tier.Poisoned:
			if r.Expired {
				c.leaseExpiries++
			}
			out[i] = Poison
		case tier.TakenOver:
			c.leaseExpiries++
			fallthrough
		default: // Acquired, and committed by Mark
			c.memMisses++
			c.commits++
			out[i] = New
		}
		c.count(out[i])
	}
	c.claims = uint64(k)
	e.stats.add(&c)
	return nil
}

// marksInTier reports whether MarkBatch marks through the exact tier's
// Mark (forMarkInTier): a Marker tier, and behind the archive only a
// tier that logs its marks (Engine.logMarks), for a namespace of the
// engine's window that the archive keeps and that does not slide (a
// sliding refresh, and a window of its own, go the three steps: claim,
// archive, commit).
func (n *Namespace) marksInTier() bool {
	e := n.e
	if e.marker == nil {
		return false
	}
	if e.arch == nil {
		return true
	}
	return e.logMarks && n.archiveWindow > 0 && n.window == 0 && !n.sliding
}
