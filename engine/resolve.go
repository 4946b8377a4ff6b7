package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// purpose says what a claim call is for, and so who commits its claims.
type purpose uint8

const (
	// forClaim: the caller commits or releases the claims (Claim, Do).
	forClaim purpose = iota
	// forMark: MarkBatch's own claims, which it commits right after.
	forMark
	// forMarkInTier: MarkBatch over a Marker tier, which commits every
	// key it acquires in the claim itself.
	forMarkInTier
)

// marks reports a MarkBatch's claim: its caller never holds the claims.
func (p purpose) marks() bool { return p != forClaim }

// resolve decides the keys that memory acquired (b.cand) from the filter
// and the exact tier. Memory holds a claim on each while this runs, so no
// other caller in this process can decide them meanwhile. With neither,
// every acquired key is New; with a filter alone, its "maybe" is final
// (answered Duplicate, at its false-positive rate); with an exact tier, a
// warm filter's "no" is final and everything else is the tier's answer.
// For forMarkInTier the tier commits every key it acquires in the same
// step, and memory keeps them as committed.
func (e *Engine) resolve(ctx context.Context, b *batch, ns *Namespace, out []Claim, c *tally, now int64, p purpose) error {
	if e.local == nil && e.exact == nil {
		for _, i := range b.cand {
			out[i].Outcome = New
		}
		return nil
	}
	d := e.decision(b)
	oldest, proves := e.filterMasks(d.fps, b.probes)
	if e.exact == nil {
		e.answerFromFilter(b, ns, out, d, oldest, now)
		return nil
	}
	reqs := e.exactRequests(b, ns, out, c, now, oldest, proves)
	if len(reqs) == 0 {
		if proves {
			e.observeFilters(b, oldest, now)
		}
		if e.arch == nil {
			return nil
		}
		err := e.resolveArchive(ctx, b, ns, out, d, c, now)
		if err != nil {
			d.dropAll()
		}
		d.settle(e)
		return err
	}
	if p == forMarkInTier && e.arch != nil {
		// Behind the archive (Namespace.marksInTier): read it first, then
		// mark what it does not hold, bound by LogBy.
		var err error
		if reqs, err = e.archiveBeforeMark(ctx, b, ns, out, d, c, now, reqs); err != nil {
			// Nothing was written: the earlier calls' tokens this call
			// took (exactRequests) were never sent, and their retry must
			// still find what those calls may have committed.
			e.retriesBack(b, out, now)
			d.dropAll()
			d.settle(e)
			return err
		}
	}
	ans := b.ans[:len(reqs)]
	clear(ans) // a tier may set only some fields
	c.storeReads += uint64(len(reqs))
	var err error
	if p == forMarkInTier {
		for q := range reqs {
			// Committed in the claim: for the namespace's window, in a
			// tier that expires keys itself.
			reqs[q].Window = time.Duration(ns.window)
		}
		if len(reqs) > 0 {
			err = e.marker.Mark(ctx, reqs, ans)
		}
	} else {
		// The attempt counts read here are the release's to write: a
		// release frees its claim in memory before its count is durable
		// (Engine.counts), and a claim that took the key in that gap would
		// read the count the released claim left (a durable claim's own
		// attempt, given back uncounted: Poison under MaxAttempts 1 for a
		// request whose first run failed cleanly). The read waits for the
		// release's write.
		counted := e.where == tier.ClaimsInEngine && e.maxAttempts > 0
		if counted {
			e.counts.RLock()
		}
		err = e.exact.Claim(ctx, reqs, time.Duration(e.lease), ans)
		if counted {
			e.counts.RUnlock()
		}
	}
	if err == nil {
		err = e.decideAll(d, b, ns, out, c, now, p, proves)
		if err == nil && proves {
			e.observeFilters(b, oldest, now)
		}
		if err == nil && ns.sliding {
			if p == forMark {
				// Written with the batch's commits, in their durable
				// write, before MarkBatch answers (deferRefresh).
				e.deferRefresh(b, out, d, now)
			} else {
				err = e.refresh(ctx, b, ns, out, d, now)
			}
		}
		if err == nil && e.arch != nil && p != forMarkInTier {
			if err = e.resolveArchive(ctx, b, ns, out, d, c, now); err != nil {
				e.rememberAdopted(b, out, now)
			}
		}
	} else {
		e.claimFailed(b, out, now, p)
		if p == forMarkInTier {
			e.giveBackMarks(ctx, b, ns, out, now)
		}
		err = e.tierError(err)
	}
	clear(reqs)
	if err != nil {
		d.dropAll()
	}
	// Committed keys become committed entries in memory; New keys stay
	// claimed; on an error every claim is given back.
	d.settle(e)
	return err
}

// decision is what memory is told of the candidates once they are decided:
// per candidate j (b.cand[j]), its fingerprint and claim token, and the
// action, expiry, digest and attempt count it settles with.
type decision struct {
	fps      []shard.Fingerprint
	tokens   []uint64
	actions  []memory.Action
	expires  []int64
	digests  []tier.Digest
	attempts []uint16
	// slide marks the candidates a sliding namespace re-commits now
	// (refresh).
	slide []bool
}

// decision returns the candidates' decision, every action Keep.
func (e *Engine) decision(b *batch) decision {
	m := len(b.cand)
	d := decision{fps: b.candidates(), tokens: b.ctokens[:m], actions: b.actions[:m], expires: b.expires[:m], digests: b.digests[:m], attempts: b.attempts[:m], slide: b.slide[:m]}
	for j, i := range b.cand {
		d.tokens[j] = b.tokens[i]
	}
	clear(d.actions) // Keep
	clear(d.digests)
	clear(d.attempts)
	clear(d.slide)
	return d
}

func (d decision) settle(e *Engine) {
	e.mem.Settle(d.fps, d.tokens, d.actions, d.expires, d.digests, d.attempts)
}

// dropAll gives every candidate's claim back: nothing was decided.
func (d decision) dropAll() {
	for j := range d.actions {
		d.actions[j] = memory.Drop
	}
}

// commit makes candidate j committed in memory with digest until expires.
func (d decision) commit(j int, expires int64, digest tier.Digest) {
	d.actions[j], d.expires[j], d.digests[j] = memory.Commit, expires, digest
}

// answerFromFilter answers the candidates of bloom-only, whose filter is
// the only source: a maybe is Duplicate, at the configured false-positive
// rate, and its claim is given back. In a sliding namespace a Duplicate
// the current partition's filter does not hold yet is added to it, its
// refresh (the probes count from oldest).
func (e *Engine) answerFromFilter(b *batch, ns *Namespace, out []Claim, d decision, oldest, now int64) {
	var slide []shard.Fingerprint
	cur := e.parts.Of(now)
	for j, i := range b.cand {
		out[i].Outcome = New
		if m := b.probes[j].Maybe; m != 0 {
			out[i].Outcome = Duplicate
			out[i].digest = Digest{} // no digest is known: none conflicts
			d.actions[j] = memory.Drop
			if ns.sliding && (cur-oldest >= 64 || m&(1<<(cur-oldest)) == 0) {
				slide = append(slide, d.fps[j])
			}
		}
	}
	if len(slide) > 0 {
		e.local.Add(slide, cur)
		e.stats.refreshes.Add(uint64(len(slide)))
	}
	d.settle(e)
}

// exactRequests answers New every candidate the filter proves absent and
// returns the requests for the others (b.qidx[q] is request q's candidate),
// in a shared tier with the owner token of the claim, or of the earlier
// claim whose reply was lost.
func (e *Engine) exactRequests(b *batch, ns *Namespace, out []Claim, c *tally, now, oldest int64, proves bool) []tier.Request {
	shared := e.where == tier.ClaimsInStore
	reqs, qidx := b.reqs[:0], b.qidx[:0]
	retried := b.marks[:len(b.cand)]
	clear(retried)
	for j, i := range b.cand {
		if proves && b.probes[j].Maybe == 0 {
			out[i].Outcome = New
			c.bloomNegatives++
			continue
		}
		r := tier.Request{NS: ns.name, Key: out[i].Key, Digest: out[i].digest, Oldest: oldest, Mask: b.probes[j].Maybe}
		if shared {
			// Every call sends tokens of its own, never an earlier call's:
			// a give-back names its call, and a late copy of it cannot
			// touch this call's claims or commits.
			out[i].rtoken, out[i].earlier = out[i].token, 0
			if rt, ok := e.retries.take(out[i].fp, now); ok {
				// A retry of a call whose reply was lost: the tier adopts
				// what the earlier calls' tokens hold (Request.Earlier).
				out[i].earlier, out[i].attempts = rt.token, rt.attempts
				retried[j] = true
				if !rt.mark {
					// No more lease than that claim has in the tier.
					out[i].LeaseUntil = min(out[i].LeaseUntil, rt.leaseUntil)
				}
				r.Earlier = e.ownerToken(rt.token)
			}
			r.Token = e.ownerToken(out[i].rtoken)
		}
		reqs = append(reqs, r)
		qidx = append(qidx, j)
	}
	b.reqs, b.qidx = reqs, qidx
	return reqs
}

// claimFailed remembers, in a shared tier, the tokens of claims whose
// outcome is unknown (they may hold the keys in the tier now), so their
// retries recognise them.
func (e *Engine) claimFailed(b *batch, out []Claim, now int64, p purpose) {
	if e.where != tier.ClaimsInStore {
		return
	}
	n := len(b.reqs)
	fps := make([]shard.Fingerprint, n)
	tokens, leases, marks := make([]uint64, n), make([]int64, n), make([]bool, n)
	for q, j := range b.qidx {
		i := b.cand[j]
		fps[q], tokens[q], leases[q] = out[i].fp, out[i].firstToken(), out[i].LeaseUntil
		if p == forMarkInTier || b.marks[j] {
			// A mark may have committed, or this retry may have adopted
			// an earlier call's commit: its retry must find it its own.
			leases[q], marks[q] = now+e.window, true
		}
	}
	e.retries.remember(fps, tokens, leases, nil, marks, now)
}

// retriesBack remembers again the earlier calls' tokens that
// exactRequests took for this call's requests (b.marks) when the call
// fails before any request reached the tier: the outcome of those calls
// is as unknown as before, and a redelivery must still adopt what they
// may hold (a mark committed with its reply lost), or it would answer
// Duplicate for a message nobody processed.
func (e *Engine) retriesBack(b *batch, out []Claim, now int64) {
	e.rememberMarks(b, out, now, func(j, _ int) bool { return b.marks[j] })
}

// rememberAdopted remembers, when the call fails after its claims were
// answered, the tokens of the claims that adopted their own lost mark's
// commit (Claim.undo: the tier moved that commit to this call's token,
// and nothing gives it back), so that a redelivery adopts it again: the
// earliest token covers this call's (the tier adopts any token from it up
// to the caller's). Without it a message nobody processed answered
// Duplicate at its redelivery.
func (e *Engine) rememberAdopted(b *batch, out []Claim, now int64) {
	e.rememberMarks(b, out, now, func(_, i int) bool { return out[i].Outcome == New && out[i].undo })
}

// rememberMarks remembers, as calls that may have committed (for the
// window), the earliest token of each request (candidate j, key i) pick
// selects.
func (e *Engine) rememberMarks(b *batch, out []Claim, now int64, pick func(j, i int) bool) {
	var fps []shard.Fingerprint
	var tokens []uint64
	var leases []int64
	var attempts []uint16
	var marks []bool
	for _, j := range b.qidx {
		i := b.cand[j]
		if !pick(j, i) {
			continue
		}
		fps, tokens = append(fps, out[i].fp), append(tokens, out[i].firstToken())
		leases, attempts, marks = append(leases, now+e.window), append(attempts, out[i].attempts), append(marks, true)
	}
	if len(fps) > 0 {
		e.retries.remember(fps, tokens, leases, attempts, marks, now)
	}
}

// giveBackMarks gives back, in a shared tier, the marks of a failed Mark
// call: one the tier applied although the reply was lost is undone (a
// commit carrying its token), and one still on its way is fenced out
// (Unmarker), so the caller, told the mark failed, finds the key New
// again in any process. A give-back that cannot reach the tier leaves the
// retry of this process to find its own mark (claimFailed).
func (e *Engine) giveBackMarks(ctx context.Context, b *batch, ns *Namespace, out []Claim, now int64) {
	if e.where != tier.ClaimsInStore || len(b.qidx) == 0 {
		return
	}
	reqs, st := make([]tier.Request, len(b.qidx)), make([]tier.Status, len(b.qidx))
	for q, j := range b.qidx {
		i := b.cand[j]
		reqs[q] = tier.Request{NS: ns.name, Key: out[i].Key, Token: e.ownerToken(out[i].rtoken), Attempts: out[i].attempts}
	}
	gctx, cancel := giveBackContext(ctx)
	defer cancel()
	if u, ok := e.unmarker(); ok {
		fence := time.Duration(e.lease)
		if len(b.reqs) > 0 && b.reqs[0].LogBy > 0 {
			// A logged mark's message may still commit until LogBy, by
			// the tier's clock (within LogSkew of this one's): the fence
			// outlasts it, whatever the Lease.
			fence = max(fence, time.Duration(b.reqs[0].LogBy-now)+tier.LogSkew)
		}
		_ = u.Unmark(gctx, reqs, fence, st)
		return
	}
	_ = e.exact.Release(gctx, e.parts.Of(now), reqs, true, st)
}

// unmarker returns the exact tier's Unmarker, under the fail-open wrapper.
func (e *Engine) unmarker() (tier.Unmarker, bool) {
	base := e.exact
	if f, ok := base.(failOpen); ok {
		base = f.Exact
	}
	u, ok := base.(tier.Unmarker)
	return u, ok
}

// tierError wraps an exact tier's failure: ErrUnavailable for a shared
// tier (a server that may come back), ErrStorage for the embedded one.
func (e *Engine) tierError(err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err // the archive's, already classified
	}
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
