package engine

import (
	"context"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/internal/hooks"

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
	if err := e.checkResults(claims); err != nil {
		return err
	}
	if e.queue != nil {
		return e.queued(ctx, claims, errs, nil)
	}
	return e.commit(ctx, claims, errs, nil)
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
	return e.commitAs(ctx, claims, errs, nil, forMark)
}

func (e *Engine) commit(ctx context.Context, claims []Claim, errs []error, writes []Write) error {
	return e.commitAs(ctx, claims, errs, writes, forClaim)
}

func (e *Engine) commitAs(ctx context.Context, claims []Claim, errs []error, writes []Write, p purpose) error {
	if errs != nil && len(errs) != len(claims) {
		return fmt.Errorf("%w: %d claims, %d errors", ErrBatch, len(claims), len(errs))
	}
	clear(errs)
	one := [1]span{{hi: len(claims), writes: writes}}
	lost, m, err := e.commitSpans(ctx, claims, errs, one[:], p)
	if err != nil {
		return err
	}
	if lost > 0 {
		return fmt.Errorf("%w: %d of %d claims", ErrLeaseLost, lost, m)
	}
	return nil
}

// span is one commit call's share of a commit: claims[lo:hi] and the
// caller's records, written only if the span has no New claim or one of
// them still owns its key (records of work whose claims are all void are
// not written).
type span struct {
	lo, hi int
	writes []Write
}

// commitSpans commits the New claims of every span in one durable write,
// with the records each span may write. errs (nil or one per claim) gets
// ErrLeaseLost or the tier's error per claim. It returns how many New
// claims lost their lease, how many there were, and the error that failed
// the write (nothing of it is acknowledged then).
func (e *Engine) commitSpans(ctx context.Context, claims []Claim, errs []error, spans []span, p purpose) (lost, m int, err error) {
	now, slot, err := e.start(ctx)
	if err != nil {
		return 0, 0, err
	}
	defer e.finish(slot)
	b := e.getBatch(len(claims))
	defer e.putBatch(b)
	b.owned(e, claims, !p.marks()) // MarkBatch holds its claims itself: no caller could change their keys
	m = len(b.cand)
	var rf *refreshes
	if p == forMark && len(claims) > 0 && claims[0].ns != nil && claims[0].ns.sliding {
		// MarkBatch's sliding duplicates (its claims are of one
		// namespace): re-committed in this write.
		rf = e.pinRefreshes(claims, now)
	}
	if m == 0 {
		// No claim was New (all duplicates, say), but the callers' records
		// (a consumed offset) and the refreshes must still land.
		if writes := b.spanWrites(spans, nil, nil); len(writes) > 0 || rf != nil {
			if err := e.writeAlone(ctx, claims, writes, rf, now); err != nil {
				return 0, 0, err
			}
		}
		return 0, 0, nil
	}
	cfps, ctokens, st := b.cfps[:m], b.ctokens[:m], b.st[:m]
	e.mem.Begin(cfps, ctokens, now, st)

	// Compact the batch to the claims that still own their keys, counting
	// per span the New claims before and after.
	b.news = b.spanCounts(spans, b.cand[:m], b.news)
	news := b.news
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
	b.kept = b.spanCounts(spans, b.cand[:k], b.kept)
	kept := b.kept
	writes := b.spanWrites(spans, news, kept)
	switch {
	case k > 0:
		fenced, err := e.durable(ctx, commitCall{claims, errs, writes, p, rf}, b, k, now)
		lost += fenced
		if err != nil {
			return lost, m, err
		}
	case len(writes) > 0 || rf != nil:
		// Every New claim lost its lease, but spans without New claims
		// have records to write, or refreshes are due.
		if err := e.writeAlone(ctx, claims, writes, rf, now); err != nil {
			return lost, m, err
		}
	}
	if lost > 0 {
		e.stats.leaseLost.Add(uint64(lost))
	}
	return lost, m, nil
}

// spanCounts counts, per span, the claim indices in idx (ascending) that
// fall in it, into counts (reused).
func (b *batch) spanCounts(spans []span, idx []int, counts []int) []int {
	if len(spans) == 1 {
		return append(counts[:0], len(idx))
	}
	counts = append(counts[:0], make([]int, len(spans))...)
	s := 0
	for _, i := range idx {
		for i >= spans[s].hi {
			s++
		}
		counts[s]++
	}
	return counts
}

// spanWrites is the records to write: those of every span with no New
// claim or one still owning its key. news and kept nil mean no span has a
// New claim.
func (b *batch) spanWrites(spans []span, news, kept []int) []Write {
	if len(spans) == 1 && (news == nil || news[0] == 0 || kept[0] > 0) {
		return spans[0].writes
	}
	w := b.writes[:0]
	for s := range spans {
		if news == nil || news[s] == 0 || kept[s] > 0 {
			w = append(w, spans[s].writes...)
		}
	}
	b.writes = w
	return w
}

// commitCall is what a commit was asked: the claims, the errors to set
// per claim (or nil), the caller's records, and whether it is a mark's.
type commitCall struct {
	claims []Claim
	errs   []error
	writes []Write
	p      purpose
	// refresh is MarkBatch's pinned sliding refreshes, written in the
	// same durable write (nil: none).
	refresh *refreshes
}

// writeAlone writes, with no New claim to commit, the callers' records and
// the pinned refreshes (either may be empty) in one durable write, then
// settles the refreshes.
func (e *Engine) writeAlone(ctx context.Context, claims []Claim, writes []Write, rf *refreshes, now int64) error {
	part := e.parts.Of(now)
	if rf == nil {
		if err := e.writer.CommitWith(ctx, part, nil, writes, nil); err != nil {
			e.stats.errors.Add(1)
			return e.tierError(err)
		}
		return nil
	}
	err := e.writeRefreshes(ctx, part, rf.reqs, rf.filterAdds(part), writes)
	rf.finish(e, claims, err == nil)
	return err
}

// durable makes the first k claims of b.cand durable (the filter first,
// then the exact tier), then turns their memory claims into committed
// entries, and returns how many the shared tier fenced out (their lease
// ended there). On a tier failure the claims go back to their leased state
// and every one gets the error.
func (e *Engine) durable(ctx context.Context, call commitCall, b *batch, k int, now int64) (fenced int, err error) {
	claims, errs := call.claims, call.errs
	cfps, ctokens, digests := b.cfps[:k], b.ctokens[:k], b.digests[:k]
	var results [][]byte // nil unless a claim stores a result
	expires := b.expires[:k]
	for j := range k {
		c := &claims[b.cand[j]]
		expires[j] = c.ns.cacheUntil(now)
		if r := c.Result; len(r) > 0 {
			if results == nil {
				results = b.results[:k]
				clear(results)
			}
			results[j] = r
		}
	}
	ok := b.ok[:k]
	for j := range ok {
		ok[j] = true
	}
	if e.where == tier.ClaimsInEngine && (e.maxAttempts > 0 || call.refresh != nil) {
		// No release's attempt count lands after this commit and erases
		// it (see Engine.counts); a refresh is ordered against Forgets.
		e.counts.RLock()
		defer e.counts.RUnlock()
	}
	if h := hooks.BeforeDurable.Load(); h != nil {
		(*h)()
	}
	part := e.parts.Of(now)
	if e.local != nil {
		// Before the durable write: the filters must have seen every key
		// the store holds.
		e.local.Add(cfps, part)
		if call.refresh != nil {
			if fps := call.refresh.filterAdds(part); len(fps) > 0 {
				e.local.Add(fps, part)
			}
		}
		if e.exact == nil {
			// Bloom-only: nothing measures its false positives; the
			// formula, from the filter's keys, warns of an overfull one.
			if p, over := e.local.Overfilled(part); over {
				e.warnFilter(p, now)
			}
		}
	}
	if e.exact != nil {
		if fenced, err = e.writeCommits(ctx, call, b, k, now, part); err != nil {
			// The claims go back to their leased state, and every one
			// gets the error; the refreshes' claims are dropped.
			if call.refresh != nil {
				call.refresh.finish(e, claims, false)
			}
			clear(ok)
			e.mem.Finish(cfps, ctokens, ok, 0, digests)
			e.stats.errors.Add(1)
			for j := range k {
				if errs != nil {
					errs[b.cand[j]] = err
				}
			}
			return 0, err
		}
	}
	e.settleCommits(b, k, expires, results, now)
	if call.refresh != nil {
		call.refresh.finish(e, claims, true)
	}
	return fenced, nil
}

// writeCommits writes the first k claims of b.cand to the exact tier in
// partition part, with the call's records, and returns how many the shared
// tier fenced out: their b.ok is false and their error ErrLeaseLost.
func (e *Engine) writeCommits(ctx context.Context, call commitCall, b *batch, k int, now, part int64) (fenced int, err error) {
	claims, errs := call.claims, call.errs
	shared := e.where == tier.ClaimsInStore
	reqs, st, ok := b.reqs[:k], b.st[:k], b.ok[:k]
	for j := range reqs {
		c := &claims[b.cand[j]]
		reqs[j] = tier.Request{NS: c.ns.name, Key: c.Key, Digest: c.digest, Window: time.Duration(c.ns.window)}
		if len(c.Result) > 0 || c.ns.window > 0 || c.ns.archiveWindow > 0 {
			// Dated: a result carries its time, a namespace with its own
			// window is judged by it, and an archived key answers with
			// the time of its commit.
			reqs[j].Result, reqs[j].At = c.Result, now
		}
		if shared {
			reqs[j].Token = e.ownerToken(c.rtoken)
			// A shared tier appends it to its archive log in the same step.
			reqs[j].Archive = e.arch != nil && c.ns.archiveWindow > 0
		}
	}
	if r := call.refresh; r != nil {
		// MarkBatch's refreshes, in the same write: the claims hold
		// distinct keys, so the batch's buffers have room for them.
		reqs, st = append(reqs, r.reqs...), b.st[:k+len(r.reqs)]
	}
	if len(call.writes) > 0 {
		err = e.writer.CommitWith(ctx, part, reqs, call.writes, st)
	} else {
		err = e.exact.Commit(ctx, part, reqs, st)
	}
	clear(reqs) // drop references to the caller's keys
	st = st[:k]
	if err != nil {
		// A shared tier may or may not have applied the commits: the
		// claims stay, so a redelivery finds either the commit or the
		// lease. A mark's caller has not processed its message: remember
		// its token, so that a retried mark that finds this commit is New.
		if call.p.marks() && shared {
			tokens, keep, attempts, marks := make([]uint64, k), make([]int64, k), make([]uint16, k), make([]bool, k)
			for j := range k {
				c := &claims[b.cand[j]]
				tokens[j], keep[j], attempts[j], marks[j] = c.firstToken(), now+e.window, c.attempts, true
			}
			e.retries.remember(b.cfps[:k], tokens, keep, attempts, marks, now)
		}
		return 0, e.tierError(err)
	}
	for j := range st {
		if st[j] != tier.OK {
			// The shared tier gave the key to another owner (our lease
			// ended there): fenced out, and our local claim is void.
			ok[j] = false
			fenced++
			if errs != nil {
				errs[b.cand[j]] = ErrLeaseLost
			}
		}
	}
	return fenced, nil
}

// settleCommits turns the memory claims of the first k claims of b.cand
// that committed (b.ok) into committed entries, and drops the void local
// claims of those the shared tier refused.
func (e *Engine) settleCommits(b *batch, k int, expires []int64, results [][]byte, now int64) {
	cfps, ctokens, digests, ok := b.cfps[:k], b.ctokens[:k], b.digests[:k], b.ok[:k]
	e.mem.FinishResults(cfps, ctokens, ok, expires, digests, results, now)
	clear(results) // drop references to the caller's results
	var committed uint64
	for j := range ok {
		if ok[j] {
			committed++
		} else {
			b.actions[j] = memory.Drop
		}
	}
	if committed < uint64(k) {
		for j := range ok {
			if ok[j] {
				b.actions[j] = memory.Keep
			}
		}
		e.mem.Settle(cfps, ctokens, b.actions[:k], b.expires[:k], digests, nil)
	}
	e.stats.commits.Add(committed)
}
