package engine

import (
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/internal/hooks"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// Release gives a New claim back, so a redelivery of its key can claim it
// again. Only the current owner may: a claim that lost its lease gets
// ErrLeaseLost and changes nothing.
func (e *Engine) Release(ctx context.Context, c Claim) error {
	return e.single(ctx, c, e.release)
}

// ReleaseBatch releases every New claim in claims; errs is nil or one per
// claim.
func (e *Engine) ReleaseBatch(ctx context.Context, claims []Claim, errs []error) error {
	return e.release(ctx, claims, errs)
}

// UnclaimBatch gives back New claims whose messages were never handed to a
// handler (a batch that stopped at an earlier message's failure): as
// ReleaseBatch, but no attempt is counted, so Options.MaxAttempts counts
// only the failures of handlers that ran.
func (e *Engine) UnclaimBatch(ctx context.Context, claims []Claim, errs []error) error {
	return e.releaseAs(ctx, claims, errs, true)
}

func (e *Engine) release(ctx context.Context, claims []Claim, errs []error) error {
	return e.releaseAs(ctx, claims, errs, false)
}

// releaseAs releases claims; with giveBack the engine gives back claims of
// a call that failed itself (MarkBatch's commit): no attempt is counted,
// and a shared tier's commit carrying the claim's token, applied although
// the call failed, is undone.
func (e *Engine) releaseAs(ctx context.Context, claims []Claim, errs []error, giveBack bool) error {
	if errs != nil && len(errs) != len(claims) {
		return fmt.Errorf("%w: %d claims, %d errors", ErrBatch, len(claims), len(errs))
	}
	clear(errs)
	// Release does not need a working store, so it is allowed after a
	// storage failure: it only frees memory claims.
	locked, err := e.admit(ctx)
	if err != nil {
		return err
	}
	defer e.leave(locked)
	if e.local != nil {
		defer e.local.Exit(e.local.Enter()) // it may write attempt counts
	}
	// The embedded tier keeps attempt counts; a shared tier counts them
	// itself.
	shared := e.where == tier.ClaimsInStore
	counted := e.where == tier.ClaimsInEngine && e.maxAttempts > 0 && !giveBack
	// A durable claim's attempt is on disk already: given back uncounted,
	// the count it had before is written back.
	restores := giveBack && e.durableClaims && anyDurable(claims)
	now, _ := e.nowNoRotate()
	if counted || restores {
		// Attempt counts are written in the current partition: rotate to
		// it first. A failed store cannot; releasing memory claims needs
		// none, and the count's write will fail.
		if t, err := e.now(); err == nil {
			now = t
		}
	}
	if counted || restores {
		e.counts.Lock() // until the counts are durable: see Engine.counts
		defer e.counts.Unlock()
	}
	b := e.getBatch(len(claims))
	defer e.putBatch(b)
	b.owned(e, claims, true)
	m := len(b.cand)
	if m == 0 {
		return nil
	}
	st := b.res[:m]
	e.mem.Release(b.cfps[:m], b.ctokens[:m], now, e.parts.Expiry(e.parts.Of(now)), !giveBack, st)
	lost := 0
	// The claims released in memory that the exact tier must hear of.
	reqs, qidx := b.reqs[:0], b.qidx[:0]
	var undo []int // claims over their own lost mark's commit: given back
	for j, s := range st {
		if s.Status != tier.OK {
			lost++
			if errs != nil {
				errs[b.cand[j]] = ErrLeaseLost
			}
			continue
		}
		c := &claims[b.cand[j]]
		switch {
		case shared && c.undo && !giveBack:
			undo = append(undo, b.cand[j])
			continue
		case shared:
			reqs = append(reqs, tier.Request{NS: c.ns.name, Key: c.Key, Token: e.ownerToken(c.rtoken), Versioned: c.advance, Attempts: c.attempts})
		case c.advance:
			continue // the store still holds the version the claim would have replaced
		case counted:
			reqs = append(reqs, tier.Request{NS: c.ns.name, Key: c.Key, Attempts: s.Attempts})
		case restores && c.durable:
			reqs = append(reqs, tier.Request{NS: c.ns.name, Key: c.Key, Attempts: c.attempts})
		default:
			continue
		}
		b.cfps[len(reqs)-1] = c.fp
		qidx = append(qidx, b.cand[j])
	}
	b.reqs, b.qidx = reqs, qidx
	n, err := e.releaseExact(ctx, b, errs, now, shared, giveBack)
	if err != nil {
		return err
	}
	lost += n
	if n, err = e.undoCommits(ctx, claims, errs, undo, now); err != nil {
		return err
	}
	lost += n
	e.stats.releases.Add(uint64(m - lost))
	if lost > 0 {
		e.stats.leaseLost.Add(uint64(lost))
		return fmt.Errorf("%w: %d of %d claims", ErrLeaseLost, lost, m)
	}
	return nil
}

// releaseExact tells the exact tier of the releases in b.reqs (b.qidx
// their claims): a shared tier frees its claims, the embedded one writes
// their attempt counts. It returns how many the shared tier no longer gave
// the claim's token (their errs are ErrLeaseLost).
func (e *Engine) releaseExact(ctx context.Context, b *batch, errs []error, now int64, shared, giveBack bool) (lost int, err error) {
	reqs, qidx := b.reqs, b.qidx
	if len(reqs) == 0 {
		return 0, nil
	}
	rst := b.st[:len(reqs)]
	if shared {
		if err = e.exact.Release(ctx, e.parts.Of(now), reqs, giveBack, rst); err != nil {
			e.stats.errors.Add(1)
			err = e.tierError(err)
		}
	} else {
		// The attempt counts, durable, so every restart sees them.
		err = e.writeAttempts(ctx, b.cfps[:len(reqs)], e.parts.Of(now), reqs, rst)
	}
	clear(reqs)
	if err != nil {
		return 0, err
	}
	for q, s := range rst {
		if s != tier.OK {
			lost++
			if errs != nil {
				errs[qidx[q]] = ErrLeaseLost
			}
		}
	}
	return lost, nil
}

// undoCommits gives back, in a shared tier, the claims (undo names them)
// whose own lost mark's commit the tier holds: the commit is undone and no
// attempt counted. It returns how many the tier no longer gave the claim's
// token.
func (e *Engine) undoCommits(ctx context.Context, claims []Claim, errs []error, undo []int, now int64) (lost int, err error) {
	if len(undo) == 0 {
		return 0, nil
	}
	ureqs, ust := make([]tier.Request, len(undo)), make([]tier.Status, len(undo))
	for q, i := range undo {
		ureqs[q] = tier.Request{NS: claims[i].ns.name, Key: claims[i].Key, Token: e.ownerToken(claims[i].rtoken), Attempts: claims[i].attempts}
	}
	if err := e.exact.Release(ctx, e.parts.Of(now), ureqs, true, ust); err != nil {
		e.stats.errors.Add(1)
		return 0, e.tierError(err)
	}
	for q, s := range ust {
		if s != tier.OK {
			lost++
			if errs != nil {
				errs[undo[q]] = ErrLeaseLost
			}
		}
	}
	return lost, nil
}

// anyDurable reports whether a New claim among claims wrote its attempt
// when it was answered (Options.DurableClaims).
func anyDurable(claims []Claim) bool {
	for i := range claims {
		if claims[i].durable && claims[i].Outcome == New {
			return true
		}
	}
	return false
}

// nowNoRotate is now without rotation, for calls that write nothing.
func (e *Engine) nowNoRotate() (int64, error) {
	return max(e.reading(), e.highWater.Load()), nil
}

// writeAttempts makes attempt counts durable in an exact tier whose claims
// live in the engine, adding their keys to the filter first: it must cover
// every record the tier holds.
func (e *Engine) writeAttempts(ctx context.Context, fps []shard.Fingerprint, part int64, reqs []tier.Request, out []tier.Status) error {
	if h := hooks.BeforeDurable.Load(); h != nil {
		(*h)()
	}
	if e.local != nil {
		e.local.Add(fps, part)
	}
	if err := e.exact.Release(ctx, part, reqs, false, out); err != nil {
		e.stats.errors.Add(1)
		return e.tierError(err)
	}
	return nil
}
