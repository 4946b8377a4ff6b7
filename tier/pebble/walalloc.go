package pebble

import (
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The WAL's preallocation follows what the WAL holds.
//
// Pebble preallocates each WAL file in blocks of 1.1 × MemTableSize (70
// MiB at the default 64 MiB), so that an append rarely changes the
// file's extents, which each fdatasync would otherwise write too. A store
// holding one key then takes 74 MiB of disk for its WAL, and one that
// flushed a few small memtables (a partition dropped, a store closed)
// keeps several such files for reuse, each as allocated as a full one:
// 500 MB at 100k keys (TestDiskIsWhatTheOSCounts). walFS keeps the
// benefit and drops the waste: a WAL file's blocks are allocated ahead of
// its writes in chunks as large as what the file holds already (at least
// walChunkMin, at most walChunkMax), so a file never has more than about
// twice what was written to it allocated, and a full one takes about as
// many fallocate calls as doublings. Pebble's own block-sized calls are
// ignored. A recycled file keeps the blocks it had.

const (
	walChunkMin = 1 << 20
	walChunkMax = 64 << 20
)

// walFS is fs with the WAL's files (*.log) preallocated as above.
type walFS struct{ vfs.FS }

func isWAL(name string) bool { return strings.HasSuffix(name, ".log") }

// Create creates name; a WAL file is preallocated as it grows.
func (fs walFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || !isWAL(name) {
		return f, err
	}
	return &walFile{File: f}, nil
}

// ReuseForWrite reuses a WAL file, which keeps the blocks it had.
func (fs walFS) ReuseForWrite(oldname, newname string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, category)
	if err != nil || !isWAL(newname) {
		return f, err
	}
	w := &walFile{File: f}
	if fi, err := f.Stat(); err == nil {
		w.allocated = fi.Size()
	}
	return w, nil
}

// walFile is a WAL file preallocated in chunks ahead of its writes.
type walFile struct {
	vfs.File
	mu                sync.Mutex
	offset, allocated int64
}

// Preallocate ignores Pebble's preallocation: Write allocates.
func (f *walFile) Preallocate(offset, length int64) error { return nil }

// Write allocates the next chunk when p would pass the allocated end,
// then writes p.
func (f *walFile) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if end := f.offset + int64(len(p)); end > f.allocated {
		chunk := min(max(f.allocated, walChunkMin), walChunkMax)
		n := max(end-f.allocated, chunk)
		// A failed preallocation (a filesystem without fallocate) only
		// loses what it saves.
		if err := f.File.Preallocate(f.allocated, n); err == nil {
			f.allocated += n
		} else {
			f.allocated = end
		}
	}
	n, err := f.File.Write(p)
	f.offset += int64(n)
	return n, err
}
