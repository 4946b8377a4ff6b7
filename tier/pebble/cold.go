package pebble

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/internal/hooks"
)

// The store is two Pebble databases in one directory:
//
//   - the hot database (Dir itself) takes every write: the partitions not
//     yet sealed, attempt counts, the caller's records and the meta
//     records (layout, clock, seals, snapshot epoch);
//   - the cold database (Dir/cold) holds the sealed partitions, each moved
//     there once, as sorted tables ingested into its bottom level, and is
//     written afterwards only by Forget and Drop.
//
// So the hot database's LSM holds about one partition whatever the
// window, and a week of history costs today's writes nothing: its
// compactions never grow with the window, and a sealed partition is
// never rewritten (measured in docs/performance.md).
//
// Moving sealed partition P (move, under moveMu):
//
//  1. the records of P are read from the hot database, in key order, into
//     table files beside the cold database, with a marker table holding
//     the cold key marker(P);
//  2. the tables are ingested into the cold database in one Ingest, which
//     is atomic and durable when it returns: the marker is there exactly
//     when the records are;
//  3. the hot database records keyMoved = P, synced, and coldUpTo becomes
//     P (reads of P go to the cold database from then on);
//  4. P's records are excised from the hot database (exciseHot).
//
// A crash between 2 and 3 leaves P in both, read from the hot one, which
// alone is the partition (a Forget may have changed it since): Open
// deletes the cold copy of every partition after keyMoved, and the mover
// moves P again.
// A crash between 3 and 4 leaves P's records in the hot database, unread;
// Open excises them. A
// crash before 2 leaves P in the hot database only, and it is moved again.
// A reader creates its hot iterator before it loads coldUpTo and its cold
// iterator after, so whichever it reads P from holds all of it.
//
// What makes the cold database invalid, and who checks (Open, ErrLayout):
// a cold database whose recorded store ID is not the hot database's, a
// hot database that recorded a move with no cold database beside it, and
// a cold database with records but without its ID. A version 2 store has none and opens
// with nothing moved; its sealed partitions move in the background.
var (
	keyMoved  = []byte{spaceMeta, 'm', 'v'} // hot: the newest partition moved, u64
	keyColdID = []byte{spaceMeta, 'i', 'd'} // cold: the store ID it belongs to
)

// ColdSubdir is the cold database's directory inside Dir: a copy of the
// store (an export) holds it beside the hot database's files.
const ColdSubdir = "cold"

// moveTmpSuffix names the tables a move writes before ingesting them; a
// crash leaves them behind and Open removes them.
const moveTmpSuffix = ".move-tmp"

// moveTableSize is the size at which a move starts a new table. Tables of
// 128 MiB, when they carried filter blocks (megabytes each, loaded whole by
// a read), thrashed the block cache and cost a read syscall per lookup;
// the move's tables now carry none (Open: coldOpts), and 8 MiB keeps each
// table's index small for the same reason.
const moveTableSize = 8 << 20

// markersEnd is above every marker key (markerKey clamps a partition past
// MaxPartition to it, so markerKey(MaxPartition+1) is not).
var markersEnd = []byte{spaceMeta, 'm', 'k' + 1}

func markerKey(p int64) []byte {
	return binary.BigEndian.AppendUint32([]byte{spaceMeta, 'm', 'k'}, uint32(min(max(p, 0), MaxPartition)))
}

// MovedUpTo returns the newest partition the store moved to the cold
// database (-1 for none), as its move record says.
func (s *Store) MovedUpTo() int64 { return s.coldUpTo.Load() }

// openCold opens or creates the cold database in dir/cold with opts and
// checks it belongs to this store. A move a crash interrupted is the
// mover's to complete: its partition is still in the hot database, where
// reads find it until then.
func (s *Store) openCold(dir string, fs vfs.FS, opts *pebble.Options) error {
	s.coldUpTo.Store(-1)
	moved, err := s.meta(keyMoved)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		moved = -1
	case err != nil:
		return err
	}
	path := fs.PathJoin(dir, ColdSubdir)
	if _, err := fs.Stat(path); moved >= 0 && err != nil {
		return &LayoutError{Field: "cold store", Stored: "missing", Wanted: fmt.Sprintf("%s holding the partitions up to %d", path, moved)}
	}
	if err := removeSuffixed(fs, dir, moveTmpSuffix); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	cold, err := openDB(path, opts)
	if err != nil {
		if isLockError(err) {
			return fmt.Errorf("%w: %s: %w", ErrLocked, path, err)
		}
		return fmt.Errorf("%w: open %s: %w", ErrStorage, path, err)
	}
	s.cold = cold
	id, closer, err := cold.Get(keyColdID)
	switch {
	case errors.Is(err, pebble.ErrNotFound) && moved < 0:
		// A new cold database (an empty directory is one: an import of a
		// store that had moved nothing makes it) is bound to the store.
		if empty, err := isEmpty(cold); err != nil || !empty {
			if err != nil {
				return err
			}
			return &LayoutError{Field: "cold store", Stored: "records without its store ID", Wanted: fmt.Sprintf("%x", s.layout.ID)}
		}
		if err := cold.Set(keyColdID, s.layout.ID[:], pebble.Sync); err != nil {
			return fmt.Errorf("%w: %w", ErrStorage, err)
		}
	case errors.Is(err, pebble.ErrNotFound):
		return &LayoutError{Field: "cold store", Stored: "without its store ID", Wanted: fmt.Sprintf("%x", s.layout.ID)}
	case err != nil:
		return fmt.Errorf("%w: %w", ErrStorage, err)
	default:
		same := bytes.Equal(id, s.layout.ID[:])
		stored := fmt.Sprintf("%x", id)
		closer.Close()
		if !same {
			return &LayoutError{Field: "cold store ID", Stored: stored, Wanted: fmt.Sprintf("%x", s.layout.ID)}
		}
	}
	s.coldUpTo.Store(moved)
	// A crash between an ingest and its record leaves a copy in the cold
	// database that the hot one may have outgrown since (a Forget reads
	// and deletes in the hot one until the move is recorded): only the hot
	// copy is the partition, so the cold one goes and the mover moves it
	// again.
	if err := s.dropUnrecorded(moved); err != nil {
		return err
	}
	// A crash between recording a move and the excise leaves the moved
	// partitions' records in the hot database, unread: take them out.
	if moved >= 0 {
		if _, left, err := s.firstPartition(0, moved+1); err != nil {
			return err
		} else if left {
			return s.exciseHot(moved + 1)
		}
	}
	return nil
}

// isEmpty reports whether db holds no key.
func isEmpty(db *pebble.DB) (bool, error) {
	it, err := db.NewIter(nil)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	defer it.Close()
	if it.First() {
		return false, nil
	}
	if err := it.Error(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return true, nil
}

// dropUnrecorded deletes from the cold database, synced, every record and
// marker of a partition after moved, the last move the hot database
// recorded.
func (s *Store) dropUnrecorded(moved int64) error {
	it, err := s.cold.NewIter(&pebble.IterOptions{LowerBound: markerKey(moved + 1), UpperBound: markersEnd})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	found := it.First()
	err = it.Error()
	it.Close()
	if err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	if !found {
		return nil
	}
	b := s.cold.NewBatch()
	defer b.Close()
	_ = b.DeleteRange(recordPrefix(moved+1), recordPrefix(MaxPartition+1), nil) // a batch's writes fail only when it is committing
	_ = b.DeleteRange(markerKey(moved+1), markersEnd, nil)
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("%w: %w", ErrStorage, err)
	}
	return nil
}

// coldHas reports whether partition p's move was ingested.
func (s *Store) coldHas(p int64) (bool, error) {
	_, closer, err := s.cold.Get(markerKey(p))
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, s.fail(err)
	}
	closer.Close()
	return true, nil
}

// finishMove is steps 3 and 4 of a move: reads of p go to the cold
// database, and the hot one forgets p.
func (s *Store) finishMove(p int64) error {
	if err := s.set(keyMoved, binary.LittleEndian.AppendUint64(nil, uint64(p))); err != nil {
		return err
	}
	for {
		cur := s.coldUpTo.Load()
		if p <= cur || s.coldUpTo.CompareAndSwap(cur, p) {
			break
		}
	}
	if err := s.exciseHot(p + 1); err != nil {
		return err
	}
	s.moved.Add(1)
	return nil
}

// exciseHot takes every record of the partitions before `before` out of
// the hot database at once (Pebble's Excise: whole tables leave the LSM,
// and tables that straddle the span are narrowed), so they stop counting
// in its level sizes and compactions: a range deletion would stay in the
// LSM until compactions carried it down over the data, and the moved
// partitions would go on shaping the compactions of the open one. Iterators
// opened before still see them.
func (s *Store) exciseHot(before int64) (err error) {
	defer s.guard(&err)
	if err := s.usable(); err != nil {
		return err
	}
	if err := s.db.Excise(context.Background(), pebble.KeyRange{Start: recordPrefix(0), End: recordPrefix(before)}); err != nil {
		return s.fail(err)
	}
	return nil
}

// moveLoop moves sealed partitions into the cold database whenever it is
// woken (by SealPartition, and once at Open). It stops when ctx ends or
// the Store fails.
func (s *Store) moveLoop(ctx context.Context) {
	defer close(s.moverDone)
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.moveWake:
		}
		if err := s.moveSealed(ctx); err != nil {
			if ctx.Err() == nil && !errors.Is(err, ErrStorage) {
				s.logger.Printf("tierdedup/pebble: moving sealed partitions: %v", err)
			}
		}
	}
}

func (s *Store) wakeMover() {
	select {
	case s.moveWake <- struct{}{}:
	default:
	}
}

// moveSealed moves every sealed live partition not moved yet, oldest
// first. Partitions without records, and those that left the window (the
// next Drop deletes them), are skipped.
func (s *Store) moveSealed(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := s.usable(); err != nil {
			return err
		}
		sealed := s.sealed.Load()
		from := s.coldUpTo.Load() + 1
		switch hw, err := s.HighWater(); {
		case s.keepExpired:
			// Skipping one would leave it in the hot database below
			// coldUpTo, where no read looks.
			from = max(from, s.droppedBefore.Load())
		case err == nil && s.layout.Partition > 0:
			from = max(from, hw/int64(s.layout.Partition)-int64(s.layout.Window/s.layout.Partition)-1)
		}
		p, ok, err := s.firstPartition(from, sealed+1)
		if err != nil || !ok {
			return err
		}
		if err := s.move(ctx, p); err != nil {
			return err
		}
	}
	return ctx.Err()
}

// firstPartition returns the first partition in [from, to) holding a
// record in the hot database.
func (s *Store) firstPartition(from, to int64) (p int64, ok bool, err error) {
	if to <= from {
		return 0, false, nil
	}
	defer s.guard(&err)
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(from), UpperBound: recordPrefix(to)})
	if err != nil {
		return 0, false, s.fail(err)
	}
	defer it.Close()
	if !it.First() {
		if err := it.Error(); err != nil {
			return 0, false, s.fail(err)
		}
		return 0, false, nil
	}
	p, _, _, err = parseRecordKey(it.Key())
	if err != nil {
		return 0, false, s.fail(err)
	}
	return p, true, nil
}

// moveGater is a filesystem whose user can keep moves out for a while
// (a test's fault injection: internal/faultfs). Open takes the gate from
// Options.FS, before wrapping it (walFS), which would hide the method. A
// move waits for the gate until ctx ends: a test may hold it across the
// Store's Close, which ends ctx and waits for the mover.
type moveGater interface{ MoveGate() *sync.RWMutex }

// moveGateOf returns fs's move gate, or nil.
func moveGateOf(fs vfs.FS) *sync.RWMutex {
	if g, ok := fs.(moveGater); ok {
		return g.MoveGate()
	}
	return nil
}

// move moves sealed partition p into the cold database (steps 1 to 4).
func (s *Store) move(ctx context.Context, p int64) (err error) {
	if gate := s.moveGate; gate != nil {
		for !gate.TryRLock() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Millisecond):
			}
		}
		defer gate.RUnlock()
	}
	s.moveMu.Lock()
	defer s.moveMu.Unlock()
	defer s.guard(&err)
	if p <= s.coldUpTo.Load() {
		return nil
	}
	// A marker here is an ingest of this process whose record failed
	// (moveMu has been held since, so nothing changed the hot copy): the
	// move completes. One a crash left was removed at Open.
	if ok, err := s.coldHas(p); err != nil || ok {
		if err == nil {
			err = s.finishMove(p)
		}
		return err
	}
	paths, err := s.writeMoveTables(ctx, p)
	defer func() {
		for _, path := range paths {
			_ = s.fs.Remove(path)
		}
	}()
	if err != nil {
		return err
	}
	if err := s.cold.Ingest(ctx, paths); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return s.fail(err)
	}
	if f := hooks.InMove.Load(); f != nil {
		(*f)()
	}
	return s.finishMove(p)
}
