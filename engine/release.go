package engine

import (
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/redis"
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

func (e *Engine) release(ctx context.Context, claims []Claim, errs []error) error {
	return e.releaseAs(ctx, claims, errs, false)
}

// releaseAs releases claims; with giveBack the engine gives back claims of
// a call that failed itself (MarkBatch's commit): no attempt is counted,
// and a Redis commit carrying the claim's token, applied although the
// call failed, is undone.
func (e *Engine) releaseAs(ctx context.Context, claims []Claim, errs []error, giveBack bool) error {
	if errs != nil && len(errs) != len(claims) {
		return fmt.Errorf("%w: %d claims, %d errors", ErrBatch, len(claims), len(errs))
	}
	clear(errs)
	// Release does not need a working store, so it is allowed after a
	// storage failure: it only frees memory claims.
	if err := ctx.Err(); err != nil {
		return err
	}
	e.life.RLock()
	defer e.life.RUnlock()
	if e.life.closed {
		return ErrClosed
	}
	now, _ := e.nowNoRotate()
	if e.store != nil && e.maxAttempts > 0 && !giveBack {
		// Attempt counts are written in the current partition: rotate to
		// it first. A failed store cannot; releasing memory claims needs
		// none, and the count's write will fail.
		if t, err := e.now(); err == nil {
			now = t
		}
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
	lost, n := 0, 0 // n: claims released locally that Redis must release too
	var recs []pebble.Record
	for j, s := range st {
		if s.Status != tier.OK {
			lost++
			if errs != nil {
				errs[b.cand[j]] = ErrLeaseLost
			}
		} else if e.store != nil && e.maxAttempts > 0 && !giveBack {
			c := &claims[b.cand[j]]
			recs = append(b.recs[:len(recs)], releasedRecord(e.parts.Of(now), c.ns.name, c.Key, s.Attempts))
			b.cfps[len(recs)-1] = c.fp
		} else if e.redis != nil {
			c := &claims[b.cand[j]]
			b.rreqs[n] = redis.Request{NS: c.ns.name, Key: c.Key, Token: e.redisToken(c.rtoken)}
			b.qidx = append(b.qidx[:n], b.cand[j])
			n++
		}
	}
	if n > 0 {
		reqs, rst := b.rreqs[:n], b.rst[:n]
		release := e.redis.Release
		if giveBack {
			release = e.redis.GiveBack
		}
		err := release(ctx, reqs, rst)
		clear(reqs)
		if err != nil {
			e.stats.errors.Add(1)
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		for q, s := range rst {
			if s != tier.OK {
				lost++
				if errs != nil {
					errs[b.qidx[q]] = ErrLeaseLost
				}
			}
		}
	}
	if len(recs) > 0 {
		// The attempt counts, durable, so every restart sees them.
		err := e.writeAttempts(b.cfps[:len(recs)], recs)
		clear(recs)
		if err != nil {
			return err
		}
	}
	e.stats.releases.Add(uint64(m - lost))
	if lost > 0 {
		e.stats.leaseLost.Add(uint64(lost))
		return fmt.Errorf("%w: %d of %d claims", ErrLeaseLost, lost, m)
	}
	return nil
}

// nowNoRotate is now without rotation, for calls that write nothing.
func (e *Engine) nowNoRotate() (int64, error) {
	return max(e.reading(), e.highWater.Load()), nil
}

// releasedRecord is the durable attempt count of a key that is not
// committed.
func releasedRecord(part int64, ns string, key []byte, attempts uint16) pebble.Record {
	return pebble.Record{Partition: part, NS: ns, Key: key, Value: pebble.Value{State: pebble.StateReleased, Attempts: attempts}}
}

// writeAttempts makes released records durable, adding their keys to the
// Bloom filters first (they must cover every record the store holds).
func (e *Engine) writeAttempts(fps []shard.Fingerprint, recs []pebble.Record) error {
	e.bloom.Add(fps, recs[0].Partition)
	if err := e.store.WriteWith(recs, nil); err != nil {
		e.stats.errors.Add(1)
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return nil
}
