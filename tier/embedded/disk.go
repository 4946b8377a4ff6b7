package embedded

import (
	"path/filepath"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// allocated walks the store's directory and returns the space its files
// occupy as the operating system counts it (pebble.WalkAllocated), by
// part.
func allocated(fs vfs.FS, dir string) tier.DirUsage {
	var u tier.DirUsage
	pebble.WalkAllocated(fs, dir, func(rel string, n uint64) {
		u.Total += n
		*part(&u, rel) += n
	})
	return u
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
