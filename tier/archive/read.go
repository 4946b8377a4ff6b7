package archive

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// absent fills out with Absent answers.
func absent(out []tier.Answer) {
	for q := range out {
		out[q] = tier.Answer{Status: tier.Absent, Partition: -1}
	}
}

// Find answers each key of namespace ns (fingerprint fps[q], under the
// engine's hasher) from the exact tier's partitions that left the window
// unarchived and from the archive: Committed with the record, or Absent.
// An error matches tier.ErrUnavailable (the archive) or tier.ErrStorage
// (the exact tier): nothing is known.
//
// The unarchived partitions are read first, then the archive up to the
// first partition not archived as read after that: a partition the exact
// tier dropped meanwhile was archived before it was dropped (invariant
// 1), so one of the two reads holds it.
func (a *Archiver) Find(ctx context.Context, ns string, keys [][]byte, fps []shard.Fingerprint, now int64) ([]tier.Answer, error) {
	cur := a.c.Partitions.Of(now)
	oldest := a.oldest(cur)
	out := make([]tier.Answer, len(keys))
	absent(out)
	// Every archived partition, not only those past the hot window: the
	// exact tier drops a partition once it is archived, and a window
	// lengthened since (on reopen) does not bring back what it dropped.
	// Partitions the exact tier still holds are answered there first, so
	// this reads the archive only for keys the exact tier left New.
	var upTo int64
	if a.c.Log == nil {
		from := max(a.next.Load(), oldest)
		hook("lagging") // tests: the archiver may archive and drop here
		if err := a.readLagging(ctx, ns, keys, from, a.c.Partitions.Oldest(cur), out, false); err != nil {
			return nil, err
		}
		// Read after the exact tier was: a partition the archiver moved
		// and the exact tier dropped meanwhile (after next had passed it,
		// invariant 1) is then in the range asked of the archive. Read
		// before, it was in neither read.
		upTo = a.next.Load()
	} else {
		var err error
		if upTo, err = a.sealedFor(now); err != nil {
			return nil, err
		}
		fps = a.sums(ns, keys)
	}
	// The archive, where its filter says the key may be, in the archived
	// partitions that left the window.
	probes := make([]bloom.Probe, len(fps))
	gOldest := a.filters.Test(fps, probes)
	var qs []tier.ArchiveQuery
	var qidx []int
	for q := range fps {
		m := probes[q].Maybe
		if m == 0 || upTo <= oldest || out[q].Status == tier.Committed {
			continue
		}
		lo := gOldest + int64(bits.TrailingZeros64(m))
		hi := gOldest + int64(63-bits.LeadingZeros64(m))
		from, to := max(lo*a.group, oldest), min((hi+1)*a.group, upTo)
		if from >= to {
			continue
		}
		qs = append(qs, tier.ArchiveQuery{NS: ns, Key: keys[q], From: from, To: to})
		qidx = append(qidx, q)
	}
	if len(qs) > 0 {
		ans := make([]tier.Answer, len(qs))
		a.reads.Add(uint64(len(qs)))
		var applied *tier.LogPos
		var err error
		if al, ok := a.store.(tier.AppliedLookup); ok && a.c.Log != nil {
			var pos tier.LogPos
			pos, err = al.LookupApplied(ctx, qs, ans)
			applied = &pos
		} else {
			err = a.store.Lookup(ctx, qs, ans)
		}
		if err != nil {
			return nil, fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
		}
		for k, q := range qidx {
			if ans[k].Status == tier.Committed {
				out[q] = ans[k]
			}
		}
		if a.c.Log != nil {
			if err := a.withoutRemovals(ctx, ns, keys, qs, qidx, out, applied); err != nil {
				return nil, err
			}
		}
		for _, q := range qidx {
			if out[q].Status == tier.Committed {
				a.hits.Add(1)
			}
		}
	}
	return out, nil
}

// withoutRemovals takes back, behind a shared tier's log, the archive's
// answers (out[qidx[k]], read for qs[k]) for keys whose removal the log
// still holds (appended, not yet trimmed: a give-back of a commit whose
// caller was told it failed, or a Forget that failed waiting for the
// drain) after applied, the position the archive read had applied: the
// commit the archive answered is then one the removal undid (the log
// applies in order: no later commit was applied before it), Absent. A
// removal at or before applied shows in the read already, and what it
// answered is a commit made after it. Without the position (nil) a
// removal hides a commit up to tier.LogSkew later than it (the engines'
// clocks against the log's). A removal the drain applied and trimmed
// between the archive read and the read of the log's removals is in
// neither: when the log was trimmed past applied (or applied is not
// known), the keys not taken back are read from the archive again, where
// it shows.
func (a *Archiver) withoutRemovals(ctx context.Context, ns string, keys [][]byte, qs []tier.ArchiveQuery, qidx []int, out []tier.Answer, applied *tier.LogPos) error {
	var hit [][]byte
	var hk []int
	for k, q := range qidx {
		if out[q].Status == tier.Committed {
			hit, hk = append(hit, keys[q]), append(hk, k)
		}
	}
	if len(hit) == 0 {
		return nil
	}
	hook("removals") // tests: the drain may apply and trim the removals here
	removed, trimmed, err := a.c.Log.Removing(ctx, ns, hit)
	if err != nil {
		return fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
	}
	reread := applied == nil || applied.Less(trimmed)
	var again []tier.ArchiveQuery
	var aq []int
	for i, k := range hk {
		q, r := qidx[k], removed[i]
		pending := r != (tier.LogPos{}) && (applied == nil && out[q].At <= int64(r.MS)*int64(time.Millisecond)+int64(tier.LogSkew) ||
			applied != nil && applied.Less(r))
		if pending {
			out[q] = tier.Answer{Status: tier.Absent, Partition: -1}
			continue
		}
		again, aq = append(again, qs[k]), append(aq, q)
	}
	if len(again) == 0 || !reread {
		return nil
	}
	ans := make([]tier.Answer, len(again))
	a.reads.Add(uint64(len(again)))
	if err := a.store.Lookup(ctx, again, ans); err != nil {
		return fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
	}
	for i, q := range aq {
		out[q] = tier.Answer{Status: tier.Absent, Partition: -1}
		if ans[i].Status == tier.Committed {
			out[q] = ans[i]
		}
	}
	return nil
}

// readLagging reads (or, with forget, removes) each key in the exact
// tier's partitions [from, to) that left the window before the archive
// took them, 64 partitions a request (a request's mask), into out where
// out still says Absent (forget: where it found something).
func (a *Archiver) readLagging(ctx context.Context, ns string, keys [][]byte, from, to int64, out []tier.Answer, forget bool) error {
	for lo := from; lo < to; lo += 64 {
		span := min(to-lo, 64)
		mask := ^uint64(0)
		if span < 64 {
			mask = 1<<span - 1
		}
		var reqs []tier.Request
		var ridx []int
		for q := range keys {
			if forget || out[q].Status == tier.Absent {
				reqs = append(reqs, tier.Request{NS: ns, Key: keys[q], Oldest: lo, Mask: mask})
				ridx = append(ridx, q)
			}
		}
		if len(reqs) == 0 {
			return nil
		}
		ans := make([]tier.Answer, len(reqs))
		var err error
		switch {
		case !forget:
			a.lagReads.Add(uint64(len(reqs)))
			err = a.c.Hot.Claim(ctx, reqs, 0, ans)
		case a.c.Forgetter == nil:
			err = fmt.Errorf("%w: the exact tier cannot remove keys", tier.ErrOptions)
		default:
			err = a.c.Forgetter.Forget(ctx, reqs, ans)
		}
		if err != nil {
			if errors.Is(err, tier.ErrUnavailable) || errors.Is(err, tier.ErrOptions) {
				return err
			}
			return fmt.Errorf("%w: %w", tier.ErrStorage, err)
		}
		for k, q := range ridx {
			if ans[k].Status == tier.Committed && (out[q].Status != tier.Committed || ans[k].Partition > out[q].Partition) {
				out[q] = ans[k]
			}
		}
	}
	return nil
}

// Forget removes each key of namespace ns from the exact tier's
// unarchived partitions that left the window and from the archive,
// answering in out what it found (the newest); the caller holds
// Forgetting, so no partition is archived meanwhile and Next stays where
// it is. Behind a shared tier's archive log it only reads the archive,
// once the drain has applied what the log held when it was called: the
// caller calls it before the shared tier appends the removal, and then
// waits (WaitApplied) until the drain has applied that too.
func (a *Archiver) Forget(ctx context.Context, ns string, keys [][]byte, now int64, out []tier.Answer) error {
	cur := a.c.Partitions.Of(now)
	oldest, next := a.oldest(cur), a.next.Load()
	absent(out)
	if a.c.Log != nil {
		next = cur + 1 // every partition the log fills, sealed or not
		// A commit still only in the log (the shared tier let the key go,
		// the drain has not applied it yet) is invisible to the read: wait
		// until the drain has applied what the log holds now, or fail as a
		// Lookup does, rather than answer New for a key that holds a
		// commit.
		if err := a.WaitApplied(ctx); err != nil {
			return err
		}
	} else if err := a.readLagging(ctx, ns, keys, max(next, oldest), a.c.Partitions.Oldest(cur), out, true); err != nil {
		return err
	}
	qs := make([]tier.ArchiveQuery, len(keys))
	for q := range keys {
		qs[q] = tier.ArchiveQuery{NS: ns, Key: keys[q], From: oldest, To: next}
	}
	ans := make([]tier.Answer, len(keys))
	remove := a.store.Forget
	if a.c.Log != nil {
		// The removal the shared tier appends deletes the key in the
		// log's order: a delete here could remove a commit made after
		// this Forget and applied before it. The archive is read before
		// the shared tier appends the removal (the caller calls this
		// first): read after, a drain applying the removal in between
		// would hide what the key held.
		remove = a.store.Lookup
	}
	if err := remove(ctx, qs, ans); err != nil {
		return fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
	}
	for q := range ans {
		if ans[q].Status == tier.Committed && out[q].Status != tier.Committed {
			out[q] = ans[q]
		}
	}
	return nil
}
