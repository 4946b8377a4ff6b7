package pebble

import (
	"os"
	"path/filepath"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// WalkAllocated calls each with the path (relative to dir) and the
// allocated space of every file under dir, as the operating system counts
// it (512-byte blocks: what du counts). A file that disappears during the
// walk (a compaction's input, a rotated WAL) is left out; a filesystem
// that is not the operating system's gives each file's size. A nil fs is
// the operating system's.
func WalkAllocated(fs vfs.FS, dir string, each func(rel string, bytes uint64)) {
	if dir == "" {
		return
	}
	if fs == nil {
		fs = vfs.Default
	}
	var walk func(rel string)
	walk = func(rel string) {
		names, err := fs.List(fs.PathJoin(dir, rel))
		if err != nil {
			return
		}
		for _, n := range names {
			r := filepath.Join(rel, n)
			fi, err := fs.Stat(fs.PathJoin(dir, r))
			if err != nil {
				continue
			}
			if fi.IsDir() {
				walk(r)
				continue
			}
			each(r, fileBlocks(fi))
		}
	}
	walk("")
}

// fileBlocks is a file's allocated space, or its size when the
// filesystem does not say.
func fileBlocks(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Blocks) * 512
	}
	return uint64(max(fi.Size(), 0))
}

// DiskBytes is the archive directory's allocated space (tier.DiskUser).
func (ar *archive) DiskBytes() uint64 {
	var n uint64
	WalkAllocated(ar.fs, ar.dir, func(_ string, b uint64) { n += b })
	return n
}
