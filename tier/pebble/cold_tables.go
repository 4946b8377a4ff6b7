package pebble

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// tableSet writes sorted records into table files of at most about
// moveTableSize in dir, named name-N plus suffix, then a last table holding
// a marker: the files a move or an archive's Put ingests at once. The
// caller removes paths after the ingest (or on failure).
type tableSet struct {
	fs                vfs.FS
	dir, name, suffix string
	opts              sstable.WriterOptions
	w                 *sstable.Writer
	paths             []string
}

func (t *tableSet) closeTable() error {
	if t.w == nil {
		return nil
	}
	err := t.w.Close()
	t.w = nil
	return err
}

func (t *tableSet) newTable() error {
	path := t.fs.PathJoin(t.dir, t.name+"-"+strconv.Itoa(len(t.paths))+t.suffix)
	f, err := t.fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	t.paths = append(t.paths, path)
	t.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), t.opts)
	return nil
}

// set adds a record, in key order, starting a table when the current one
// is full.
func (t *tableSet) set(k, v []byte) error {
	if t.w == nil || t.w.Raw().EstimatedSize() >= moveTableSize {
		if err := t.closeTable(); err != nil {
			return err
		}
		if err := t.newTable(); err != nil {
			return err
		}
	}
	return t.w.Set(k, v)
}

// finish closes the records' table and writes the marker's.
func (t *tableSet) finish(marker, value []byte) error {
	err := t.closeTable()
	if err == nil {
		err = t.newTable()
	}
	if err == nil {
		err = t.w.Set(marker, value)
	}
	if cerr := t.closeTable(); err == nil {
		err = cerr
	}
	return err
}

// writeMoveTables writes partition p's records from the hot database into
// tables of at most about moveTableSize, then the marker table, and
// returns their paths in key order.
func (s *Store) writeMoveTables(ctx context.Context, p int64) (paths []string, err error) {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: recordPrefix(p), UpperBound: recordPrefix(p + 1)})
	if err != nil {
		return nil, s.fail(err)
	}
	defer it.Close()
	t := &tableSet{fs: s.fs, dir: s.dir, name: "p" + strconv.FormatInt(p, 10), suffix: moveTmpSuffix,
		opts: s.coldOpts.MakeWriterOptions(len(s.coldOpts.Levels)-1, s.cold.TableFormat())}
	defer func() { _ = t.closeTable() }()
	var n uint64
	for ok := it.First(); ok; ok = it.Next() {
		if n%4096 == 0 && ctx.Err() != nil {
			return t.paths, ctx.Err()
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return t.paths, s.fail(err)
		}
		if err := t.set(it.Key(), v); err != nil {
			return t.paths, fmt.Errorf("%w: move: %w", ErrStorage, err)
		}
		n++
	}
	if err := it.Error(); err != nil {
		return t.paths, s.fail(err)
	}
	if err := t.finish(markerKey(p), binary.LittleEndian.AppendUint64(nil, n)); err != nil {
		return t.paths, fmt.Errorf("%w: move: %w", ErrStorage, err)
	}
	return t.paths, nil
}

// iters is a read's view of the two databases: the hot iterator, created
// first, the partitions the cold database holds as read after it, and the
// cold iterator, created on first use.
type iters struct {
	s        *Store
	opts     *pebble.IterOptions
	hot      *pebble.Iterator
	cold     *pebble.Iterator
	coldUpTo int64
}

func (s *Store) newIters(opts *pebble.IterOptions) (*iters, error) {
	hot, err := s.db.NewIter(opts)
	if err != nil {
		return nil, s.fail(err)
	}
	return &iters{s: s, opts: opts, hot: hot, coldUpTo: s.coldUpTo.Load()}, nil
}

// of returns the iterator that holds partition p.
func (v *iters) of(p int64) (*pebble.Iterator, error) {
	if p > v.coldUpTo {
		return v.hot, nil
	}
	if v.cold == nil {
		it, err := v.s.cold.NewIter(v.opts)
		if err != nil {
			return nil, v.s.fail(err)
		}
		v.cold = it
	}
	return v.cold, nil
}

func (v *iters) close() {
	_ = v.hot.Close()
	if v.cold != nil {
		_ = v.cold.Close()
	}
}
