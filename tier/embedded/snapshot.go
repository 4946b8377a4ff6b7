package embedded

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
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

// save writes the filters to the snapshot file.
func (s *snapshotFile) save(f *bloom.Filters, meta bloom.SnapshotMeta) error {
	_, _, err := s.saveAs(snapshotName, func(w io.Writer) (uint32, error) { return f.WriteSnapshot(w, meta) })
	return err
}

// saveAs writes name in Dir with write, through a temporary file that is
// fsynced, renamed over name, and the directory fsynced: a crash leaves the
// old file or the new one, never half of one. It returns write's checksum
// and the file's size.
func (s *snapshotFile) saveAs(name string, write func(io.Writer) (uint32, error)) (sum uint32, size int64, err error) {
	if err := mkdirDurable(s.fs, s.dir); err != nil {
		return 0, 0, err
	}
	path := s.fs.PathJoin(s.dir, name)
	tmp := path + ".tmp"
	file, err := s.fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if err != nil {
			_ = file.Close()
			_ = s.fs.Remove(tmp)
		}
	}()
	cw := &countingWriter{w: file}
	if sum, err = write(cw); err != nil {
		return 0, 0, err
	}
	if err = file.Sync(); err != nil {
		return 0, 0, err
	}
	if err = file.Close(); err != nil {
		return 0, 0, err
	}
	if err = s.fs.Rename(tmp, path); err != nil {
		return 0, 0, err
	}
	return sum, cw.n, s.syncDir()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// loadAs opens name in Dir and, if it is size bytes long, calls read with it.
func (s *snapshotFile) loadAs(name string, size int64, read func(io.ReaderAt, int64) error) error {
	file, err := s.openAs(name, size)
	if err != nil {
		return err
	}
	defer file.Close()
	return read(file, size)
}

// openAs opens name in Dir if it is size bytes long; the caller closes it.
func (s *snapshotFile) openAs(name string, size int64) (vfs.File, error) {
	file, err := s.fs.Open(s.fs.PathJoin(s.dir, name))
	if err != nil {
		return nil, err
	}
	st, err := file.Stat()
	if err == nil && st.Size() != size {
		err = fmt.Errorf("%s is %d bytes, its seal says %d", name, st.Size(), size)
	}
	if err != nil {
		_ = file.Close()
		return nil, err
	}
	return file, nil
}

func (s *snapshotFile) syncDir() error { return syncDir(s.fs, s.dir) }

// mkdirDurable creates dir and any missing parents, and syncs the parent
// of each directory it created, so that a machine crash cannot lose the
// directory (and what is later written and synced inside it).
func mkdirDurable(fs vfs.FS, dir string) error {
	var missing []string
	for d := dir; ; d = fs.PathDir(d) {
		if _, err := fs.Stat(d); err == nil {
			break
		}
		missing = append(missing, d)
		if fs.PathDir(d) == d {
			break
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := fs.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := syncDir(fs, fs.PathDir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// load restores the filters if accept takes the snapshot's header. With
// consume, the file is removed (and the removal made durable) whatever the
// outcome, loaded or rejected, so no later Open can pair it with writes
// made after this one; a failed removal is logged, and harmless for the
// default configuration, whose store forgets the snapshot's epoch at open.
// On any error the filters are left empty.
func (s *snapshotFile) load(f *bloom.Filters, accept func(bloom.SnapshotHeader) error, consume bool, logger *log.Logger) error {
	file, err := s.fs.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrNotExist) {
		return errNoSnapshot
	}
	if err != nil {
		return err
	}
	st, err := file.Stat()
	if err == nil {
		err = f.ReadSnapshot(file, st.Size(), accept)
	}
	_ = file.Close()
	if consume {
		rerr := s.fs.Remove(s.path)
		if rerr == nil {
			rerr = s.syncDir()
		}
		if rerr != nil {
			logger.Printf("tierdedup: removing the used bloom snapshot: %v", rerr)
		}
	}
	if err != nil {
		f.Reset()
		return fmt.Errorf("%s: %w", s.path, err)
	}
	return nil
}

// header reads the snapshot's header without loading it; errNoSnapshot if
// there is none.
func (s *snapshotFile) header() (bloom.SnapshotHeader, error) {
	file, err := s.fs.Open(s.path)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, os.ErrNotExist) {
		return bloom.SnapshotHeader{}, errNoSnapshot
	}
	if err != nil {
		return bloom.SnapshotHeader{}, err
	}
	defer file.Close()
	st, err := file.Stat()
	if err != nil {
		return bloom.SnapshotHeader{}, err
	}
	h, _, err := bloom.ReadSnapshotHeader(file, st.Size())
	return h, err
}

// refuseState refuses to open a store in a directory that holds bloom-only
// state: the other configuration's data would be ignored, then destroyed.
func (s *snapshotFile) refuseState() error {
	if s == nil {
		return nil
	}
	h, err := s.header()
	if err == nil && h.Kind == bloom.SnapshotState {
		return layoutError("Tiers", "bloom", "memory+bloom+pebble")
	}
	return nil // no snapshot, or a damaged one: the store's Open consumes it
}

// refuseStore refuses bloom-only in a directory that holds a Pebble store.
func (s *snapshotFile) refuseStore() error {
	if s.holdsStore() {
		return layoutError("Tiers", "memory+bloom+pebble", "bloom")
	}
	return nil
}

// holdsStore reports whether the directory holds a Pebble store.
func (s *snapshotFile) holdsStore() bool {
	names, err := s.fs.List(s.dir)
	if err != nil {
		return false // no directory yet
	}
	for _, n := range names {
		if n == "CURRENT" || strings.HasPrefix(n, "MANIFEST-") || strings.HasPrefix(n, "marker.manifest") {
			return true
		}
	}
	return false
}

// exists reports whether the snapshot file exists.
func (s *snapshotFile) exists() bool {
	_, err := s.fs.Stat(s.path)
	return err == nil
}

// lockName is bloom-only's lock file inside Dir (a store has Pebble's).
const lockName = "tierdedup.lock"

// lock takes Dir for this process, or fails with tier.ErrLocked.
func (s *snapshotFile) lock() (io.Closer, error) {
	if err := mkdirDurable(s.fs, s.dir); err != nil {
		return nil, fmt.Errorf("%w: %w", tier.ErrStorage, err)
	}
	l, err := s.fs.Lock(s.fs.PathJoin(s.dir, lockName))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", tier.ErrLocked, s.dir, err)
	}
	return l, nil
}
