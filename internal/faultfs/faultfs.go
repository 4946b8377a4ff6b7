package faultfs

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// ErrInjected is the error a Fault injects (errorfs.ErrInjected).
var ErrInjected = errorfs.ErrInjected

// Kinds of file operation, for Match.
var (
	Reads  = []errorfs.OpKind{errorfs.OpFileRead, errorfs.OpFileReadAt}
	Writes = []errorfs.OpKind{errorfs.OpFileWrite, errorfs.OpFileWriteAt}
	Syncs  = []errorfs.OpKind{errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo}
)

// Match selects file operations: of one of Kinds, on a file whose name (as
// it was opened, directory included) ends with Suffix and contains
// Contains; an empty Suffix or Contains matches every name.
type Match struct {
	Kinds    []errorfs.OpKind
	Suffix   string
	Contains string
}

// The operations tests fail most: the WAL's writes and syncs, and the
// reads of SSTs.
var (
	WALWrites = Match{Kinds: Writes, Suffix: ".log"}
	WALSyncs  = Match{Kinds: Syncs, Suffix: ".log"}
	SSTReads  = Match{Kinds: Reads, Suffix: ".sst"}
)

// Matches reports whether m selects op.
func (m Match) Matches(op errorfs.Op) bool {
	return slices.Contains(m.Kinds, op.Kind) && strings.HasSuffix(op.Path, m.Suffix) && strings.Contains(op.Path, m.Contains)
}

func (m Match) String() string {
	return fmt.Sprintf("operations %v on paths containing %q and ending %q", m.Kinds, m.Contains, m.Suffix)
}

// FS is a vfs.FS whose files consult injectors before each Read, ReadAt,
// Write, WriteAt, Sync, SyncData, SyncTo, Preallocate and Stat: an
// injector's error is returned instead of the operation. Operations on the
// filesystem itself (create, remove, rename, list, lock...) pass through
// unchanged.
type FS struct {
	vfs.FS
	inj   errorfs.Injector
	moves sync.RWMutex
}

// MoveGate is a gate the embedded store's partition moves hold, read
// side, for their duration (tier/pebble looks for this method on its
// filesystem). A test that arms a WAL fault takes the write side first,
// so no move runs while the fault is armed: a move's excise makes Pebble
// rotate its WAL, and Pebble panics when the WAL it closes has failed
// (rotateWAL), which is Pebble's crash, not an answer of the engine's. A
// fault that hit may leave the WAL failed after it is disarmed, unseen by
// any call: the test then holds the gate until the engine is closed (a
// move waits for the gate only until the store's Close ends its context).
func (fs *FS) MoveGate() *sync.RWMutex { return &fs.moves }

// Wrap returns base with injectors consulted, in order, before each file
// operation; the first error returned is the operation's.
func Wrap(base vfs.FS, injectors ...errorfs.Injector) *FS {
	return &FS{FS: base, inj: errorfs.Any(injectors...)}
}

// Unwrap returns the base filesystem.
func (fs *FS) Unwrap() vfs.FS { return fs.FS }

func (fs *FS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &file{File: f, path: name, inj: fs.inj}, nil
}

func (fs *FS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *FS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	return fs.wrap(name, f, err)
}

func (fs *FS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

func (fs *FS) OpenDir(name string) (vfs.File, error) {
	f, err := fs.FS.OpenDir(name)
	return fs.wrap(name, f, err)
}

// ReuseForWrite wraps the reused file under its new name (errorfs does
// not wrap it at all).
func (fs *FS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

// file is a vfs.File of an FS.
type file struct {
	vfs.File
	path string
	inj  errorfs.Injector
}

func (f *file) check(kind errorfs.OpKind, off int64) error {
	return f.inj.MaybeError(errorfs.Op{Kind: kind, Path: f.path, Offset: off})
}

func (f *file) Read(p []byte) (int, error) {
	if err := f.check(errorfs.OpFileRead, 0); err != nil {
		return 0, err
	}
	return f.File.Read(p)
}

func (f *file) ReadAt(p []byte, off int64) (int, error) {
	if err := f.check(errorfs.OpFileReadAt, off); err != nil {
		return 0, err
	}
	return f.File.ReadAt(p, off)
}

func (f *file) Write(p []byte) (int, error) {
	if err := f.check(errorfs.OpFileWrite, 0); err != nil {
		return 0, err
	}
	return f.File.Write(p)
}

func (f *file) WriteAt(p []byte, off int64) (int, error) {
	if err := f.check(errorfs.OpFileWriteAt, off); err != nil {
		return 0, err
	}
	return f.File.WriteAt(p, off)
}

func (f *file) Preallocate(off, length int64) error {
	if err := f.check(errorfs.OpFilePreallocate, off); err != nil {
		return err
	}
	return f.File.Preallocate(off, length)
}

func (f *file) Stat() (vfs.FileInfo, error) {
	if err := f.check(errorfs.OpFileStat, 0); err != nil {
		return nil, err
	}
	return f.File.Stat()
}

func (f *file) Sync() error {
	if err := f.check(errorfs.OpFileSync, 0); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *file) SyncData() error {
	if err := f.check(errorfs.OpFileSyncData, 0); err != nil {
		return err
	}
	return f.File.SyncData()
}

func (f *file) SyncTo(length int64) (bool, error) {
	if err := f.check(errorfs.OpFileSyncTo, 0); err != nil {
		return false, err
	}
	return f.File.SyncTo(length)
}

// Fault is an injector that fails, with ErrInjected, the operations its
// Match selects once armed: every one (Arm), or the n-th (ArmNth). It
// injects nothing until armed.
type Fault struct {
	cur atomic.Pointer[arming]
}

// arming is one arming of a Fault and what it did.
type arming struct {
	match Match
	nth   int64 // 0: every matching operation
	off   atomic.Bool
	seen  atomic.Int64
	hits  atomic.Int64
}

// Arm makes every operation m selects fail, until Disarm or the next arm.
func (f *Fault) Arm(m Match) { f.cur.Store(&arming{match: m}) }

// ArmNth makes the n-th operation m selects from now on fail, once (n >= 1);
// the Fault goes on counting them (Seen) until Disarm or the next arm.
func (f *Fault) ArmNth(m Match, n int64) {
	if n < 1 {
		panic("faultfs: ArmNth of n < 1")
	}
	f.cur.Store(&arming{match: m, nth: n})
}

// Disarm stops the faults; Seen and Hits still tell what the last arming
// did.
func (f *Fault) Disarm() {
	if a := f.cur.Load(); a != nil {
		a.off.Store(true)
	}
}

// Seen returns how many operations the last arming selected while armed.
func (f *Fault) Seen() int64 {
	if a := f.cur.Load(); a != nil {
		return a.seen.Load()
	}
	return 0
}

// Hits returns how many operations the last arming failed.
func (f *Fault) Hits() int64 {
	if a := f.cur.Load(); a != nil {
		return a.hits.Load()
	}
	return 0
}

// MaybeError implements errorfs.Injector.
func (f *Fault) MaybeError(op errorfs.Op) error {
	a := f.cur.Load()
	if a == nil || a.off.Load() || !a.match.Matches(op) {
		return nil
	}
	if n := a.seen.Add(1); a.nth == 0 || n == a.nth {
		a.hits.Add(1)
		return ErrInjected
	}
	return nil
}

func (f *Fault) String() string {
	a := f.cur.Load()
	switch {
	case a == nil || a.off.Load():
		return "faultfs.Fault(disarmed)"
	case a.nth == 0:
		return fmt.Sprintf("faultfs.Fault(every %v)", a.match)
	}
	return fmt.Sprintf("faultfs.Fault(operation %d of %v)", a.nth, a.match)
}

// Gate is an injector that holds the operations its Match selects while
// it is shut, and lets them go on when it opens; it never fails one. Shut
// a gate on the WAL's syncs (WALSyncs) and a commit waits inside its
// durable write. (Holding a background compaction's MANIFEST sync too
// would hold Pebble's metrics, which wait for the manifest.)
type Gate struct {
	match  Match
	mu     sync.Mutex
	shut   bool
	open   chan struct{}
	waited atomic.Int64
}

// NewGate returns an open gate on the operations m selects.
func NewGate(m Match) *Gate { return &Gate{match: m, open: make(chan struct{})} }

// Shut holds the selected operations that start from now on.
func (g *Gate) Shut() {
	g.mu.Lock()
	g.shut, g.open = true, make(chan struct{})
	g.mu.Unlock()
}

// Open lets every held operation go on, and the later ones pass.
func (g *Gate) Open() {
	g.mu.Lock()
	if g.shut {
		g.shut = false
		close(g.open)
	}
	g.mu.Unlock()
}

// Waited returns how many operations the gate held, in all.
func (g *Gate) Waited() int64 { return g.waited.Load() }

// MaybeError implements errorfs.Injector: it waits while the gate is shut.
func (g *Gate) MaybeError(op errorfs.Op) error {
	if !g.match.Matches(op) {
		return nil
	}
	g.mu.Lock()
	shut, open := g.shut, g.open
	g.mu.Unlock()
	if shut {
		g.waited.Add(1)
		<-open
	}
	return nil
}

func (g *Gate) String() string { return fmt.Sprintf("faultfs.Gate(%v)", g.match) }
