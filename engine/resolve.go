package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// resolve decides the keys that memory acquired (b.cand) from the filter
// and the exact tier. Memory holds a claim on each while this runs, so no
// other caller in this process can decide them meanwhile. With neither,
// every acquired key is New; with a filter alone, its "maybe" is final
// (answered Duplicate, at its false-positive rate); with an exact tier, a
// warm filter's "no" is final and everything else is the tier's answer.
// With mark (MarkBatch over a Marker tier) the tier commits every key it
// acquires in the same step, and memory keeps them as committed.
func (e *Engine) resolve(ctx context.Context, b *batch, ns *Namespace, out []Claim, c *tally, now int64, mark bool) error {
	cand := b.cand
	if e.bloom == nil && e.exact == nil {
		for _, i := range cand {
			out[i].Outcome = New
		}
		return nil
	}
	m := len(cand)
	cfps, ctokens := b.cfps[:m], b.ctokens[:m]
	for j, i := range cand {
		cfps[j], ctokens[j] = out[i].fp, out[i].token
	}
	actions, expires, digests, attempts := b.actions[:m], b.expires[:m], b.digests[:m], b.attempts[:m]
	clear(actions) // Keep
	clear(digests)
	clear(attempts)
	settle := func() { e.mem.Settle(cfps, ctokens, actions, expires, digests, attempts) }

	// The filter's answer: which live partitions may hold each key.
	probes := b.probes[:m]
	oldest := e.parts.Oldest(e.current.Load())
	warm := e.bloom != nil && e.warm.Load()
	cold := e.cold.Load()
	switch {
	case warm:
		oldest = e.bloom.Test(cfps, probes)
	case e.bloom != nil && cold != nil:
		// Rebuilding: the filters of the partitions loaded sealed (and of
		// those begun since Open) hold every key, the others (cold) may
		// not, so every key is read in the cold partitions and only where
		// a complete filter says maybe in the rest.
		oldest = e.bloom.Test(cfps, probes)
		var force uint64
		for _, p := range *cold {
			if d := p - oldest; d >= 0 && d < int64(e.parts.Live) {
				force |= 1 << d
			}
		}
		for j := range probes {
			probes[j].Maybe |= force
		}
	default:
		allLive := uint64(1)<<e.parts.Live - 1
		for j := range probes {
			probes[j] = bloom.Probe{Maybe: allLive}
		}
	}
	if e.exact == nil {
		// The filter is the only source: a maybe is answered Duplicate, at
		// the configured false-positive rate, and its claim given back.
		for j, i := range cand {
			out[i].Outcome = New
			if probes[j].Maybe != 0 {
				out[i].Outcome = Duplicate
				out[i].digest = Digest{} // no digest is known: none conflicts
				actions[j] = memory.Drop
			}
		}
		settle()
		return nil
	}

	// Ask the exact tier about every key the filter did not prove new.
	shared := e.where == tier.ClaimsInStore
	reqs, qidx := b.reqs[:0], b.qidx[:0]
	marks := b.marks[:m]
	clear(marks)
	for j, i := range cand {
		if warm && probes[j].Maybe == 0 {
			out[i].Outcome = New
			c.bloomNegatives++
			continue
		}
		r := tier.Request{NS: ns.name, Key: out[i].Key, Digest: out[i].digest, Oldest: oldest, Mask: probes[j].Maybe}
		if shared {
			out[i].rtoken = out[i].token
			if rt, ok := e.retries.take(out[i].fp, now); ok {
				// A retry of a claim whose reply was lost: the same token,
				// and no more lease than that claim has in the tier.
				out[i].rtoken = rt.token
				if rt.mark {
					marks[j] = true
				} else {
					out[i].LeaseUntil = min(out[i].LeaseUntil, rt.leaseUntil)
				}
			}
			r.Token = e.ownerToken(out[i].rtoken)
		}
		reqs = append(reqs, r)
		qidx = append(qidx, j)
	}
	b.reqs, b.qidx = reqs, qidx
	if len(reqs) == 0 {
		return nil
	}
	ans := b.ans[:len(reqs)]
	c.storeReads += uint64(len(reqs))
	var err error
	if mark {
		err = e.marker.Mark(ctx, reqs, ans)
	} else {
		err = e.exact.Claim(ctx, reqs, time.Duration(e.lease), ans)
	}
	if err != nil {
		if shared {
			// The claims may hold the keys in the tier now: remember their
			// tokens, so their retries recognise them.
			fps := make([]shard.Fingerprint, len(reqs))
			tokens, leases := make([]uint64, len(reqs)), make([]int64, len(reqs))
			for q, j := range qidx {
				i := cand[j]
				fps[q], tokens[q], leases[q] = out[i].fp, out[i].rtoken, out[i].LeaseUntil
				if mark {
					leases[q] = now + e.window // a mark may have committed: its retry must find it its own
				}
			}
			e.retries.remember(fps, tokens, leases, now, mark)
		}
		clear(reqs)
		for j := range actions {
			actions[j] = memory.Drop // nothing was decided: give every claim back
		}
		settle()
		return e.tierError(err)
	}
	for q, j := range qidx {
		i := cand[j]
		a := &ans[q]
		if a.Expired {
			c.leaseExpiries++
		}
		switch a.Status {
		case tier.Absent:
			out[i].Outcome = New
			if warm {
				c.bloomFalsePositives++
			}
		case tier.Acquired:
			out[i].Outcome = New
			attempts[j] = a.Attempts
			if mark {
				// Committed by the tier in the same step.
				actions[j], expires[j], digests[j] = memory.Commit, now+e.cacheFor, out[i].digest
				c.commits++
			}
		case tier.Released:
			// Not committed, but its claims failed before: the stored
			// count, or this process's if higher, decides Poison.
			out[i].Outcome = New
			if e.maxAttempts == 0 {
				continue
			}
			attempts[j] = max(a.Attempts, b.res[i].Attempts)
			if int(attempts[j]) >= e.maxAttempts {
				out[i].Outcome = Poison
				actions[j], expires[j] = memory.Poison, e.parts.Expiry(a.Partition)
			}
		case tier.Poisoned:
			// Its attempts, by any process, reached MaxAttempts.
			out[i].Outcome = Poison
			actions[j], attempts[j] = memory.Drop, a.Attempts
		case tier.Held:
			out[i].Outcome = InFlight
			actions[j] = memory.Drop
		case tier.Committed:
			if ns.expired(a.Partition, a.At, now) {
				// Older than the namespace's own window: the key is new
				// again, and its commit will write a newer record.
				out[i].Outcome = New
				continue
			}
			if marks[j] && a.Token == reqs[q].Token {
				// The commit of a mark whose reply was lost: the caller
				// never learnt it was New, so it still is.
				out[i].Outcome = New
				if mark {
					// This mark's retry: committed, as a mark is.
					actions[j], expires[j], digests[j] = memory.Commit, now+e.cacheFor, out[i].digest
					c.commits++
				} else {
					// A claim: its commit finds its own and succeeds;
					// its release must undo the commit, or a message
					// never processed would stay a duplicate.
					out[i].undo = true
				}
				continue
			}
			c.storeHits++
			out[i].Outcome = Duplicate
			if conflicts(out[i].digest, a.Digest) {
				out[i].Outcome = Conflict
			}
			digests[j], out[i].digest = a.Digest, a.Digest
			if a.Result != nil {
				out[i].Result, out[i].CommittedAt = a.Result, a.At
			}
			actions[j] = memory.Drop
			if a.Partition >= 0 && a.Result == nil {
				// Cached until its partition expires, or the namespace's
				// window ends. A tier that cannot date the commit
				// (another process's, in a shared tier) is not cached:
				// memory must never outlive it. Nor is a commit with a
				// result: the tier answers with it.
				actions[j], expires[j] = memory.Commit, e.parts.Expiry(a.Partition)
				if ns.window > 0 {
					at := a.At
					if at == 0 {
						at = (a.Partition + 1) * e.parts.Length
					}
					expires[j] = min(expires[j], at+ns.window)
				}
			}
		default:
			clear(reqs)
			for j := range actions {
				actions[j] = memory.Drop
			}
			settle()
			return fmt.Errorf("%w: exact tier answered %v", ErrStorage, a.Status)
		}
	}
	clear(reqs)
	// Committed keys become committed entries in memory; New keys stay
	// claimed.
	settle()
	return nil
}

// tierError wraps an exact tier's failure: ErrUnavailable for a shared
// tier (a server that may come back), ErrStorage for the embedded one.
func (e *Engine) tierError(err error) error {
	if e.where == tier.ClaimsInStore {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return fmt.Errorf("%w: %w", ErrStorage, err)
}

// ownerToken is a claim's owner token in a shared tier: this engine's
// random ID and the claim's counter, unique across processes.
func (e *Engine) ownerToken(t uint64) tier.Token {
	var tok tier.Token
	copy(tok[:8], e.process[:])
	binary.BigEndian.PutUint64(tok[8:], t)
	return tok
}
