package engine

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// Behind a shared tier (Redis, which expires keys itself and has no
// partitions to copy) the archive is fed from the tier's log:
//
//	commit script ──► the key (TTL Window) and a log entry, in one step
//	                  │ drained in order by the engine holding the drain lease
//	                  ▼
//	                  archive.Apply (its position recorded in the same
//	                  transaction), then the log trimmed up to it
//	                  │ once the log holds none of partition p's entries
//	                  │ and none can come (the log's clock passed p's end)
//	                  ▼
//	                  p's keys into the filter, its group's blob saved,
//	                  then archive.Seal(p)
//
// Every engine loads the blob of each newly sealed partition (refresh).
// A key the shared tier acquires, because it holds no commit of it, is
// asked of the archive; the answer counts only if every partition holding
// keys the tier may have let go (committed a Window or more ago) is sealed
// in this engine's filter (sealedFor), and otherwise the call fails with
// ErrUnavailable and gives its claims back: never a New that the archive
// could contradict.
//
// Invariants (besides those of archive.go):
//
//  5. A partition is sealed only after its group's blob holds its keys,
//     and only once no entry of it can be appended: a reader that loaded
//     the blob of every sealed partition misses no archived key.
//  6. The log is trimmed only up to a position the archive recorded as
//     applied; an entry applied twice (a drainer dead before its trim, or
//     two drainers a lease apart) is skipped by that position.
//  7. A Forget returns only once the archive applied the log up to the
//     removal it appended, so no drain brings the key back afterwards.

const (
	// logTick is how often each engine renews or seeks the drain lease,
	// drains (holding it) and loads newly sealed partitions.
	logTick = 500 * time.Millisecond
	// maxDrainLease is the longest drain lease: a drainer that dies is
	// replaced that long after its last renewal (a quarter of the window
	// if shorter, at least a second).
	maxDrainLease = 10 * time.Second
	// drainBatch is the most log entries one Apply takes; drainBytes
	// bounds what one read of the log brings (entries times their size
	// as read so far), and drainFirst is the first read's count, before
	// any size is known: 16 entries of the largest result are 64 MiB.
	drainBatch = 4096
	drainBytes = 16 << 20
	drainFirst = 16
	// logSkew bounds the difference between this engine's clock and the
	// shared tier's, which dates the log and expires the keys.
	logSkew = 2 * time.Second
	// forgetWait bounds a Forget's wait for the drain when its context
	// has no deadline.
	forgetWait = 30 * time.Second
)

// sums returns the keys' fingerprints under the archive's own secret.
func (a *archiver) sums(ns string, keys [][]byte) []shard.Fingerprint {
	fps := make([]shard.Fingerprint, len(keys))
	for i, k := range keys {
		fps[i] = shard.Sum(a.hasher, ns, k)
	}
	return fps
}

// sealedFor returns the first partition not sealed in this engine's
// filter, or ErrUnavailable when a key committed before it may have left
// the shared tier already.
func (a *archiver) sealedFor(now int64) (int64, error) {
	next := a.next.Load()
	if need := now - a.e.window + int64(logSkew); next*a.e.parts.Length < need {
		return 0, fmt.Errorf("%w: archive: partition %d is not sealed yet (%d log entries not drained), and keys committed before %v may have left %s",
			ErrUnavailable, next, a.logLag.Load(), time.Unix(0, need).UTC().Format(time.RFC3339), a.e.name)
	}
	return next, nil
}

// openLog sets the first partition to seal of an archive new to the log
// (the oldest entry's, or the current one), and loads every sealed
// partition's filter.
func (a *archiver) openLog(ctx context.Context, cur int64, bind string) error {
	if err := a.log.Bind(ctx, bind); err != nil {
		return err
	}
	pos, next, err := a.app.Applied(ctx)
	if err != nil {
		return err
	}
	// An archive restored from an older copy lacks what the log trimmed
	// after it applied it.
	if _, trimmed, _, err := a.log.LogTail(ctx); err != nil {
		return err
	} else if pos.Less(trimmed) {
		return fmt.Errorf("%w: the archive applied the log up to %v, and the log trimmed up to %v: an older or replaced archive lacks what was trimmed", ErrLayout, pos, trimmed)
	}
	if next < 0 {
		first, now, err := a.log.ReadLog(ctx, tier.LogPos{}, 1)
		if err != nil {
			return err
		}
		start := a.e.parts.Of(now)
		if len(first) > 0 {
			start = min(start, a.e.parts.Of(first[0].Record.At))
		}
		if next, err = a.app.Start(ctx, start); err != nil {
			return err
		}
	}
	a.next.Store(max(next, a.oldest(cur)))
	return a.loadSealed(ctx, cur, a.oldest(cur), next)
}

// refresh loads the filters of the partitions sealed since the last one.
func (a *archiver) refresh(ctx context.Context, cur int64) error {
	_, next, err := a.app.Applied(ctx)
	if err != nil {
		return err
	}
	have := a.next.Load()
	if next <= have {
		return nil
	}
	if err := a.loadSealed(ctx, cur, max(have, a.oldest(cur)), next); err != nil {
		return err
	}
	a.next.Store(next)
	return nil
}

// loadSealed merges into the filter the blob of every group holding a
// sealed partition in [from, to), and scans the partitions no valid blob
// covers.
func (a *archiver) loadSealed(ctx context.Context, cur, from, to int64) error {
	if from >= to {
		return nil
	}
	a.filters.Rotate(cur / a.group)
	held, err := a.store.Archived(ctx)
	if err != nil {
		return err
	}
	a.held.Store(int64(len(held)))
	var groups []int64
	for g := from / a.group; g <= (to-1)/a.group; g++ {
		groups = append(groups, g)
	}
	covered, err := a.mergeBlobs(ctx, groups)
	if err != nil {
		return err
	}
	for _, p := range held {
		if p < from || p >= to {
			continue
		}
		if c, ok := covered[p/a.group]; ok && p <= c {
			continue
		}
		if err := a.scanBack(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// logPass renews or seeks the drain lease, drains the log holding it,
// loads what was sealed, and expires the archive.
func (a *archiver) logPass(ctx context.Context) {
	e := a.e
	now, err := e.now()
	if err != nil {
		return
	}
	cur := e.parts.Of(now)
	fail := func(what string, err error) {
		if ctx.Err() == nil {
			a.failures.Add(1)
			e.logger.Printf("tierdedup: archive: %s: %v", what, err)
		}
	}
	held, err := a.log.DrainLease(ctx, a.owner, min(maxDrainLease, max(time.Duration(e.window)/4, time.Second)))
	if err != nil {
		fail("the drain lease", err)
	}
	a.holder.Store(held)
	if err := a.refresh(ctx, cur); err != nil {
		fail("loading sealed partitions", err)
		return
	}
	if held {
		if err := a.drain(ctx, cur); err != nil {
			fail("draining the log", err)
		}
		if err := a.store.Drop(ctx, a.oldest(cur)); err != nil {
			fail("expiring", err)
		}
		if held, err := a.store.Archived(ctx); err == nil {
			a.held.Store(int64(len(held)))
		}
		archiveHook("drop")
	}
	a.filters.Rotate(cur / a.group)
	if _, _, n, err := a.log.LogTail(ctx); err == nil {
		a.logLag.Store(n)
	}
}

// drain applies the log to the archive, trims it, and seals each
// partition the log has no more entries of.
func (a *archiver) drain(ctx context.Context, cur int64) error {
	e := a.e
	pos, next, err := a.app.Applied(ctx)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		n := a.readCount()
		entries, now, err := a.log.ReadLog(ctx, pos, n)
		if err != nil {
			return err
		}
		a.sizeReads(entries)
		if len(entries) > 0 {
			var commits uint64
			for i := range entries {
				en := &entries[i]
				// Filed by the log's clock, which decides when a
				// partition is complete (At may be the engine's).
				en.Partition = max(e.parts.Of(int64(en.Pos.MS)*int64(time.Millisecond)), next)
				if !en.Forget {
					commits++
				}
			}
			archiveHook("put")
			if err := a.app.Apply(ctx, entries); err != nil {
				return err
			}
			archiveHook("held")
			pos = entries[len(entries)-1].Pos
			a.keys.Add(commits)
			if err := a.log.TrimLog(ctx, pos); err != nil {
				return err // trimmed at the next pass: Apply skips what it applied
			}
		}
		// Every entry before complete is applied, and none can come.
		complete := now
		if len(entries) == n {
			complete = int64(pos.MS) * int64(time.Millisecond)
		}
		for next < cur && (next+1)*e.parts.Length <= complete {
			if err := a.seal(ctx, cur, next); err != nil {
				return err
			}
			next++
		}
		if len(entries) < n {
			return nil
		}
	}
	return ctx.Err()
}

// readCount is how many log entries the next read of the drain asks for:
// as many as fit drainBytes at the entry size the reads so far found (a
// few to start with: entries may carry results of up to MaxResultSize),
// at most drainBatch. Only the drain's goroutine uses it.
func (a *archiver) readCount() int {
	if a.entryBytes == 0 {
		return drainFirst
	}
	return int(min(max(drainBytes/a.entryBytes, 1), drainBatch))
}

// sizeReads takes the size of the entries just read into the estimate
// readCount uses: the larger of their mean and half the earlier estimate,
// so a run of large results shrinks the reads at once and small ones
// grow them back, doubling a read.
func (a *archiver) sizeReads(entries []tier.LogEntry) {
	if len(entries) == 0 {
		return
	}
	var n int64
	for i := range entries {
		r := &entries[i].Record
		n += int64(len(r.NS)+len(r.Key)+len(r.Result)) + 64
	}
	a.entryBytes = max(n/int64(len(entries)), a.entryBytes/2, 1)
}

// seal adds partition p's keys to the filter, saves its group's blob,
// then records p sealed (invariant 5).
func (a *archiver) seal(ctx context.Context, cur, p int64) error {
	if err := a.refresh(ctx, cur); err != nil {
		return err // the blob must carry every sealed partition of the group
	}
	if p >= a.oldest(cur) {
		if err := a.scanBack(ctx, p); err != nil {
			return err
		}
		g := p / a.group
		if err := a.store.PutBlob(ctx, blobName(g), func(w io.Writer) error {
			_, err := a.filters.WritePartition(w, g, bloom.SnapshotMeta{Kind: bloom.SnapshotArchive, Secret: a.check, Epoch: uint64(p)})
			return err
		}); err != nil {
			return err
		}
	}
	archiveHook("blob")
	if err := a.app.Seal(ctx, p); err != nil {
		return err
	}
	if a.next.CompareAndSwap(p, p+1) {
		a.archived.Add(1)
	}
	return nil
}

// waitApplied waits until the archive applied the log up to its newest
// entry as read now (a Forget's removal, appended before).
func (a *archiver) waitApplied(ctx context.Context) error {
	tail, _, _, err := a.log.LogTail(ctx)
	if err != nil {
		return fmt.Errorf("%w: archive: %w", ErrUnavailable, err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, forgetWait)
		defer cancel()
	}
	for {
		pos, _, err := a.app.Applied(ctx)
		if err == nil && !pos.Less(tail) {
			return nil
		}
		if err == nil {
			a.poke()
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("%w: archive: the log is not drained up to the forget yet: %w", ErrUnavailable, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
