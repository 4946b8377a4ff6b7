package archive

import (
	"context"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
)

// Behind a shared tier: the log's side (see the package documentation,
// invariants 5 to 7).

const (
	// logTick is how often each engine renews or seeks the drain lease,
	// drains (holding it) and loads newly sealed partitions.
	logTick = 500 * time.Millisecond
	// maxDrainLease is the longest drain lease: a drainer that dies is
	// replaced that long after its last renewal (a quarter of the window
	// if shorter, at least a second).
	maxDrainLease = 10 * time.Second
	// drainBatch bounds the log entries one Apply takes (positions times
	// their entries as read so far: a position may hold a call's
	// commits); drainBytes bounds what one read of the log brings
	// (positions times their size as read so far), and drainFirst is the
	// first read's count of positions, before any size is known: 16
	// commits of the largest result are 64 MiB (a tier groups commits up
	// to a bound of its own, 16 MiB of arguments for Redis).
	drainBatch = 4096
	drainBytes = 16 << 20
	drainFirst = 16
	// logSkew is tier.LogSkew: see there.
	logSkew = tier.LogSkew
	// forgetWait bounds a Forget's wait for the drain when its context
	// has no deadline.
	forgetWait = 30 * time.Second
)

// sums returns the keys' fingerprints under the archive's own secret.
func (a *Archiver) sums(ns string, keys [][]byte) []shard.Fingerprint {
	fps := make([]shard.Fingerprint, len(keys))
	for i, k := range keys {
		fps[i] = shard.Sum(a.hasher, ns, k)
	}
	return fps
}

// sealedFor returns the first partition not sealed in this engine's
// filter, or tier.ErrUnavailable when a key committed before it may have left
// the shared tier already.
func (a *Archiver) sealedFor(now int64) (int64, error) {
	next := a.next.Load()
	if need := now - int64(a.c.Window) + int64(logSkew); next*a.c.Partitions.Length < need {
		return 0, fmt.Errorf("%w: archive: partition %d is not sealed yet (%d log entries not drained), and keys committed before %v may have left %s",
			tier.ErrUnavailable, next, a.logLag.Load(), time.Unix(0, need).UTC().Format(time.RFC3339), a.c.TierName)
	}
	return next, nil
}

// openLog sets the first partition to seal of an archive new to the log
// (the oldest entry's, or the current one), and loads every sealed
// partition's filter.
func (a *Archiver) openLog(ctx context.Context, cur int64, bind string) error {
	if err := a.c.Log.Bind(ctx, bind); err != nil {
		return err
	}
	next, err := appliedPastTrim(ctx, a.c.Log, a.app)
	if err != nil {
		return err
	}
	if next < 0 {
		first, now, err := a.c.Log.ReadLog(ctx, tier.LogPos{}, 1)
		if err != nil {
			return err
		}
		start := a.c.Partitions.Of(now)
		if len(first) > 0 {
			start = min(start, a.c.Partitions.Of(first[0].Record.At))
		}
		if next, err = a.app.Start(ctx, start); err != nil {
			return err
		}
	}
	a.next.Store(max(next, a.oldest(cur)))
	return a.loadSealed(ctx, cur, a.oldest(cur), next)
}

// appliedPastTrim checks that the archive holds everything the log
// trimmed, and returns the first partition not sealed. An archive
// restored from an older copy, or another archive, lacks what the log
// trimmed after the right one applied it: ErrLayout.
//
// The trim mark is read first. Another process may drain between the
// two reads, but a drainer trims only what Apply recorded and the applied
// position never goes back, so the position read second is at or past
// the mark read first whenever the archive is the right one. Read the
// other way round, a drain between the reads made a healthy archive look
// older than the log.
func appliedPastTrim(ctx context.Context, log tier.ArchiveLog, app tier.ArchiveAppender) (int64, error) {
	_, trimmed, _, err := log.LogTail(ctx)
	if err != nil {
		return 0, err
	}
	pos, next, err := app.Applied(ctx)
	if err != nil {
		return 0, err
	}
	if pos.Less(trimmed) {
		return 0, fmt.Errorf("%w: the archive applied the log up to %v, and the log trimmed up to %v: an older or replaced archive lacks what was trimmed", tier.ErrLayout, pos, trimmed)
	}
	return next, nil
}

// refresh loads the filters of the partitions sealed since the last one.
func (a *Archiver) refresh(ctx context.Context, cur int64) error {
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
func (a *Archiver) loadSealed(ctx context.Context, cur, from, to int64) error {
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
func (a *Archiver) logPass(ctx context.Context) {
	now, err := a.c.Now()
	if err != nil {
		return
	}
	cur := a.c.Partitions.Of(now)
	fail := func(what string, err error) {
		if ctx.Err() == nil {
			a.failures.Add(1)
			a.c.Logger.Printf("tierdedup: archive: %s: %v", what, err)
		}
	}
	held, err := a.c.Log.DrainLease(ctx, a.c.Process, min(maxDrainLease, max(a.c.Window/4, time.Second)))
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
		if _, err := a.expire(ctx, cur); err != nil {
			fail("expiring", err)
		}
		hook("drop")
	}
	a.filters.Rotate(cur / a.group)
	if _, _, n, err := a.c.Log.LogTail(ctx); err == nil {
		a.logLag.Store(n)
		a.passes.Add(1)
	}
}

// drain applies the log to the archive, trims it, and seals each
// partition the log has no more entries of.
func (a *Archiver) drain(ctx context.Context, cur int64) error {
	pos, next, err := a.app.Applied(ctx)
	if err != nil {
		return err
	}
	if a.trimmedTo.Less(pos) {
		// A trim that failed (or a drainer that died between its apply and
		// its trim) is made up for now, not at the next entry: the log's
		// removals stay recorded until a trim passes them. A failure here
		// does not stop the drain: the next trim tries again.
		if a.c.Log.TrimLog(ctx, pos) == nil {
			a.trimmedTo = pos
		}
	}
	for ctx.Err() == nil {
		n := a.readCount()
		entries, now, err := a.c.Log.ReadLog(ctx, pos, n)
		if err != nil {
			return err
		}
		read := positions(entries)
		a.sizeReads(entries, read)
		if len(entries) > 0 {
			var commits uint64
			for i := range entries {
				en := &entries[i]
				// Filed by the log's clock, which decides when a
				// partition is complete (At may be the engine's).
				en.Partition = max(a.c.Partitions.Of(int64(en.Pos.MS)*int64(time.Millisecond)), next)
				if !en.Forget {
					commits++
				}
			}
			hook("put")
			if err := a.app.Apply(ctx, entries); err != nil {
				return err
			}
			hook("held")
			pos = entries[len(entries)-1].Pos
			a.keys.Add(commits)
			if err := a.c.Log.TrimLog(ctx, pos); err != nil {
				return err // trimmed at the next pass: Apply skips what it applied
			}
			a.trimmedTo = pos
		}
		// Every entry before complete is applied, and none can come.
		complete := now
		if read >= n {
			complete = int64(pos.MS) * int64(time.Millisecond)
		}
		for next < cur && (next+1)*a.c.Partitions.Length <= complete {
			if err := a.seal(ctx, cur, next); err != nil {
				return err
			}
			next++
		}
		if read < n {
			return nil
		}
	}
	return ctx.Err()
}

// positions counts the log positions of entries (in order; entries of
// one position are adjacent).
func positions(entries []tier.LogEntry) int {
	n := 0
	for i := range entries {
		if i == 0 || entries[i].Pos != entries[i-1].Pos {
			n++
		}
	}
	return n
}

// readCount is how many log positions the next read of the drain asks
// for: as many as fit drainBytes at the size of a position the reads so
// far found (a few to start with: entries may carry results of up to
// MaxResultSize), at most drainBatch. Only the drain's goroutine uses it.
func (a *Archiver) readCount() int {
	if a.entryBytes == 0 {
		return drainFirst
	}
	return int(max(min(drainBytes/a.entryBytes, drainBatch/a.perPos), 1))
}

// sizeReads takes the size of the entries just read, at read positions,
// into the estimate readCount uses: the larger of their mean a position
// and half the earlier estimate, so a run of large results shrinks the
// reads at once and small ones grow them back, doubling a read.
func (a *Archiver) sizeReads(entries []tier.LogEntry, read int) {
	if read == 0 {
		return
	}
	var n int64
	for i := range entries {
		r := &entries[i].Record
		n += int64(len(r.NS)+len(r.Key)+len(r.Result)) + 64
	}
	a.entryBytes = max(n/int64(read), a.entryBytes/2, 1)
	a.perPos = max(int64(len(entries))/int64(read), a.perPos/2, 1)
}

// seal adds partition p's keys to the filter, saves its group's blob,
// then records p sealed (invariant 5).
func (a *Archiver) seal(ctx context.Context, cur, p int64) error {
	if err := a.refresh(ctx, cur); err != nil {
		return err // the blob must carry every sealed partition of the group
	}
	if p >= a.oldest(cur) {
		if err := a.scanBack(ctx, p); err != nil {
			return err
		}
		if err := a.putBlob(ctx, p); err != nil {
			return err
		}
	}
	hook("blob")
	if err := a.app.Seal(ctx, p); err != nil {
		return err
	}
	if a.next.CompareAndSwap(p, p+1) {
		a.archived.Add(1)
	}
	return nil
}

// WaitApplied waits until the archive applied the log up to its newest
// entry as read now (a Forget's removal, appended before).
func (a *Archiver) WaitApplied(ctx context.Context) error {
	tail, _, _, err := a.c.Log.LogTail(ctx)
	if err != nil {
		return fmt.Errorf("%w: archive: %w", tier.ErrUnavailable, err)
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
			a.Poke()
		}
		select {
		case <-ctx.Done():
			if err == nil {
				err = ctx.Err()
			}
			return fmt.Errorf("%w: archive: the log is not drained up to the forget yet: %w", tier.ErrUnavailable, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
