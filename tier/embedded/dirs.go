package embedded

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// openDirs is this process's open engine directories on the operating
// system's file system, by file identity (device and inode, through
// os.SameFile), so that another spelling of a path (relative, through a
// symbolic link or a bind mount) names the same directory. Import refuses
// them: a file lock does not exclude its own process.
var openDirs struct {
	sync.Mutex
	m map[*Store]os.FileInfo // protected by the mutex
}

// holdDir records e's directory as open (the operating system's file
// system only; an in-memory one locks within the process itself).
func (s *Store) holdDir(fs vfs.FS, dir string) {
	fi, ok := dirInfo(fs, dir)
	if !ok {
		return
	}
	openDirs.Lock()
	defer openDirs.Unlock()
	if openDirs.m == nil {
		openDirs.m = map[*Store]os.FileInfo{}
	}
	openDirs.m[s] = fi
}

// reserveDir records s's directory as open unless an engine of this
// process holds it already (false): checked and recorded in one step, so
// two Opens under different spellings cannot both pass. A directory that
// does not exist yet is recorded once Open created it (holdDir).
func (s *Store) reserveDir(fs vfs.FS, dir string) bool {
	fi, ok := dirInfo(fs, dir)
	if !ok {
		return true
	}
	openDirs.Lock()
	defer openDirs.Unlock()
	if heldLocked(fi) {
		return false
	}
	if openDirs.m == nil {
		openDirs.m = map[*Store]os.FileInfo{}
	}
	openDirs.m[s] = fi
	return true
}

func (s *Store) releaseDir() {
	openDirs.Lock()
	defer openDirs.Unlock()
	delete(openDirs.m, s)
}

// heldOpen reports whether an engine of this process holds dir.
func heldOpen(fs vfs.FS, dir string) bool {
	fi, ok := dirInfo(fs, dir)
	if !ok {
		return false
	}
	openDirs.Lock()
	defer openDirs.Unlock()
	return heldLocked(fi)
}

// dirInfo returns dir's identity on the operating system's file system
// (false on another, or where dir does not exist).
func dirInfo(fs vfs.FS, dir string) (os.FileInfo, bool) {
	if fs != vfs.Default {
		return nil, false
	}
	fi, err := os.Stat(dir)
	return fi, err == nil
}

// heldLocked reports whether an open directory is fi; openDirs is held.
func heldLocked(fi os.FileInfo) bool {
	for _, o := range openDirs.m {
		if os.SameFile(fi, o) {
			return true
		}
	}
	return false
}

// canonical returns path cleaned and, on the operating system's file
// system, absolute with its symbolic links resolved where it exists: the
// one spelling under which a directory is renamed and replaced.
func canonical(fs vfs.FS, path string) string {
	if fs != vfs.Default {
		return filepath.Clean(path)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return filepath.Clean(path)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		return real
	}
	return abs
}

// overlap reports whether the directories a and b are the same, or one
// holds the other: by file identity along their existing ancestors on the
// operating system's file system, by cleaned path on another.
func overlap(fs vfs.FS, a, b string) bool {
	if fs != vfs.Default {
		a, b = filepath.Clean(a), filepath.Clean(b)
		sep := string(filepath.Separator)
		return a == b || strings.HasPrefix(a, b+sep) || strings.HasPrefix(b, a+sep) || a == "." || b == "."
	}
	return inside(a, b) || inside(b, a)
}

// inside reports whether path a is the directory b or lies inside it, by
// file identity along a's existing ancestors (b must exist; a need not).
func inside(a, b string) bool {
	target, err := os.Stat(b)
	if err != nil {
		return false
	}
	p, err := filepath.Abs(a)
	if err != nil {
		return false
	}
	for {
		if fi, err := os.Stat(p); err == nil && os.SameFile(fi, target) {
			return true
		}
		parent := filepath.Dir(p)
		if parent == p {
			return false
		}
		p = parent
	}
}
