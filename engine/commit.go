package engine

import (
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

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
type Write = tier.Write

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
	if err := e.need(e.writer != nil, "CommitBatchWith", "a tier that writes with commits"); err != nil {
		return err
	}
	return e.commit(ctx, claims, errs, writes)
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

// commitMarks commits MarkBatch's claims: as commit, and a shared tier's
// commit whose reply is lost is remembered as a mark, so the retry of the mark
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
			if err := e.writer.CommitWith(ctx, e.parts.Of(now), nil, writes, nil); err != nil {
				e.stats.errors.Add(1)
				return e.tierError(err)
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

// durable makes the first k claims of b.cand durable (the filter first,
// then the exact tier), then turns their memory claims into committed entries. On a tier
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
	if e.exact != nil {
		shared := e.where == tier.ClaimsInStore
		reqs, st := b.reqs[:k], b.st[:k]
		for j := range reqs {
			c := &claims[b.cand[j]]
			reqs[j] = tier.Request{NS: c.ns.name, Key: c.Key, Digest: c.digest}
			if shared {
				reqs[j].Token = e.ownerToken(c.rtoken)
			}
		}
		var err error
		if len(writes) > 0 {
			err = e.writer.CommitWith(ctx, part, reqs, writes, st)
		} else {
			err = e.exact.Commit(ctx, part, reqs, st)
		}
		clear(reqs) // drop references to the caller's keys
		if err != nil {
			// A shared tier may or may not have applied the commits: the
			// claims stay, so a redelivery finds either the commit or the
			// lease. A mark's caller has not processed its message:
			// remember its token, so that a retried mark that finds this
			// commit is New.
			if mark && shared {
				tokens, keep := make([]uint64, k), make([]int64, k)
				for j := range k {
					tokens[j], keep[j] = claims[b.cand[j]].rtoken, now+e.window
				}
				e.retries.remember(cfps, tokens, keep, now, true)
			}
			return fail(e.tierError(err))
		}
		for j := range st {
			if st[j] != tier.OK {
				// The shared tier gave the key to another owner (our lease
				// ended there): fenced out, and our local claim is void.
				ok[j] = false
				*lost++
				if errs != nil {
					errs[b.cand[j]] = ErrLeaseLost
				}
			}
		}
	}
	e.mem.Finish(cfps, ctokens, ok, now+e.cacheFor, digests)
	var committed uint64
	for j := range ok {
		if ok[j] {
			committed++
		} else {
			b.actions[j] = memory.Drop
		}
	}
	if committed < uint64(k) {
		// Drop the void local claims of keys the shared tier refused.
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
