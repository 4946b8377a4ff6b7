package pebble

import (
	"context"
	"errors"
	"fmt"
	"sort"

	dto "github.com/prometheus/client_model/go"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tierdedup/tierdedup/tier"
)

func (s *Store) compactLoop(ctx context.Context) {
	defer close(s.done)
	for {
		select {
		case <-ctx.Done():
			return
		case c := <-s.compactions:
			s.compact(ctx, c)
		}
	}
}

// compaction is a range of one of the store's databases to compact.
type compaction struct {
	db         *pebble.DB
	start, end []byte
}

// queueCompaction asks the background loop to compact [start, end) of db,
// so the space of deleted records leaves the disk. A full queue drops the
// request: the next drop or move covers the range too.
func (s *Store) queueCompaction(db *pebble.DB, start, end []byte) {
	select {
	case s.compactions <- compaction{db, start, end}:
	default:
	}
}

func (s *Store) compact(ctx context.Context, c compaction) {
	// ErrClosed: Close began between the loop's receive and the compaction
	// (Close cancels ctx just after); nothing failed.
	if err := s.compactRange(ctx, c.db, c.start, c.end); err != nil && ctx.Err() == nil && !errors.Is(err, ErrClosed) {
		s.fail(err)
	}
}

// compactRange compacts [start, end) of db and returns Pebble's error, or
// ctx's error as soon as ctx ends. Pebble's Compact itself is never given a
// context that can end: when that context ends between the compaction
// scheduler picking the queued manual compaction and running it, Pebble
// (v2.1.7) removes the compaction from its queue and then panics in a
// background goroutine ("did not find manual compaction with id"), which no
// recover of ours can catch and which ends the process. A compaction the
// caller stopped waiting for runs to its end in the background, and Close
// waits for it before it closes the databases.
func (s *Store) compactRange(ctx context.Context, db *pebble.DB, start, end []byte) error {
	s.compactGate.RLock()
	if s.closed.Load() {
		s.compactGate.RUnlock()
		return ErrClosed
	}
	s.compacting.Add(1)
	s.compactGate.RUnlock()
	done := make(chan error, 1)
	go func() {
		defer s.compacting.Done()
		var err error
		defer func() { done <- err }()
		defer s.guard(&err)
		err = db.Compact(context.Background(), start, end, false)
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Compact compacts every keyspace of both databases now (the records,
// the caller's records, the journal and the store's own values), so the
// bytes of dropped partitions and of journal generations a checkpoint
// trimmed leave the disk; tests and benchmarks use it to measure (with
// the records alone compacted, the journal's range-deleted entries stayed
// in the tables until a compaction of Pebble's own reached them, and the
// measured tables moved by a third from one run to the next). When ctx ends first, Compact returns ctx's error at once and a
// compaction already asked of Pebble runs on; Close waits for it. It
// first moves every sealed partition still in the hot database, so that
// none is measured in both databases (between a move's ingest and its
// excise) or moves while they compact.
func (s *Store) Compact(ctx context.Context) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	if s.cold != nil {
		if err := s.moveSealed(ctx); err != nil {
			return err
		}
	}
	for _, db := range []*pebble.DB{s.db, s.cold} {
		if err := s.compactRange(ctx, db, []byte{spaceMeta}, []byte{spaceLast + 1}); err != nil {
			if ctx.Err() != nil {
				return err
			}
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
	}
	return nil
}

// flush writes the memtable to an SST.
func (s *Store) flush() (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return nil
}

// DiskUsage is the store's disk usage (tier.DiskUsage).
type DiskUsage = tier.DiskUsage

// Disk returns the store's disk usage.
func (s *Store) Disk() DiskUsage {
	var d DiskUsage
	for _, db := range []*pebble.DB{s.db, s.cold} {
		m := db.Metrics()
		d.Total += m.DiskSpaceUsage()
		d.ObsoleteTables += m.Table.Local.ObsoleteSize + m.Table.Local.ZombieSize
		d.WAL += m.WAL.PhysicalSize
		d.RecycledWAL += m.WAL.ObsoletePhysicalSize
		d.WALWritten += m.WAL.BytesWritten
		d.RecycledWALFiles += int(m.WAL.ObsoleteFiles)
		for _, l := range m.Levels {
			d.Tables += uint64(l.TablesSize)
		}
		t := m.Total()
		d.TablesWritten += t.TableBytesFlushed + t.TableBytesCompacted + t.TableBytesIngested
	}
	d.ColdPartitions = s.moved.Load()
	return d
}

// Checkpoint writes a consistent copy of the whole store, every write
// acknowledged before the call included, into dir, which must not exist
// (it is created; sstables are hard-linked when dir is on the same file
// system, other files copied): the hot database into dir, then the cold
// one into dir/cold, with no move or cold write between. The copy opens as a store of its own with
// this store's identity: what makes it valid is the caller's business (the
// engine's Export records a checksum of every file).
func (s *Store) Checkpoint(dir string) (err error) {
	if err := s.usable(); err != nil {
		return err
	}
	defer s.guard(&err)
	s.moveMu.Lock()
	defer s.moveMu.Unlock()
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("%w: checkpoint %s: %w", ErrStorage, dir, err)
	}
	if err := s.cold.Checkpoint(s.fs.PathJoin(dir, ColdSubdir), pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("%w: checkpoint %s: %w", ErrStorage, dir, err)
	}
	return nil
}

// FsyncLatency returns the distribution of the WAL's fsyncs since Open, in
// seconds, on bounds of Pebble's own histogram: for each bound of want,
// the largest of Pebble's bounds at most it (want ascending, each bound
// once) with the fsyncs that took at most that long (cumulative), and the
// count and sum of all of them.
func (s *Store) FsyncLatency(want []float64) (bounds []float64, counts []uint64, count uint64, sum float64) {
	h := s.db.Metrics().LogWriter.FsyncLatency
	if h == nil {
		return nil, nil, 0, 0
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil || m.Histogram == nil {
		return nil, nil, 0, 0
	}
	const ns = 1e-9 // Pebble observes nanoseconds
	buckets := m.Histogram.GetBucket()
	for _, w := range want {
		i := sort.Search(len(buckets), func(i int) bool { return buckets[i].GetUpperBound()*ns > w }) - 1
		if i < 0 {
			continue
		}
		b := buckets[i].GetUpperBound() * ns
		if n := len(bounds); n > 0 && bounds[n-1] == b {
			continue
		}
		bounds, counts = append(bounds, b), append(counts, buckets[i].GetCumulativeCount())
	}
	return bounds, counts, m.Histogram.GetSampleCount(), m.Histogram.GetSampleSum() * ns
}
