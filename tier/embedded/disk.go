package embedded

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// allocated walks the store's directory and returns the space its files
// occupy as the operating system counts it (allocated 512-byte blocks,
// which du counts), by part. A file that disappears during the walk (a
// compaction's input, a rotated WAL) is left out; a filesystem that is
// not the operating system's counts each file's size.
func allocated(fs vfs.FS, dir string) tier.DirUsage {
	var u tier.DirUsage
	if dir == "" {
		return u
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
			n := fileBlocks(fi)
			u.Total += n
			*part(&u, r) += n
		}
	}
	walk("")
	return u
}

// fileBlocks is a file's allocated space, or its size when the
// filesystem does not say.
func fileBlocks(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Blocks) * 512
	}
	return uint64(max(fi.Size(), 0))
}

// part returns the figure of u that a file (its path relative to the
// store's directory) counts in.
func part(u *tier.DirUsage, rel string) *uint64 {
	base := filepath.Base(rel)
	top, _, nested := strings.Cut(filepath.ToSlash(rel), "/")
	switch {
	case nested && top == sealedSubdir, base == snapshotName:
		return &u.Filters
	case strings.HasSuffix(base, ".log"):
		return &u.WAL
	case strings.HasSuffix(base, ".sst") && nested && top == pebble.ColdSubdir:
		return &u.ColdTables
	case strings.HasSuffix(base, ".sst"):
		return &u.Tables
	}
	return &u.Other
}
