package engine

import (
	"context"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// resolve decides the keys that memory acquired (b.cand) from the slower
// tiers. Memory holds a claim on each while this runs, so no other caller
// in this process can decide them meanwhile.
func (e *Engine) resolve(ctx context.Context, b *batch, ns *Namespace, out []Claim, c *tally, now int64) error {
	cand := b.cand
	if e.tiers == MemoryOnly {
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
	dropAll := func() {
		for j := range actions {
			actions[j] = memory.Drop
		}
		settle()
	}
	if e.tiers == Redis {
		return e.resolveRedis(ctx, b, ns, out, c, now, settle, dropAll)
	}

	warm := e.warm.Load()
	probes := b.probes[:m]
	oldest := e.parts.Oldest(e.current.Load())
	if warm {
		oldest = e.bloom.Test(cfps, probes)
	} else {
		allLive := uint64(1)<<e.parts.Live - 1
		for j := range probes {
			probes[j] = bloom.Probe{Maybe: allLive}
		}
	}

	if e.tiers == BloomOnly {
		// The filter is the only source: a maybe is answered Duplicate, at
		// the configured false-positive rate, and its claim given back.
		for j, i := range cand {
			out[i].Outcome = New
			if probes[j].Maybe != 0 {
				out[i].Outcome = Duplicate
				actions[j] = memory.Drop
			}
		}
		settle()
		return nil
	}

	// Default: a warm "no" is final; everything else is read from Pebble,
	// in the partitions the filters name.
	queries := b.queries[:0]
	qidx := b.qidx[:0]
	for j, i := range cand {
		if probes[j].Maybe == 0 {
			out[i].Outcome = New
			c.bloomNegatives++
			continue
		}
		queries = append(queries, pebble.Query{NS: ns.name, Key: out[i].Key, Oldest: oldest, Mask: probes[j].Maybe})
		qidx = append(qidx, j)
	}
	b.queries, b.qidx = queries, qidx
	if len(queries) == 0 {
		return nil
	}
	hits := b.hits[:len(queries)]
	c.storeReads += uint64(len(queries))
	if err := e.store.Lookup(queries, hits); err != nil {
		dropAll() // nothing was decided: give every claim back
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	for q, j := range qidx {
		i := cand[j]
		h := hits[q]
		if !h.Found || (h.Value.State == pebble.StateReleased && e.maxAttempts == 0) {
			out[i].Outcome = New
			if warm && !h.Found {
				c.bloomFalsePositives++
			}
			continue
		}
		if h.Value.State == pebble.StateReleased {
			// Not committed, but its claims failed before: the stored
			// count, or this process's if higher, decides Poison.
			attempts[j] = max(h.Value.Attempts, b.res[i].Attempts)
			out[i].Outcome = New
			if int(attempts[j]) >= e.maxAttempts {
				out[i].Outcome = Poison
				actions[j], expires[j] = memory.Poison, e.parts.Expiry(h.Partition)
			}
			continue
		}
		c.storeHits++
		actions[j] = memory.Commit
		expires[j] = e.parts.Expiry(h.Partition)
		digests[j] = h.Value.Digest
		out[i].Outcome = Duplicate
		if conflicts(out[i].digest, h.Value.Digest) {
			out[i].Outcome = Conflict
		}
	}
	// Found keys become committed entries in memory; the rest stay claimed.
	settle()
	return nil
}

// resolveRedis asks Redis for every acquired key in one pipeline. Only
// Redis may say New here: other processes write the same keys.
func (e *Engine) resolveRedis(ctx context.Context, b *batch, ns *Namespace, out []Claim, c *tally, now int64, settle, dropAll func()) error {
	cand := b.cand
	reqs, res := b.rreqs[:len(cand)], b.rres[:len(cand)]
	marks := b.marks[:len(cand)]
	clear(marks)
	for j, i := range cand {
		out[i].rtoken = out[i].token
		if rt, ok := e.retries.take(out[i].fp, now); ok {
			// A retry of a claim whose reply was lost: the same token,
			// and no more lease than that claim has in Redis.
			out[i].rtoken = rt.token
			if rt.mark {
				marks[j] = true
			} else {
				out[i].LeaseUntil = min(out[i].LeaseUntil, rt.leaseUntil)
			}
		}
		reqs[j] = redis.Request{NS: ns.name, Key: out[i].Key, Token: e.redisToken(out[i].rtoken)}
	}
	c.storeReads += uint64(len(cand))
	err := e.redis.Claim(ctx, reqs, time.Duration(e.lease), res)
	clear(reqs)
	if err != nil {
		if e.failOpen {
			c.failOpen += uint64(len(cand))
			for _, i := range cand {
				out[i].Outcome = New
			}
			return nil
		}
		fps, tokens, leases := b.cfps[:len(cand)], b.ctokens[:len(cand)], b.expires[:len(cand)]
		for j, i := range cand {
			fps[j], tokens[j], leases[j] = out[i].fp, out[i].rtoken, out[i].LeaseUntil
		}
		e.retries.remember(fps, tokens, leases, now, false)
		dropAll()
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	actions, digests, attempts := b.actions, b.digests, b.attempts
	for j, i := range cand {
		r := res[j]
		if r.Expired {
			c.leaseExpiries++
		}
		switch r.Status {
		case tier.Acquired:
			out[i].Outcome = New
			attempts[j] = r.Attempts
		case tier.Poisoned:
			// Its attempts, by any process, reached MaxAttempts.
			out[i].Outcome = Poison
			actions[j], attempts[j] = memory.Drop, r.Attempts
		case tier.Held:
			out[i].Outcome = InFlight
			actions[j] = memory.Drop
		case tier.Committed:
			if marks[j] && r.Token == e.redisToken(out[i].rtoken) {
				// The commit of a mark whose reply was lost: the caller
				// never learnt it was New, so it still is.
				out[i].Outcome = New
				continue
			}
			fallthrough
		default: // Committed, by this process or another
			c.storeHits++
			out[i].Outcome = Duplicate
			if conflicts(out[i].digest, r.Digest) {
				out[i].Outcome = Conflict
			}
			// Another process's commit is not cached: its Redis expiry is
			// unknown here, and memory must never outlive it.
			actions[j] = memory.Drop
			digests[j] = r.Digest
		}
	}
	settle()
	return nil
}

// redisToken is a claim's owner token in Redis: this engine's random ID and
// the claim's counter, unique across processes.
func (e *Engine) redisToken(t uint64) tier.Token {
	var tok tier.Token
	copy(tok[:8], e.process[:])
	binary.BigEndian.PutUint64(tok[8:], t)
	return tok
}
