package enginetest_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/internal/enginetest"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// sealedEngine opens an engine with hour partitions over a 4-hour window
// (5 live partitions) on fs and marks perHour keys in each of hours hours,
// moving the clock an hour after each but the last; it waits until every
// closed partition since the store's creation is sealed (older ones hold
// nothing and are not sealed).
func sealedEngine(t *testing.T, fs vfs.FS, clock *fakeClock, hours, perHour int) (*engine.Engine, engine.Options, [][]byte) {
	t.Helper()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	var all [][]byte
	for h := range hours {
		keys := make([][]byte, perHour)
		for i := range keys {
			keys[i] = fmt.Appendf(nil, "hour-%d-key-%d", h, i)
		}
		out := make([]engine.Outcome, len(keys))
		if err := e.MarkBatch(context.Background(), keys, nil, out); err != nil {
			t.Fatal(err)
		}
		all = append(all, keys...)
		if h < hours-1 {
			clock.Add(time.Hour)
		}
	}
	waitSealed(t, e, clock.Now().Add(-time.Hour))
	if n, want := e.Stats().Bloom.Sealed, uint64(min(hours-1, 4)); n != want { // 4: the window's closed partitions
		t.Fatalf("%d partitions sealed, want %d", n, want)
	}
	return e, o, all
}

// closed is the number of closed partitions sealedEngine leaves sealed
// with 4 hours: hours 0, 1 and 2.
const closed = 3

// hourFile is the sealed file of hour h of sealedEngine's history.
func hourFile(h int) string {
	return fmt.Sprintf("db/tierdedup-sealed/tierdedup-bloom.p%d.sealed", newClock().Now().Add(time.Duration(h)*time.Hour).UnixNano()/int64(time.Hour))
}

// holdDurable holds the next durable write (a commit, an attempt count)
// after it read the engine's time and before it writes: held is closed
// once it waits, and free lets it go (once; later calls do nothing). Only
// that one write is held.
func holdDurable(t *testing.T) (held <-chan struct{}, free func()) {
	t.Helper()
	h, release := make(chan struct{}), make(chan struct{})
	var once, freed sync.Once
	enginetest.SetBeforeDurable(func() {
		once.Do(func() {
			enginetest.SetBeforeDurable(nil)
			close(h)
			<-release
		})
	})
	t.Cleanup(func() { enginetest.SetBeforeDurable(nil) })
	return h, func() { freed.Do(func() { close(release) }) }
}

// sealed reports whether the partition of at is sealed, as Stats lists
// it (false while a sealing pass runs).
func sealed(e *engine.Engine, at time.Time) bool {
	for _, p := range e.Stats().Bloom.Partitions {
		if !p.Start.After(at) && at.Sub(p.Start) < time.Hour {
			return p.Sealed
		}
	}
	return false
}

// waitSealed waits until the partitions of at (hour partitions) are
// sealed, and no sealing pass runs.
func waitSealed(t *testing.T, e *engine.Engine, at ...time.Time) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range at {
		for !sealed(e, a) {
			if time.Now().After(deadline) {
				t.Fatalf("partition of %v not sealed (%d sealed)", a, e.Stats().Bloom.Sealed)
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// allDuplicates claims every key once warm: each must be a Duplicate.
func allDuplicates(t *testing.T, e *engine.Engine, keys [][]byte) {
	t.Helper()
	waitWarm(t, e)
	claims := make([]engine.Claim, len(keys))
	if err := e.ClaimBatch(context.Background(), keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.Outcome != engine.Duplicate {
			t.Fatalf("acknowledged key %s is %v after the crash", keys[i], c.Outcome)
		}
	}
}

func sealedFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	return filterFiles(t, fs, ".sealed", "")
}

// filterFiles lists the files of the sealed directory ending in suffix,
// each prefixed with prefix.
func filterFiles(t *testing.T, fs vfs.FS, suffix, prefix string) []string {
	t.Helper()
	names, err := fs.List("db/tierdedup-sealed")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "tierdedup-bloom.p") && strings.HasSuffix(n, suffix) {
			out = append(out, prefix+n)
		}
	}
	return out
}

// TestCrashRebuildsOnlyTheOpenPartition: four hours of keys, the closed
// partitions sealed as the clock left them, then a crash. The next Open
// loads the three sealed filters and rebuilds from Pebble the open
// partition alone; every key is a Duplicate once warm, and a new key New.
func TestCrashRebuildsOnlyTheOpenPartition(t *testing.T) {
	enginetest.SetNoRestore(true) // the scan path: see TestCheckpointRestore for the restore
	defer enginetest.SetNoRestore(false)
	mem := newCrashFS()
	clock := newClock()
	const perHour = 50
	e, o, keys := sealedEngine(t, mem, clock, 4, perHour)
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()

	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	if s := e.Stats(); s.Bloom.SealedLoaded != closed || s.Bloom.Mode != "rebuilding" {
		t.Fatalf("after the crash: %d sealed filters loaded, mode %s; want %d, rebuilding", s.Bloom.SealedLoaded, s.Bloom.Mode, closed)
	}
	// Before the rebuild has read anything: the open partition's keys are
	// in no filter yet, and must still be found, as must the sealed ones.
	ctx := context.Background()
	for _, k := range [][]byte{keys[0], keys[len(keys)-1]} {
		if c, err := e.Claim(ctx, k); err != nil || c.Outcome != engine.Duplicate {
			t.Fatalf("while rebuilding, acknowledged key %s is %v (%v)", k, c.Outcome, err)
		}
	}
	if c, err := e.Claim(ctx, []byte("never-seen")); err != nil || c.Outcome != engine.New {
		t.Fatalf("while rebuilding, a new key is %v (%v)", c.Outcome, err)
	} else if err := e.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	close(gate)
	allDuplicates(t, e, keys)
	if got := e.Stats().Bloom.RebuiltKeys; got != perHour {
		t.Fatalf("rebuilt %d keys from Pebble, want %d (the open partition's)", got, perHour)
	}
	if o, err := e.MarkIfAbsent(context.Background(), []byte("brand-new")); err != nil || o != engine.New {
		t.Fatalf("a new key: %v, %v", o, err)
	}
}

// TestSealWaitsForWritesInFlight holds a commit after it read the engine's
// time (in hour 0) and before it wrote, moves the clock into hour 1 and
// rotates: the sealer must not save hour 0's filter until that commit has
// written, or the saved filter would lack its key and a crash would answer
// it New.
func TestSealWaitsForWritesInFlight(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	late := []byte("late")
	c, err := e.Claim(ctx, late)
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	held, free := holdDurable(t)
	defer free()
	committed := make(chan error, 1)
	go func() { committed <- e.Commit(ctx, c) }()
	<-held

	clock.Add(time.Hour)
	if _, err := e.Claim(ctx, []byte("rotates")); err != nil { // rotates to hour 1
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if sealed(e, clock.Now().Add(-time.Hour)) {
		t.Fatal("hour 0 was sealed while a write that read its time was in flight")
	}
	free()
	if err := <-committed; err != nil {
		t.Fatalf("the held commit: %v", err)
	}
	waitSealed(t, e, clock.Now().Add(-time.Hour))
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()

	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	if n := e.Stats().Bloom.SealedLoaded; n != 1 {
		t.Fatalf("%d sealed filters loaded, want 1 (hour 0)", n)
	}
	allDuplicates(t, e, [][]byte{late})
}

// TestSealedFilesThatMustNotBeTrusted damages, replaces or orphans sealed
// files between a crash and the next Open: a file is loaded only if the
// store's seal names it (ID, checksum, size), it was written for this
// store and these filter parameters; any other is removed and its
// partition rebuilt, and no acknowledged key is lost.
func TestSealedFilesThatMustNotBeTrusted(t *testing.T) {
	enginetest.SetNoRestore(true) // the scan path: see TestCheckpointRestore for the restore
	defer enginetest.SetNoRestore(false)
	const perHour = 40
	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T, fs vfs.FS, other vfs.FS)
		opts   func(*engine.Options)
		loaded uint64
		// rebuilt is the hours of keys rebuilt from Pebble.
		rebuilt int
	}{
		{name: "untouched", loaded: closed, rebuilt: 1},
		{name: "removed", loaded: closed - 1, rebuilt: 2, tamper: func(t *testing.T, fs, _ vfs.FS) {
			if err := fs.Remove(hourFile(0)); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "flipped byte", loaded: closed - 1, rebuilt: 2, tamper: func(t *testing.T, fs, _ vfs.FS) {
			rewrite(t, fs, hourFile(1), func(b []byte) { b[len(b)/2] ^= 1 })
		}},
		{name: "truncated", loaded: closed - 1, rebuilt: 2, tamper: func(t *testing.T, fs, _ vfs.FS) {
			b := read(t, fs, hourFile(2))
			write(t, fs, hourFile(2), b[:len(b)-8])
		}},
		{name: "another store's file", loaded: 0, rebuilt: 4, tamper: func(t *testing.T, fs, other vfs.FS) {
			for h := 0; h < 3; h++ { // the closed partitions
				write(t, fs, hourFile(h), read(t, other, hourFile(h)))
			}
		}},
		{name: "other filter parameters", loaded: 0, rebuilt: 4, opts: func(o *engine.Options) { o.ExpectedKeys = 2000 }},
		{name: "orphan", loaded: closed, rebuilt: 1, tamper: func(t *testing.T, fs, _ vfs.FS) {
			// One of a partition long dropped, one of the open partition.
			write(t, fs, "db/tierdedup-sealed/tierdedup-bloom.p12.sealed", []byte("no seal names me"))
			write(t, fs, hourFile(1)+".tmp", []byte("a save a crash interrupted"))
			write(t, fs, hourFile(3), read(t, fs, hourFile(2)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := newCrashFS()
			e, o, keys := sealedEngine(t, mem, newClock(), 4, perHour)
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			// The same history in another store: its files have the
			// same names and partitions, another store ID and seal IDs.
			otherMem := newCrashFS()
			other, _, _ := sealedEngine(t, otherMem, newClock(), 4, perHour)
			_ = other.Close()
			if tc.tamper != nil {
				tc.tamper(t, crashed, otherMem)
			}
			setFS(&o, crashed)
			if tc.opts != nil {
				tc.opts(&o)
			}
			e = open(t, o)
			defer e.Close()
			allDuplicates(t, e, keys)
			s := e.Stats()
			if s.Bloom.SealedLoaded != tc.loaded {
				t.Fatalf("%d sealed filters loaded, want %d", s.Bloom.SealedLoaded, tc.loaded)
			}
			if want := uint64(perHour * tc.rebuilt); s.Bloom.RebuiltKeys != want {
				t.Fatalf("rebuilt %d keys, want %d", s.Bloom.RebuiltKeys, want)
			}
			// Every partition rebuilt is sealed again once warm, and no
			// file nothing vouches for is left.
			start := newClock().Now() // the closed hours 0..2, rebuilt ones sealed again
			waitSealed(t, e, start, start.Add(time.Hour), start.Add(2*time.Hour))
			if files := sealedFiles(t, crashed); len(files) != closed || slices.ContainsFunc(files, func(f string) bool { return !strings.HasSuffix(f, ".sealed") }) {
				t.Fatalf("sealed files after the reseal: %v", files)
			}
		})
	}
}

// read returns the file name, which must exist.
func read(t *testing.T, fs vfs.FS, name string) []byte {
	t.Helper()
	b := readFile(t, fs, name)
	if b == nil {
		t.Fatalf("%s does not exist", name)
	}
	return b
}

// write replaces the file name with b, durably, as a damage on disk would
// be: a crash keeps it.
func write(t *testing.T, fs vfs.FS, name string, b []byte) {
	t.Helper()
	writeFile(t, fs, name, b)
	d, err := fs.OpenDir(fs.PathDir(name))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
}

func rewrite(t *testing.T, fs vfs.FS, name string, change func([]byte)) {
	t.Helper()
	b := read(t, fs, name)
	change(b)
	write(t, fs, name, b)
}

// TestRemovedSealedFileStaysRemoved: the file of a partition that left the
// window is removed durably, so a crash does not bring it back.
func TestRemovedSealedFileStaysRemoved(t *testing.T) {
	mem := newCrashFS()
	clock := newClock()
	e, _, _ := sealedEngine(t, mem, clock, 5, 10) // hours 0..3 sealed
	defer e.Close()
	gone := strings.TrimPrefix(hourFile(0), "db/tierdedup-sealed/")
	if files := sealedFiles(t, mem); !slices.Contains(files, gone) {
		t.Fatalf("hour 0 not sealed: %v", files)
	}
	clock.Add(time.Hour) // hour 5: hour 0 leaves the window
	if _, err := e.MarkIfAbsent(context.Background(), []byte("rotates")); err != nil {
		t.Fatal(err)
	}
	waitSealed(t, e, clock.Now().Add(-time.Hour))
	if files := sealedFiles(t, mem); slices.Contains(files, gone) || len(files) != 4 {
		t.Fatalf("want hours 1..4 sealed and %s gone: %v", gone, files)
	}
	if files := sealedFiles(t, mem.CrashClone(vfs.CrashCloneCfg{})); slices.Contains(files, gone) {
		t.Fatalf("after a crash, %s is back: %v", gone, files)
	}
}

// TestSealWaitsForReleasesInFlight is TestSealWaitsForWritesInFlight for a
// release that writes its key's attempt count (MaxAttempts): held after it
// read the time in hour 0, across the rotation to hour 1.
func TestSealWaitsForReleasesInFlight(t *testing.T) {
	ctx := context.Background()
	mem := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000, MaxAttempts: 3}
	e := open(t, o)
	defer e.Close()
	c, err := e.Claim(ctx, []byte("failing"))
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	held, free := holdDurable(t)
	defer free() // before Close, which waits for the held call
	released := make(chan error, 1)
	go func() { released <- e.Release(ctx, c) }()
	<-held
	clock.Add(time.Hour)
	if _, err := e.Claim(ctx, []byte("rotates")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if sealed(e, clock.Now().Add(-time.Hour)) {
		t.Fatal("hour 0 was sealed while a release that read its time was writing")
	}
	free()
	if err := <-released; err != nil {
		t.Fatalf("the held release: %v", err)
	}
	waitSealed(t, e, clock.Now().Add(-time.Hour))
}

// TestDamagedSealedFileIsRewritten: a sealed file damaged while the engine
// was closed is not kept by a warm Open; the sealer writes it again, so the
// next crash still rebuilds only the open partition.
func TestDamagedSealedFileIsRewritten(t *testing.T) {
	mem := newCrashFS()
	clock := newClock()
	e, o, keys := sealedEngine(t, mem, clock, 4, 40)
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	rewrite(t, mem, hourFile(1), func(b []byte) { b[len(b)/2] ^= 1 })
	e = open(t, o) // warm from the clean snapshot
	if e.Stats().Bloom.Mode != "warm" {
		t.Fatal("not warm after a clean Close")
	}
	waitSealed(t, e, clock.Now().Add(-2*time.Hour)) // hour 1 written again
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	allDuplicates(t, e, keys)
	if s := e.Stats(); s.Bloom.SealedLoaded != closed {
		t.Fatalf("after the crash: %d sealed filters loaded, want %d (rebuilt %d keys)", s.Bloom.SealedLoaded, closed, s.Bloom.RebuiltKeys)
	}
}
