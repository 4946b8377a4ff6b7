package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
	"github.com/tierdedup/tierdedup/tier/memory"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// Namespace is one key space of an Engine: the same key bytes in two
// namespaces are two keys. Consumers commonly dedup message IDs in one and
// business keys (order:42) in another. The Engine's own methods use the
// default namespace, named "". A Namespace is safe for concurrent use.
type Namespace struct {
	e    *Engine
	name string
}

// Namespace returns the namespace called name (at most MaxNamespace bytes,
// any bytes); "" is the default namespace.
func (e *Engine) Namespace(name string) (*Namespace, error) {
	if len(name) > MaxNamespace {
		return nil, fmt.Errorf("%w: name of %d bytes, max %d", ErrNamespace, len(name), MaxNamespace)
	}
	if name == "" {
		return &e.def, nil
	}
	return &Namespace{e: e, name: name}, nil
}

// Name returns the namespace's name.
func (n *Namespace) Name() string { return n.name }

// Claim claims key in the default namespace; see Namespace.Claim.
func (e *Engine) Claim(ctx context.Context, key []byte) (Claim, error) {
	return e.def.Claim(ctx, key)
}

// ClaimBatch claims keys in the default namespace; see Namespace.ClaimBatch.
func (e *Engine) ClaimBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Claim) error {
	return e.def.ClaimBatch(ctx, keys, digests, out)
}

// MarkIfAbsent marks key in the default namespace; see
// Namespace.MarkIfAbsent.
func (e *Engine) MarkIfAbsent(ctx context.Context, key []byte) (Outcome, error) {
	return e.def.MarkIfAbsent(ctx, key)
}

// MarkBatch marks keys in the default namespace; see Namespace.MarkBatch.
func (e *Engine) MarkBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Outcome) error {
	return e.def.MarkBatch(ctx, keys, digests, out)
}

// Do runs fn once for key in the default namespace; see Namespace.Do.
func (e *Engine) Do(ctx context.Context, key []byte, fn func(context.Context) error) (Outcome, error) {
	return e.def.Do(ctx, key, fn)
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
	err := n.e.claim(ctx, n, keys[:], digests[:], out[:])
	return out[0], err
}

// ClaimBatch claims every key at once, one Claim per key in out (which must
// have len(keys)); digests is nil or one per key. A key repeated in the
// batch is New at most once, its repeats InFlight. On error no claim is
// held and out is unspecified.
func (n *Namespace) ClaimBatch(ctx context.Context, keys [][]byte, digests []Digest, out []Claim) error {
	return n.e.claim(ctx, n, keys, digests, out)
}

// MarkIfAbsent claims and commits key in one step: New means it was absent
// and is now marked (durably, as configured), Duplicate or Conflict that it
// was marked before, InFlight that a two-phase claim holds it.
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
	b := n.e.getBatch(len(keys))
	defer n.e.putBatch(b)
	claims, errs := b.claims[:len(keys)], b.errs[:len(keys)]
	if err := n.e.claim(ctx, n, keys, digests, claims); err != nil {
		return err
	}
	if err := n.e.commitMarks(ctx, claims, errs); err != nil && !errors.Is(err, ErrLeaseLost) {
		// Nothing is known to be durable (a failed Pebble batch wrote
		// nothing; a Redis commit whose reply was lost is remembered, so
		// the retry of this mark is New): give the claims back.
		gctx, cancel := giveBackContext(ctx)
		_ = n.e.releaseAs(gctx, claims, nil, true)
		cancel()
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

// giveBackMargin bounds how long giving claims back (the Release after a
// failed handler, or of a batch that did not commit) may outlive the
// caller's deadline: the give-back must run even when the caller's context
// has ended, but never hang on a server that stopped answering.
const giveBackMargin = 250 * time.Millisecond

// giveBackContext is ctx without its cancellation, bounded by its deadline
// (or now, if that has passed) plus giveBackMargin.
func giveBackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)
	d, ok := ctx.Deadline()
	if !ok {
		return base, func() {}
	}
	if now := time.Now(); d.Before(now) {
		d = now
	}
	return context.WithDeadline(base, d.Add(giveBackMargin))
}

// Do runs fn for key exactly once inside the window: it claims the key,
// runs fn if the claim is New, then commits (fn returned nil) or releases
// (fn failed or panicked, so a redelivery can run it). It returns the claim's
// outcome and fn's error or the engine's. Ack the message when the error is
// nil and the outcome is New or Duplicate; leave InFlight for redelivery;
// dead-letter Conflict and Poison.
func (n *Namespace) Do(ctx context.Context, key []byte, fn func(context.Context) error) (o Outcome, err error) {
	c, err := n.Claim(ctx, key)
	if err != nil || c.Outcome != New {
		return c.Outcome, err
	}
	committed := false
	defer func() {
		if !committed {
			gctx, cancel := giveBackContext(ctx)
			defer cancel()
			if rerr := n.e.Release(gctx, c); rerr != nil {
				err = errors.Join(err, rerr)
			}
		}
	}()
	if err := fn(ctx); err != nil {
		return New, err
	}
	committed = true
	return New, n.e.Commit(ctx, c)
}

// Commit makes a New claim's key a Duplicate for the rest of the window. It
// returns once the commit is durable as configured; ack the message after
// it. A claim that lost its lease gets ErrLeaseLost and changes nothing.
func (e *Engine) Commit(ctx context.Context, c Claim) error {
	return e.single(ctx, c, e.CommitBatch)
}

// single runs a batch operation on one claim and returns its error.
func (e *Engine) single(ctx context.Context, c Claim, op func(context.Context, []Claim, []error) error) error {
	if c.Outcome != New {
		return fmt.Errorf("%w: outcome %v", ErrNotClaimed, c.Outcome)
	}
	claims := [1]Claim{c}
	var errs [1]error
	if err := op(ctx, claims[:], errs[:]); err != nil {
		return err
	}
	return errs[0]
}

// CommitBatch commits every New claim in claims with one durable write
// (claims of other outcomes are skipped). errs is nil or one per claim. It
// returns nil when every New claim committed; otherwise an error matching
// ErrLeaseLost or ErrStorage, and errs says which.
func (e *Engine) CommitBatch(ctx context.Context, claims []Claim, errs []error) error {
	return e.commit(ctx, claims, errs, nil)
}

// Write is a caller's own key and value for CommitBatchWith.
type Write struct {
	Key, Value []byte
}

// CommitBatchWith is CommitBatch that also writes the caller's records in
// the same atomic, durable batch of the embedded store (Default only): the
// effect of processing a message (a ledger entry, an outbox row, a new
// balance) and the mark that it was processed become durable together, so a
// crash can leave neither half without the other. The caller's keyspace is
// separate from the dedup keys and never expired; read it with ScanWrites.
// A batch with no New claim (every message a duplicate) still writes the
// records, durably, so a consumed offset stored with them advances. If
// there were New claims and every one lost its lease, nothing is written
// and the error matches ErrLeaseLost: the records describe work whose
// claims are void.
func (e *Engine) CommitBatchWith(ctx context.Context, claims []Claim, errs []error, writes []Write) error {
	if err := e.needStore("CommitBatchWith"); err != nil {
		return err
	}
	return e.commit(ctx, claims, errs, writes)
}

// userWrites converts the caller's writes for the store.
func userWrites(writes []Write) []pebble.UserWrite {
	if len(writes) == 0 {
		return nil
	}
	user := make([]pebble.UserWrite, len(writes))
	for i, w := range writes {
		user[i] = pebble.UserWrite{Key: w.Key, Value: w.Value}
	}
	return user
}

// needStore reports ErrOptions for an operation of the embedded store in a
// configuration without one.
func (e *Engine) needStore(op string) error {
	if e.store == nil {
		return fmt.Errorf("%w: %s needs the embedded store (Tiers: Default), have %v", ErrOptions, op, e.tiers)
	}
	return nil
}

// withStore runs fn on the embedded store unless the engine is closed.
func (e *Engine) withStore(op string, fn func(*pebble.Store) error) error {
	if err := e.needStore(op); err != nil {
		return err
	}
	e.life.RLock()
	defer e.life.RUnlock()
	if e.life.closed {
		return ErrClosed
	}
	return fn(e.store)
}

// Compact flushes and compacts the embedded store now (Default only), so
// that dropped partitions leave the disk and its size reflects compacted
// data; for maintenance windows and capacity measurements. It can take
// minutes on a large store; calls proceed meanwhile.
func (e *Engine) Compact(ctx context.Context) error {
	return e.withStore("Compact", func(s *pebble.Store) error {
		if err := s.Compact(ctx); err != nil {
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return nil
	})
}

// ScanWrites calls fn for each record written by CommitBatchWith whose key
// starts with prefix, in key order; key and value are valid only during the
// call. A read failure is ErrStorage and latches, as for claims.
func (e *Engine) ScanWrites(prefix []byte, fn func(key, value []byte) error) error {
	return e.withStore("ScanWrites", func(s *pebble.Store) error {
		err := s.ScanUser(prefix, fn)
		if errors.Is(err, pebble.ErrStorage) {
			e.stats.errors.Add(1)
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
		return err
	})
}

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

func (e *Engine) claim(ctx context.Context, ns *Namespace, keys [][]byte, digests []Digest, out []Claim) error {
	n := len(keys)
	if len(out) != n || (digests != nil && len(digests) != n) {
		return fmt.Errorf("%w: %d keys, %d digests, %d claims", ErrBatch, n, len(digests), len(out))
	}
	if err := e.checkKeys(keys); err != nil {
		return err
	}
	now, err := e.start(ctx)
	if err != nil {
		return err
	}
	defer e.leave()
	b := e.getBatch(n)
	defer e.putBatch(b)
	first := e.tokens.Add(uint64(n)) - uint64(n) + 1
	for i, k := range keys {
		b.fps[i] = shard.Sum(e.hasher, ns.name, k)
		b.tokens[i] = first + uint64(i)
	}
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
	if err := e.persistExpiries(b, ns, keys, now); err != nil {
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
		if err := e.resolve(ctx, b, ns, out, &c, now); err != nil {
			c.errors++
			e.stats.add(&c)
			return err
		}
		if len(cand) < n {
			repeatsFollow(b, out)
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
// memory held its claim, so the repeats saw InFlight. A first occurrence
// that turned out New keeps its repeats InFlight: it holds the claim.
func repeatsFollow(b *batch, out []Claim) {
	for i := range out {
		if out[i].Outcome != InFlight || b.res[i].Status != tier.Held {
			continue
		}
		for j, first := range b.cand {
			if first >= i {
				break
			}
			if out[first].fp != out[i].fp {
				continue
			}
			switch out[first].Outcome {
			case Duplicate, Conflict:
				out[i].Outcome = Duplicate
				if conflicts(out[i].digest, b.digests[j]) {
					out[i].Outcome = Conflict
				}
			}
			break
		}
	}
}

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

// owned gathers the New claims of a batch into b.cand, b.cfps and b.ctokens.
// A claim made by another Engine (one closed since, or another process's),
// or whose Key bytes no longer hash to the key it claimed, gets token 0,
// which is never issued, so memory reports it lost.
func (b *batch) owned(e *Engine, claims []Claim, verify bool) {
	cand := b.cand[:0]
	for i := range claims {
		c := &claims[i]
		if c.Outcome != New {
			continue
		}
		token := c.token
		if c.ns == nil || c.ns.e != e || (verify && shard.Sum(e.hasher, c.ns.name, c.Key) != c.fp) {
			// Another engine's claim, or one whose key bytes changed
			// since Claim (a reused buffer): it cannot commit or release
			// what it claimed.
			token = 0
		}
		b.cfps[len(cand)], b.ctokens[len(cand)] = c.fp, token
		cand = append(cand, i)
	}
	b.cand = cand
}

// commitMarks commits MarkBatch's claims: as commit, and a Redis commit
// whose reply is lost is remembered as a mark, so the retry of the mark
// finds its own commit New rather than a Duplicate of itself.
func (e *Engine) commitMarks(ctx context.Context, claims []Claim, errs []error) error {
	return e.commitAs(ctx, claims, errs, nil, true)
}

func (e *Engine) commit(ctx context.Context, claims []Claim, errs []error, writes []Write) error {
	return e.commitAs(ctx, claims, errs, writes, false)
}

func (e *Engine) commitAs(ctx context.Context, claims []Claim, errs []error, writes []Write, mark bool) error {
	if errs != nil && len(errs) != len(claims) {
		return fmt.Errorf("%w: %d claims, %d errors", ErrBatch, len(claims), len(errs))
	}
	clear(errs)
	now, err := e.start(ctx)
	if err != nil {
		return err
	}
	defer e.leave()
	b := e.getBatch(len(claims))
	defer e.putBatch(b)
	b.owned(e, claims, !mark) // MarkBatch holds its claims itself: no caller could change their keys
	m := len(b.cand)
	if m == 0 {
		if len(writes) > 0 {
			// No message of the batch was New (all duplicates, say), but
			// the caller's records (a consumed offset) must still land.
			if err := e.store.WriteWith(nil, userWrites(writes)); err != nil {
				e.stats.errors.Add(1)
				return fmt.Errorf("%w: %w", ErrStorage, err)
			}
		}
		return nil
	}
	cfps, ctokens, st := b.cfps[:m], b.ctokens[:m], b.st[:m]
	e.mem.Begin(cfps, ctokens, now, st)

	// Compact the batch to the claims that still own their keys.
	lost := 0
	k := 0
	for j := range m {
		i := b.cand[j]
		if st[j] != tier.OK {
			lost++
			if errs != nil {
				errs[i] = ErrLeaseLost
			}
			continue
		}
		cfps[k], ctokens[k], b.cand[k] = cfps[j], ctokens[j], i
		b.digests[k] = claims[i].digest
		k++
	}
	if k > 0 {
		if err := e.durable(ctx, claims, b, k, now, errs, &lost, writes, mark); err != nil {
			return err
		}
	}
	if lost > 0 {
		e.stats.leaseLost.Add(uint64(lost))
		return fmt.Errorf("%w: %d of %d claims", ErrLeaseLost, lost, m)
	}
	return nil
}

// durable makes the first k claims of b.cand durable in the configured
// tiers, then turns their memory claims into committed entries. On a tier
// failure the claims go back to their leased state and every one gets the
// error.
func (e *Engine) durable(ctx context.Context, claims []Claim, b *batch, k int, now int64, errs []error, lost *int, writes []Write, mark bool) error {
	cfps, ctokens, digests := b.cfps[:k], b.ctokens[:k], b.digests[:k]
	ok := b.ok[:k]
	for j := range ok {
		ok[j] = true
	}
	fail := func(err error) error {
		clear(ok)
		e.mem.Finish(cfps, ctokens, ok, 0, digests)
		e.stats.errors.Add(1)
		for j := range k {
			if errs != nil {
				errs[b.cand[j]] = err
			}
		}
		return err
	}
	part := e.parts.Of(now)
	if e.bloom != nil {
		// Before the durable write: the filters must have seen every key
		// the store holds.
		e.bloom.Add(cfps, part)
	}
	switch {
	case e.store != nil:
		recs := b.recs[:k]
		for j := range recs {
			c := &claims[b.cand[j]]
			recs[j] = pebble.Record{Partition: part, NS: c.ns.name, Key: c.Key,
				Value: pebble.Value{State: pebble.StateCommitted, Digest: c.digest}}
		}
		err := e.store.WriteWith(recs, userWrites(writes))
		clear(recs) // drop references to the caller's keys
		if err != nil {
			return fail(fmt.Errorf("%w: %w", ErrStorage, err))
		}
	case e.redis != nil:
		reqs, st := b.rreqs[:k], b.rst[:k]
		for j := range reqs {
			c := &claims[b.cand[j]]
			reqs[j] = redis.Request{NS: c.ns.name, Key: c.Key, Token: e.redisToken(c.rtoken), Digest: c.digest}
		}
		err := e.redis.Commit(ctx, reqs, st)
		clear(reqs)
		switch {
		case err != nil && e.failOpen:
			e.stats.failOpen.Add(uint64(k))
		case err != nil:
			// The commits may or may not have been applied: the claims
			// stay, so a redelivery finds either the commit or the lease.
			// A mark's caller has not processed its message: remember its
			// token, so that a retried mark that finds this commit is New.
			if mark {
				tokens, keep := make([]uint64, k), make([]int64, k)
				for j := range k {
					tokens[j], keep[j] = claims[b.cand[j]].rtoken, now+e.window
				}
				e.retries.remember(cfps, tokens, keep, now, true)
			}
			return fail(fmt.Errorf("%w: %w", ErrUnavailable, err))
		default:
			for j := range st {
				if st[j] != tier.OK {
					// Redis gave the key to another owner (our lease ended
					// there): fenced out, and our local claim is void.
					ok[j] = false
					*lost++
					if errs != nil {
						errs[b.cand[j]] = ErrLeaseLost
					}
				}
			}
		}
	}
	e.mem.Finish(cfps, ctokens, ok, now+e.window, digests)
	var committed uint64
	for j := range ok {
		if ok[j] {
			committed++
		} else if e.redis != nil {
			b.actions[j] = memory.Drop
		}
	}
	if committed < uint64(k) {
		// Drop the void local claims of keys Redis refused.
		for j := range ok {
			if ok[j] {
				b.actions[j] = memory.Keep
			}
		}
		e.mem.Settle(cfps, ctokens, b.actions[:k], b.expires[:k], digests, nil)
	}
	e.stats.commits.Add(committed)
	return nil
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

// persistExpiries makes durable the attempt counts that lease expiries
// reached in this claim call (embedded store with MaxAttempts only), so a
// restart sees them too.
func (e *Engine) persistExpiries(b *batch, ns *Namespace, keys [][]byte, now int64) error {
	if e.store == nil || e.maxAttempts == 0 {
		return nil
	}
	var recs []pebble.Record
	for i := range keys {
		if r := b.res[i]; r.Expired {
			recs = append(b.recs[:len(recs)], releasedRecord(e.parts.Of(now), ns.name, keys[i], r.Attempts))
			b.cfps[len(recs)-1] = b.fps[i]
		}
	}
	if len(recs) == 0 {
		return nil
	}
	err := e.writeAttempts(b.cfps[:len(recs)], recs)
	clear(recs)
	return err
}
