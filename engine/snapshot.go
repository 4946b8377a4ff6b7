package engine

import (
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier/bloom"
)

// snapshotName is the Bloom snapshot's file name inside Dir.
const snapshotName = "tierdedup-bloom.snapshot"

var errNoSnapshot = errors.New("no bloom snapshot")

// snapshotFile saves and loads the Bloom filters through the engine's
// filesystem, so crash tests on an in-memory filesystem see the same
// protocol as production.
type snapshotFile struct {
	fs        vfs.FS
	dir, path string
}

func newSnapshotFile(fsys vfs.FS, dir string) *snapshotFile {
	if fsys == nil {
		fsys = vfs.Default
	}
	return &snapshotFile{fs: fsys, dir: dir, path: fsys.PathJoin(dir, snapshotName)}
}

// save writes the filters to a temporary file, fsyncs it, renames it over
// the snapshot and fsyncs the directory: a crash leaves the old file or the
// new one, never half of one.
func (s *snapshotFile) save(f *bloom.Filters) (err error) {
	if err := s.fs.MkdirAll(s.dir, 0o755); err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	file, err := s.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = file.Close()
			_ = s.fs.Remove(tmp)
		}
	}()
	if err = f.WriteSnapshot(file); err != nil {
		return err
	}
	if err = file.Sync(); err != nil {
		return err
	}
	if err = file.Close(); err != nil {
		return err
	}
	if err = s.fs.Rename(tmp, s.path); err != nil {
		return err
	}
	return s.syncDir()
}

func (s *snapshotFile) syncDir() error {
	d, err := s.fs.OpenDir(s.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// load restores the filters. With consume, the file is removed (and the
// removal made durable) before load returns nil, so the snapshot can never
// be paired with writes made after this open. On any error the filters are
// left empty.
func (s *snapshotFile) load(f *bloom.Filters, consume bool) error {
	file, err := s.fs.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrNotExist) {
		return errNoSnapshot
	}
	if err != nil {
		return err
	}
	st, err := file.Stat()
	if err == nil {
		err = f.ReadSnapshot(file, st.Size())
	}
	_ = file.Close()
	if err == nil && consume {
		if err = s.fs.Remove(s.path); err == nil {
			err = s.syncDir()
		}
	}
	if err != nil {
		f.Reset()
		return fmt.Errorf("%s: %w", s.path, err)
	}
	return nil
}
