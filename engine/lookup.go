package engine

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/memory"
)

// KeyInfo is what the engine knows of one key, read by Lookup or found by
// Forget.
type KeyInfo struct {
	// Outcome is what a claim of the key would have answered: New (nothing
	// committed inside the window; Attempts may count failed claims),
	// Duplicate (committed), InFlight (a claim holds it) or Poison.
	Outcome Outcome
	// Attempts counts the key's failed claims (Options.MaxAttempts).
	Attempts uint16
	// Digest, Result and CommittedAt are the commit's (Duplicate): its
	// payload digest, stored result and time (zero without a result,
	// except in an answer from the archive: with an archive every commit
	// of a namespace it keeps is dated; behind Redis, a commit without a
	// result by Redis's clock, to the millisecond).
	Digest      Digest
	Result      []byte
	CommittedAt int64
	// CommittedBefore is the end of the partition holding the commit
	// (Duplicate read from the exact tier or the archive): the commit was
	// made in the Partition before it. Zero when the tier cannot tell.
	CommittedBefore int64
	// Source is the tier that answered.
	Source Source
}

// Source names the tier that answered a Lookup.
type Source uint8

// Sources.
const (
	// SourceMemory: the memory table (a claim in flight, a cached commit,
	// or memory-only's answer).
	SourceMemory Source = iota + 1
	// SourceFilter: the Bloom filters proved the key absent.
	SourceFilter
	// SourceStore: the exact tier (embedded store or shared tier).
	SourceStore
	// SourceArchive: the archive (Options.Archive), or a partition that
	// left the window before the archive took it.
	SourceArchive
)

var sourceNames = [...]string{"", "memory", "filter", "store", "archive"}

// String returns the source's name.
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "Source(" + strconv.Itoa(int(s)) + ")"
}

// Lookup reads key's state in the default namespace; see
// Namespace.LookupBatch.
func (e *Engine) Lookup(ctx context.Context, key []byte) (KeyInfo, error) {
	return e.def.Lookup(ctx, key)
}

// Forget removes key from the default namespace; see Namespace.ForgetBatch.
func (e *Engine) Forget(ctx context.Context, key []byte) (KeyInfo, error) {
	return e.def.Forget(ctx, key)
}

// LookupBatch reads keys' states in the default namespace; see
// Namespace.LookupBatch.
func (e *Engine) LookupBatch(ctx context.Context, keys [][]byte, out []KeyInfo) error {
	return e.def.LookupBatch(ctx, keys, out)
}

// ForgetBatch removes keys from the default namespace; see
// Namespace.ForgetBatch.
func (e *Engine) ForgetBatch(ctx context.Context, keys [][]byte, out []KeyInfo) error {
	return e.def.ForgetBatch(ctx, keys, out)
}

// Lookup is LookupBatch for one key.
func (n *Namespace) Lookup(ctx context.Context, key []byte) (KeyInfo, error) {
	keys := [1][]byte{key}
	var out [1]KeyInfo
	err := n.LookupBatch(ctx, keys[:], out[:])
	return out[0], err
}

// Forget is ForgetBatch for one key: an error matching ErrInFlight when a
// claim holds it.
func (n *Namespace) Forget(ctx context.Context, key []byte) (KeyInfo, error) {
	keys := [1][]byte{key}
	var out [1]KeyInfo
	err := n.ForgetBatch(ctx, keys[:], out[:])
	return out[0], err
}

// LookupBatch tells, for each key, what a claim would answer now, with the
// commit's digest, result and time, without claiming anything: one out per
// key. It reads the tiers as a claim does (memory, then the exact tier,
// skipping it where warm filters prove a key new), so it is exact in the
// configurations that are; the answer may change the moment it is read,
// and only a claim decides who processes a key. Bloom-only cannot tell a
// key it never saw from a false positive and refuses (ErrOptions).
func (n *Namespace) LookupBatch(ctx context.Context, keys [][]byte, out []KeyInfo) error {
	return n.e.lookup(ctx, n, keys, out, false)
}

// ForgetBatch removes each key's commit (and its attempt count), so that
// its next claim is New: after a compensating action, or to let a
// poisoned message run again. It is fenced like a claim: a key a claim
// holds (in this process, or in the shared tier) is left as it is, its
// out InFlight, and the call returns an error matching ErrInFlight after
// forgetting the others. out[i] is what the key held before (New with no
// attempts: there was nothing to forget). The removal is durable as a
// commit is before ForgetBatch returns. Any other error (ErrUnavailable,
// ErrStorage) may come after some of the keys were forgotten: call it
// again (a key forgotten by the failed call then answers New). Behind
// Redis with an archive, a delete that reaches Redis more than a second
// after the call read the archive (a stall, or this host's clock behind
// Redis's) and finds its key absent there writes nothing for it and
// fails the call with ErrUnavailable (docs/archive.md). Bloom-only
// cannot remove a key (ErrOptions); with a shared tier it needs
// Options.NoSharedCache, so that no other process answers from a cached
// copy of the commit.
func (n *Namespace) ForgetBatch(ctx context.Context, keys [][]byte, out []KeyInfo) error {
	return n.e.lookup(ctx, n, keys, out, true)
}

// lookup is LookupBatch, or ForgetBatch with forget.
func (e *Engine) lookup(ctx context.Context, ns *Namespace, keys [][]byte, out []KeyInfo, forget bool) error {
	op := "LookupBatch"
	if forget {
		op = "ForgetBatch"
	}
	if len(out) != len(keys) {
		return fmt.Errorf("%w: %d keys, %d infos", ErrBatch, len(keys), len(out))
	}
	need := NeedLookup
	if forget {
		need = NeedForget
	}
	if err := e.serve(need, op); err != nil {
		return err
	}
	if err := e.checkKeys(keys); err != nil {
		return err
	}
	now, slot, err := e.start(ctx)
	if err != nil {
		return err
	}
	defer e.finish(slot)
	n := len(keys)
	b := e.getBatch(n)
	defer e.putBatch(b)
	e.fingerprints(b, ns.name, keys, forget)
	if forget && e.where == tier.ClaimsInEngine && e.maxAttempts > 0 {
		e.counts.RLock() // no release's count lands between our read and delete
		defer e.counts.RUnlock()
	}
	if forget {
		// The fence lasts as long as this call, not a lease: a Forget
		// that stalls (a pause, a slow disk, the clock stepping on) must
		// not let a claim take the key over, read or commit it, and then
		// have the delete remove what that claim read or committed.
		e.mem.Seize(b.fps, b.tokens, now, callFence, b.res)
	} else {
		e.mem.Peek(b.fps, now, b.res)
	}

	repeats := b.repeatsOf(b.fps[:n])
	cand := e.lookupMemory(b, out, repeats, forget)
	var c tally
	// A Forget reaches the archive in every namespace it may hold (any
	// window may become an archive window at the next Open).
	archived := e.arch != nil && (ns.archiveWindow > 0 || forget && archiveNS(ns.name))
	if forget && archived {
		// No partition is archived between the two deletions (invariant 3
		// of the archive).
		defer e.arch.Forgetting()()
	}
	if e.exact != nil && len(cand) > 0 {
		var pre []tier.Answer
		var logBy int64
		if forget && archived && e.arch.Shared() {
			pre, err = e.readBeforeForget(ctx, b, ns, keys, e.archiveNow(now))
			// The shared tier's deletes, which follow the archive read,
			// may append a removal of a key they find absent only until
			// LogBy (tier.Request.LogBy), counted from a reading of the
			// clock taken once that read has returned: a commit made after
			// the deletes' own read of the key stays in the shared tier
			// for its window, at least LogSkew/2 + LogSkew longer (Open
			// refuses a shorter one), so a copy of a delete by LogBy
			// that finds the key absent cannot be hiding it. Counted from
			// the call's start instead, an archive read slower than
			// LogSkew/2 failed every such Forget.
			logBy = e.archiveNow(e.reading()) + int64(tier.LogSkew/2)
		}
		if err == nil {
			err = e.lookupExact(ctx, b, ns, keys, out, forget, logBy, &c, now)
		}
		if err == nil && archived {
			err = e.lookupArchive(ctx, b, ns, keys, out, forget, pre, now)
		}
	}
	if forget {
		// Give back every claim Seize made: the key is free, or (on an
		// error) the store still holds whatever it held.
		m := len(cand)
		for j, i := range cand {
			b.cfps[j], b.ctokens[j], b.actions[j] = b.fps[i], b.tokens[i], memory.Drop
		}
		e.mem.Settle(b.cfps[:m], b.ctokens[:m], b.actions[:m], b.expires[:m], b.digests[:m], nil)
	}
	if err != nil {
		c.errors++
		e.stats.add(&c)
		return e.tierError(err)
	}
	e.stats.add(&c)
	held, forgot := e.settleLookups(out, repeats)
	if forget {
		e.stats.forgets.Add(uint64(forgot))
		if e.local != nil && forgot > 0 {
			e.forgotten.add(b.fps[:n]) // the filters still hold them
		}
	} else {
		e.stats.lookups.Add(uint64(n))
	}
	if forget && held > 0 {
		return fmt.Errorf("%w: %d of %d keys", ErrInFlight, held, n)
	}
	return nil
}

// lookupMemory answers each key of b from memory's answers b.res, and sets
// b.cand to the keys the exact tier must answer (every key a Forget
// reaches). A key repeated in the batch is answered as its first occurrence
// is (repeats), and only that one reaches the exact tier, which is never
// given a key twice in a batch (tier.Exact). In a forget batch the repeats
// find the claim the first occurrence seized.
func (e *Engine) lookupMemory(b *batch, out []KeyInfo, repeats map[int]int, forget bool) []int {
	cand := b.cand[:0]
	for i := range out {
		if _, ok := repeats[i]; ok {
			continue
		}
		r := &b.res[i]
		out[i] = KeyInfo{Attempts: r.Attempts, Source: SourceMemory}
		switch r.Status {
		case tier.Held:
			out[i].Outcome = InFlight
			continue
		case tier.Committed:
			out[i] = KeyInfo{Outcome: Duplicate, Digest: r.Digest, Result: r.Result, CommittedAt: r.At, Source: SourceMemory}
		case tier.Poisoned:
			out[i].Outcome = Poison
		default: // Absent, Released
			out[i].Outcome = New
		}
		if forget || (e.exact != nil && out[i].Outcome != Duplicate) {
			cand = append(cand, i)
		}
	}
	b.cand = cand
	return cand
}

// settleLookups makes the answers final (Poison at MaxAttempts, repeats as
// their first occurrence) and counts the keys held by a claim and those
// that held something.
func (e *Engine) settleLookups(out []KeyInfo, repeats map[int]int) (held, found int) {
	for i := range out {
		o := &out[i]
		if _, ok := repeats[i]; ok {
			continue
		}
		if o.Outcome == New && e.maxAttempts > 0 && int(o.Attempts) >= e.maxAttempts {
			o.Outcome = Poison
		}
		switch {
		case o.Outcome == InFlight:
			held++
		case o.Outcome != New || o.Attempts > 0:
			found++
		}
	}
	for i, j := range repeats {
		out[i] = out[j] // after its first occurrence's answer is final
		out[i].Result = bytes.Clone(out[j].Result)
	}
	return held, found
}

// callFence is the lease end of a memory claim that a call of this process
// holds only while it runs (Forget's): it never ends by time, and the call
// drops it before it returns, whatever happened.
const callFence = math.MaxInt64

// lookupExact asks the exact tier about the keys of b.cand: a read (Claim
// of a tier whose claims live in the engine, Lookup of a shared one), or
// Forget. logBy is the Forget's tier.Request.LogBy behind a shared tier's
// archive log (0 otherwise): its deletes append no removal for a key they
// find absent after it.
func (e *Engine) lookupExact(ctx context.Context, b *batch, ns *Namespace, keys [][]byte, out []KeyInfo, forget bool, logBy int64, c *tally, now int64) error {
	cand := b.cand
	// Forget deletes in every live partition: a filter's "no" is for
	// reads, not for what a record may have left.
	var oldest int64
	var warm bool
	if forget {
		oldest = e.allLive(b.probes[:len(cand)])
	} else {
		oldest, warm = e.filterMasks(b.candidates(), b.probes)
	}
	reqs, qidx := b.reqs[:0], b.qidx[:0]
	for j, i := range cand {
		mask := b.probes[j].Maybe
		if warm && mask == 0 {
			c.bloomNegatives++
			if out[i].Outcome == New {
				out[i].Source = SourceFilter
			}
			continue
		}
		if out[i].Outcome == New {
			out[i].Source = SourceStore
		}
		r := tier.Request{NS: ns.name, Key: keys[i], Oldest: oldest, Mask: mask, LogBy: logBy}
		if forget && e.where == tier.ClaimsInStore {
			// The call's own token: a copy of the delete that the client
			// retried after a lost reply answers what the first removed.
			r.Token = e.ownerToken(b.tokens[i])
		}
		reqs = append(reqs, r)
		qidx = append(qidx, i)
	}
	b.reqs, b.qidx = reqs, qidx
	defer clear(reqs)
	if len(reqs) == 0 {
		return nil
	}
	ans := b.ans[:len(reqs)]
	c.storeReads += uint64(len(reqs))
	var err error
	switch {
	case forget:
		err = e.forgetter.Forget(ctx, reqs, ans)
	case e.where == tier.ClaimsInEngine:
		err = e.exact.Claim(ctx, reqs, 0, ans)
	default:
		err = e.looker.Lookup(ctx, reqs, ans)
	}
	if err != nil {
		return err
	}
	for q, i := range qidx {
		a := &ans[q]
		o := &out[i]
		switch a.Status {
		case tier.Committed:
			if ns.expired(a.Partition, a.At, now) {
				continue // older than the namespace's window: New
			}
			c.storeHits++
			*o = KeyInfo{Outcome: Duplicate, Digest: a.Digest, Result: a.Result, Source: SourceStore}
			if a.Result != nil {
				o.CommittedAt = a.At // dated only with a result, whichever tier answers
			}
			if a.Partition >= 0 {
				o.CommittedBefore = (a.Partition + 1) * e.parts.Length
			}
		case tier.Held:
			o.Outcome, o.Source = InFlight, SourceStore
		case tier.Poisoned:
			o.Outcome, o.Attempts, o.Source = Poison, max(o.Attempts, a.Attempts), SourceStore
		case tier.Released:
			if o.Outcome != Duplicate {
				o.Outcome, o.Attempts = New, max(o.Attempts, a.Attempts)
			}
		}
	}
	return nil
}
