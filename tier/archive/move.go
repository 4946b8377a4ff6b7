package archive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/tierdedup/tierdedup/shard"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/bloom"
)

// The embedded store's side: each closed, sealed partition is copied into
// the archive whole (archive), its keys into the filter, its group's
// filter saved; then the exact tier may drop it.

// load drops what expired, loads each group's filter blob and scans back
// every archived partition no blob covers, and sets next.
func (a *Archiver) load(ctx context.Context, cur int64) error {
	oldest := a.oldest(cur)
	held, err := a.expire(ctx, cur)
	if err != nil {
		return err
	}
	names, err := a.store.Blobs(ctx)
	if err != nil {
		return err
	}
	var groups []int64
	for _, n := range names {
		g, ok := blobGroup(n)
		if !ok {
			continue
		}
		if (g+1)*a.group <= oldest {
			_ = a.store.DeleteBlob(ctx, n) // every partition it covers expired
			continue
		}
		groups = append(groups, g)
	}
	covered, err := a.mergeBlobs(ctx, groups)
	if err != nil {
		return err
	}
	// An archive that lost what the store dropped (deleted, replaced by an
	// empty one, restored from an older copy) would answer New for keys
	// committed inside its window: refused.
	if rec, ok, err := a.c.Local.Archived(); err != nil {
		return err
	} else if ok && rec-1 >= oldest && !slices.Contains(held, rec-1) {
		return fmt.Errorf("%w: the archive does not hold partition %d, which the store recorded as archived (and may have dropped): a lost, replaced or older archive", tier.ErrLayout, rec-1)
	}
	next := max(oldest, a.c.Partitions.Of(a.c.OpenedAt))
	for _, p := range held {
		if p < oldest {
			continue
		}
		next = max(next, p+1)
		if c, ok := covered[p/a.group]; ok && p <= c {
			continue
		}
		if err := a.scanBack(ctx, p); err != nil {
			return err
		}
	}
	a.next.Store(next)
	return nil
}

// expire drops from the archive the partitions its window let go when cur
// is current (the one place the archive's partitions are dropped: at
// Open, after each archiving pass, after each drain) and returns the
// partitions it holds then.
func (a *Archiver) expire(ctx context.Context, cur int64) ([]int64, error) {
	if err := a.store.Drop(ctx, a.oldest(cur)); err != nil {
		return nil, err
	}
	held, err := a.store.Archived(ctx)
	if err != nil {
		return nil, err
	}
	a.held.Store(int64(len(held)))
	return held, nil
}

// mergeBlobs merges each group's filter blob into the archive filter and
// returns, for each group whose blob it merged, the newest partition the
// blob covers. A blob refused (another kind, secret or filter parameters,
// a damaged checksum, or a partition outside the group its name gives) is
// logged and left out: its group's partitions are scanned.
func (a *Archiver) mergeBlobs(ctx context.Context, groups []int64) (map[int64]int64, error) {
	covered := map[int64]int64{}
	var srcs []bloom.SnapshotSource
	var merged []int64
	var open []tier.ReadBlob
	defer func() {
		for _, b := range open {
			_ = b.Close()
		}
	}()
	for _, g := range groups {
		b, ok, err := a.store.Blob(ctx, blobName(g))
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		open = append(open, b)
		srcs = append(srcs, bloom.SnapshotSource{R: b, Size: b.Size(), Accept: func(h bloom.SnapshotHeader) error {
			switch {
			case h.Kind != bloom.SnapshotArchive:
				return fmt.Errorf("blob kind %d is not an archive filter", h.Kind)
			case h.Secret != a.check:
				return errors.New("archive filter of another secret")
			case int64(h.Epoch)/a.group != g:
				// Its name and its content disagree (a file copied or
				// renamed): the snapshot's own partition decides.
				return fmt.Errorf("archive filter of partition %d stored as group %d's", h.Epoch, g)
			}
			covered[g] = int64(h.Epoch)
			return nil
		}})
		merged = append(merged, g)
	}
	for i, err := range a.filters.MergeSnapshots(srcs) {
		if err != nil {
			delete(covered, merged[i])
			a.c.Logger.Printf("tierdedup: archive filter blob %s not used, its partitions are scanned: %v", blobName(merged[i]), err)
		}
	}
	return covered, nil
}

// scanBack adds archived partition p's keys to the archive filter.
func (a *Archiver) scanBack(ctx context.Context, p int64) error {
	var fps []shard.Fingerprint
	err := a.store.Scan(ctx, p, func(ns, key []byte) error {
		fps = append(fps, shard.Sum(a.hasher, ns, key))
		if len(fps) == cap(fps) && len(fps) >= 1024 {
			a.filters.Add(fps, p/a.group)
			fps = fps[:0]
		}
		return nil
	})
	a.filters.Add(fps, p/a.group)
	return err
}

// pass archives every closed, sealed partition not archived yet, oldest
// first, expires the archive, and lets the store drop what the archive
// now holds (Release). It stops at a closed partition not sealed yet: the
// store's seal of it wakes the loop again (OnSealed). It reports a
// failure, which the loop tries again.
func (a *Archiver) pass(ctx context.Context) (failed bool) {
	closed := int64(-1)
	for ctx.Err() == nil {
		cur := a.c.Current()
		p := a.next.Load()
		if p >= cur {
			break
		}
		oldest := a.c.Partitions.Oldest(cur)
		if p >= oldest && !a.c.Local.Sealed(p) {
			break // its writes may not all be in yet: its seal wakes the loop
		}
		if p < oldest && closed < oldest {
			// A partition that left the window is never sealed, and a
			// call that read the time before the rotation may still be
			// writing in it: archived and dropped before that write
			// landed, its key (acknowledged New) would be in neither.
			// The store refuses such writes from now on (the call
			// fails) and makes those already sent durable first.
			if err := a.c.Local.CloseWrites(oldest); err != nil {
				if ctx.Err() == nil {
					a.failures.Add(1)
					a.c.Logger.Printf("tierdedup: closing partitions before %d for writes: %v", oldest, err)
				}
				return ctx.Err() == nil
			}
			closed = oldest
		}
		if err := a.archive(ctx, p); err != nil {
			if ctx.Err() == nil {
				a.failures.Add(1)
				a.c.Logger.Printf("tierdedup: archiving partition %d: %v", p, err)
			}
			return true
		}
	}
	if ctx.Err() != nil {
		return false
	}
	cur := a.c.Current()
	if _, err := a.expire(ctx, cur); err != nil {
		a.failures.Add(1)
		a.c.Logger.Printf("tierdedup: expiring the archive: %v", err)
		return true
	}
	a.filters.Rotate(cur / a.group)
	hook("drop")
	if err := a.c.Local.Release(); err != nil {
		a.c.Logger.Printf("tierdedup: dropping archived partitions: %v", err)
		return true
	}
	return false
}

// archive copies partition p of the exact tier into the archive, its keys
// into the archive filter, and saves p's group filter.
func (a *Archiver) archive(ctx context.Context, p int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	g := p / a.group
	fps := make([]shard.Fingerprint, 0, 1024)
	var n uint64
	scanned := false
	err := a.store.Put(ctx, p, func(put func(*tier.Record) error) error {
		scanned = true
		return a.c.Scanner.ScanRecords(ctx, p, func(r *tier.Record) error {
			if a.c.Skip(r.NS) {
				return nil
			}
			fps = append(fps, shard.Sum(a.hasher, r.NS, r.Key))
			if len(fps) == cap(fps) {
				a.filters.Add(fps, g) // before p becomes visible (invariant 2)
				fps = fps[:0]
			}
			if n == 0 {
				hook("put")
			}
			n++
			return put(r)
		})
	})
	a.filters.Add(fps, g)
	if err != nil {
		return err
	}
	if !scanned {
		// The archive held p already, and read nothing of this call: a
		// Put whose reply was lost (a Close, a deadline) landed after this
		// process's Open listed the archive. Its keys come from the
		// archive, before p counts as archived (invariant 2).
		if err := a.scanBack(ctx, p); err != nil {
			return err
		}
	}
	hook("held")
	if err := a.c.Local.SetArchived(p + 1); err != nil {
		return err // before next moves: the exact tier keeps p
	}
	a.next.Store(p + 1)
	a.archived.Add(1)
	a.keys.Add(n)
	if err := a.putBlob(ctx, p); err != nil && ctx.Err() == nil {
		// The next Open scans the partitions the blob misses.
		a.c.Logger.Printf("tierdedup: saving the archive filter of partition %d: %v", p, err)
	}
	hook("blob")
	return nil
}

// putBlob saves the filter of p's group, naming p its newest partition.
func (a *Archiver) putBlob(ctx context.Context, p int64) error {
	g := p / a.group
	return a.store.PutBlob(ctx, blobName(g), func(w io.Writer) error {
		_, err := a.filters.WritePartition(w, g, bloom.SnapshotMeta{Kind: bloom.SnapshotArchive, Secret: a.check, Epoch: uint64(p)})
		return err
	})
}
