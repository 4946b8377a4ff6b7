package enginetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
)

// WaitArchived waits until no closed partition of e waits for the
// archive, failing t after 60 s or when a sealing pass failed.
func WaitArchived(t testing.TB, e *engine.Engine) {
	t.Helper()
	// A jump of hundreds of partitions (TestReadAttackClockFarAhead's 400
	// days) takes over 20 s to archive under -race on a loaded machine
	// (Lag 23 of 400 left at 20 s in one CI run).
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if st := e.Stats(); st.Archive != nil && st.Archive.Lag == 0 {
			if st.Bloom.SealFailures > 0 {
				// The recorded clock moved back (a drop raced a rotation):
				// a closed partition could not be sealed.
				t.Fatalf("%d sealing passes failed", st.Bloom.SealFailures)
			}
			return
		}
	}
	st := e.Stats()
	t.Fatalf("the archive still lags: %+v (filters %s, %d sealed, %d seal failures)", st.Archive, st.Bloom.Mode, st.Bloom.Sealed, st.Bloom.SealFailures)
}

// MarkIn marks key in namespace ns of e and fails t on an error.
func MarkIn(t testing.TB, e *engine.Engine, ns, key string) engine.Outcome {
	t.Helper()
	n, err := e.Namespace(ns)
	if err != nil {
		t.Fatal(err)
	}
	o, err := n.MarkIfAbsent(context.Background(), []byte(key))
	if err != nil {
		t.Fatalf("mark %s/%s: %v", ns, key, err)
	}
	return o
}

// CrashFS is a crashable in-memory filesystem whose Link fails, so Pebble
// copies instead (vfs.LinkOrCopy): Pebble's crashable MemFS takes its
// clone lock twice in Link, and a CrashClone waiting between the two
// deadlocks both, which an ingest of a moved partition would hit. Its
// ReuseForWrite avoids the same in MemFS's.
type CrashFS struct{ *vfs.MemFS }

// NewCrashFS returns an empty CrashFS.
func NewCrashFS() CrashFS { return CrashFS{vfs.NewCrashableMem()} }

// Link refuses, so the caller copies.
func (CrashFS) Link(oldname, newname string) error {
	return errors.New("crashFS: no hard links")
}

// ReuseForWrite is MemFS.ReuseForWrite without its clone lock taken
// twice: MemFS's takes it, then calls Rename, which takes it again, and a
// CrashClone waiting between the two deadlocks all three (a WAL recycled
// while a test clones the filesystem every few milliseconds did, in
// TestArchiveAttackCrashWhileArchiving). A clone between the rename and
// the open is a crash between them, a state a disk can be in.
func (f CrashFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := f.MemFS.Rename(oldname, newname); err != nil {
		return nil, err
	}
	return f.MemFS.OpenReadWrite(newname, c)
}

// CrashClone is MemFS.CrashClone, wrapped.
func (f CrashFS) CrashClone(cfg vfs.CrashCloneCfg) CrashFS { return CrashFS{f.MemFS.CrashClone(cfg)} }

// StepClock is a crash child's clock: Base plus a minute per step
// (Steps.Add(1)).
type StepClock struct {
	Base  time.Time
	Steps atomic.Int64
}

// Now is Base plus a minute per step.
func (c *StepClock) Now() time.Time { return c.Base.Add(time.Duration(c.Steps.Load()) * time.Minute) }

// FixedClock is a clock that stays at its value (Unix ns).
type FixedClock int64

// Now is the clock's value.
func (c FixedClock) Now() time.Time { return time.Unix(0, int64(c)) }
