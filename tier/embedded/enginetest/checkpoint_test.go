package enginetest_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// checkpointFiles lists the checkpoint files in the sealed directory.
func checkpointFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	return filterFiles(t, fs, ".ckpt", "db/tierdedup-sealed/")
}

// checkpointGate decides when the checkpointer's checkpoints start: each
// waits in enginetest.SetBeforeCheckpoint for a permit, until the gate is
// released for good (before the store closes: Close waits for the
// checkpointer).
type checkpointGate struct {
	permit chan struct{}
	open   chan struct{}
	once   sync.Once
}

// currentGate is the gate the hook holds, so a late release of an earlier
// gate does not remove a later one's.
var currentGate atomic.Pointer[checkpointGate]

// newCheckpointGate installs a shut gate; the test's cleanup releases it.
func newCheckpointGate(t *testing.T) *checkpointGate {
	g := &checkpointGate{permit: make(chan struct{}), open: make(chan struct{})}
	currentGate.Store(g)
	enginetest.SetBeforeCheckpoint(func() {
		select {
		case <-g.permit:
		case <-g.open:
		}
	})
	t.Cleanup(g.release)
	return g
}

// allow lets one checkpoint start, waiting for the checkpointer to take
// the permit, and then waits for the count of checkpoints to reach want.
func (g *checkpointGate) allow(t *testing.T, e *engine.Engine, want uint64) {
	t.Helper()
	select {
	case g.permit <- struct{}{}:
	case <-time.After(10 * time.Second):
		t.Fatal("no checkpoint waiting to start")
	}
	waitFor(t, fmt.Sprintf("checkpoint %d", want), func() bool { return e.Stats().Bloom.Checkpoints >= want })
}

// release lets every checkpoint start from now on, and removes the hook
// if it is still this gate's.
func (g *checkpointGate) release() {
	g.once.Do(func() {
		close(g.open)
		if currentGate.CompareAndSwap(g, nil) {
			enginetest.SetBeforeCheckpoint(nil)
		}
	})
}

// checkpointedEngine commits keys over two hours with a checkpoint every
// 100 keys, hour 0 sealed, and checkpoints started only where it lets
// them: the last one after the 300 keys of hour 1 were acknowledged and
// hour 0 sealed, and 30 keys acknowledged after it. It returns the
// options, every key, the content of the first checkpoint's file (an
// earlier state of the open partition's filter), and the function that
// closes the engine.
func checkpointedEngine(t *testing.T, mem vfs.FS) (*engine.Engine, engine.Options, [][]byte, []byte, func() error) {
	t.Helper()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: mem}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
	gate := newCheckpointGate(t) // its cleanup runs before the engine's
	var keys [][]byte
	mark := func(n int) {
		batch := make([][]byte, n)
		for i := range batch {
			batch[i] = fmt.Appendf(nil, "key-%d", len(keys)+i)
		}
		if err := e.MarkBatch(context.Background(), batch, nil, make([]engine.Outcome, n)); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, batch...)
	}
	mark(150)
	gate.allow(t, e, 1) // the 150 keys woke it
	files := checkpointFiles(t, mem)
	if len(files) != 1 {
		t.Fatalf("after the first checkpoint: files %v", files)
	}
	first := readFile(t, mem, files[0])
	mark(450)
	clock.Add(time.Hour)
	mark(300)
	waitSealed(t, e, clock.Now().Add(-time.Hour))
	// The 450 keys woke the checkpointer; it starts now, after every key
	// of hour 1 was acknowledged, and covers them all.
	gate.allow(t, e, 2)
	mark(30) // under 100: wakes none; nor would the gate let one start
	if n := e.Stats().Bloom.Checkpoints; n != 2 {
		t.Fatalf("%d checkpoints, want 2", n)
	}
	return e, o, keys, first, func() error {
		gate.release()
		return e.Close()
	}
}

// TestCheckpointRestore: after a crash, the open partition's filter is
// restored from the last checkpoint and the journal after it (warm at
// Open, nothing scanned, only the keys after the checkpoint read back);
// a checkpoint file removed, damaged, of another store or of an earlier
// checkpoint is not trusted, and the partition is rebuilt by a scan.
// Every acknowledged key is a Duplicate either way.
func TestCheckpointRestore(t *testing.T) {
	enginetest.SetCheckpointKeys(100)
	defer enginetest.SetCheckpointKeys(0)
	each := func(f func(t *testing.T, fs vfs.FS, name string)) func(t *testing.T, fs, other vfs.FS, first []byte) {
		return func(t *testing.T, fs, _ vfs.FS, _ []byte) {
			files := checkpointFiles(t, fs)
			if len(files) == 0 {
				t.Fatal("no checkpoint file to tamper with")
			}
			for _, n := range files {
				f(t, fs, n)
			}
		}
	}
	for _, tc := range []struct {
		name     string
		tamper   func(t *testing.T, fs, other vfs.FS, first []byte)
		restored bool
	}{
		{name: "untouched", restored: true},
		{name: "removed", tamper: each(func(t *testing.T, fs vfs.FS, n string) {
			if err := fs.Remove(n); err != nil {
				t.Fatal(err)
			}
		})},
		{name: "flipped byte", tamper: each(func(t *testing.T, fs vfs.FS, n string) {
			rewrite(t, fs, n, func(b []byte) { b[len(b)/2] ^= 1 })
		})},
		{name: "truncated", tamper: each(func(t *testing.T, fs vfs.FS, n string) {
			b := read(t, fs, n)
			write(t, fs, n, b[:len(b)-8])
		})},
		{name: "another store's file", tamper: func(t *testing.T, fs, other vfs.FS, _ []byte) {
			theirs := checkpointFiles(t, other)
			for _, n := range checkpointFiles(t, fs) {
				write(t, fs, n, read(t, other, theirs[0]))
			}
		}},
		{name: "an earlier checkpoint", tamper: func(t *testing.T, fs, _ vfs.FS, first []byte) {
			for _, n := range checkpointFiles(t, fs) {
				write(t, fs, n, first)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := newCrashFS()
			_, o, keys, first, closeEngine := checkpointedEngine(t, mem)
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			_ = closeEngine()
			otherMem := newCrashFS()
			_, _, _, _, closeOther := checkpointedEngine(t, otherMem)
			otherCrashed := otherMem.CrashClone(vfs.CrashCloneCfg{})
			_ = closeOther()
			if tc.tamper != nil {
				tc.tamper(t, crashed, otherCrashed, first)
			}
			setFS(&o, crashed)
			e := open(t, o)
			defer e.Close()
			s := e.Stats()
			if tc.restored {
				if s.Bloom.Mode != "warm" || s.Bloom.Restored != 1 || s.Bloom.RebuiltKeys != 0 || s.Bloom.SealedLoaded != 1 {
					t.Fatalf("after the crash: mode %s, %d restored, %d rebuilt, %d sealed loaded; want warm, 1, 0, 1",
						s.Bloom.Mode, s.Bloom.Restored, s.Bloom.RebuiltKeys, s.Bloom.SealedLoaded)
				}
				if s.Bloom.JournalKeys != 30 {
					t.Fatalf("%d keys read from the journal, want the 30 after the last checkpoint", s.Bloom.JournalKeys)
				}
			}
			allDuplicates(t, e, keys)
			if s := e.Stats(); !tc.restored && (s.Bloom.Restored != 0 || s.Bloom.RebuiltKeys != 330) {
				t.Fatalf("%d restored, %d rebuilt by a scan; want 0 and the open hour's 330", s.Bloom.Restored, s.Bloom.RebuiltKeys)
			}
			if o, err := e.MarkIfAbsent(context.Background(), []byte("brand-new")); err != nil || o != engine.New {
				t.Fatalf("a new key: %v, %v", o, err)
			}
		})
	}
}

// stepClock is a child's clock: base plus a minute per Step.
type stepClock = enginetest.StepClock

// stallChild (spec "dir|hook|start ns") marks batches of fresh keys, a
// simulated minute apart, with a checkpoint every 500 keys and hour
// partitions, printing "A key" for every key acknowledged New and "T ns"
// after each batch. When the hook ("ckpt" or "move") is reached it prints
// "STALL" and blocks that background work for good: the parent kills the
// process there.
func stallChild(spec string) int {
	parts := strings.Split(spec, "|")
	dir, hook := parts[0], parts[1]
	start, _ := strconv.ParseInt(parts[2], 10, 64)
	enginetest.SetCheckpointKeys(500)
	var stalled atomic.Bool
	stall := func() {
		stalled.Store(true)
		fmt.Println("STALL")
		select {}
	}
	switch hook {
	case "ckpt":
		enginetest.SetInCheckpoint(stall)
	case "move":
		enginetest.SetInMove(stall)
	}
	clock := &stepClock{Base: time.Unix(0, start)}
	e, err := engine.Open(&engine.Options{Backend: embedded.Dir(dir), Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 20_000, Logger: quiet})
	if err != nil {
		fmt.Println("ERR", err)
		return 1
	}
	out := bufio.NewWriter(os.Stdout)
	crossed := 0 // hour boundaries the clock stepped over
	for i := 0; ; i++ {
		keys := make([][]byte, 64)
		for j := range keys {
			keys[j] = fmt.Appendf(nil, "%d-%d", start, i*64+j)
		}
		res := make([]engine.Outcome, len(keys))
		if err := e.MarkBatch(context.Background(), keys, nil, res); err != nil {
			fmt.Println("ERR", err)
			return 1
		}
		for j, r := range res {
			if r == engine.New {
				fmt.Fprintf(out, "A %s\n", keys[j])
			}
		}
		fmt.Fprintf(out, "T %d\n", clock.Now().UnixNano())
		out.Flush()
		if stalled.Load() {
			// Once stalled the clock stays, so no rotation follows: its
			// drop would wait behind the stalled move, and the writes
			// that must go on past the stall with it.
			continue
		}
		now := clock.Now()
		if hook == "move" && crossed > 0 && !now.Add(time.Minute).Truncate(time.Hour).Equal(now.Truncate(time.Hour)) {
			// The move of the partition the last rotation closed has not
			// reached its stall yet (a move under -race on busy cores can
			// take longer than the hour of batches): a second rotation
			// would wait behind it once it stalls, and the writes with
			// it. Write on in this minute until it stalls.
			time.Sleep(time.Millisecond)
			continue
		}
		if !now.Add(time.Minute).Truncate(time.Hour).Equal(now.Truncate(time.Hour)) {
			crossed++
		}
		clock.Steps.Add(1)
	}
}

// TestKillDuringCheckpointAndMove kills a child while a checkpoint of the
// open partition's filter has written its files but not recorded them,
// and while a sealed partition's move into the cold database has ingested
// it but not yet removed it from the hot one, three times each over one
// directory. After each kill every key acknowledged in the window is a
// Duplicate, a key never sent is New, and the reopen after a stalled
// checkpoint restores the open partition from the checkpoint before it.
func TestKillDuringCheckpointAndMove(t *testing.T) {
	dir := t.TempDir()
	now := newClock().Now().UnixNano()
	acked := map[string]int64{} // key → when it was acknowledged
	for round, hook := range []string{"ckpt", "move", "ckpt", "move", "ckpt", "move"} {
		// Three minutes: under -race on two busy cores a move has been
		// seen to take over one to come.
		child := crashtest.Start(t, "stall", fmt.Sprintf("%s|%s|%d", dir, hook, now), &crashtest.Options{Timeout: 3 * time.Minute})
		stalled := false
		for batches := 0; ; {
			line, ok := child.Next()
			if !ok {
				t.Fatalf("round %d (%s): the child ended before stalling", round, hook)
			}
			kind, rest, _ := strings.Cut(line, " ")
			switch kind {
			case "A":
				acked[rest] = now
			case "T":
				now, _ = strconv.ParseInt(rest, 10, 64)
				if stalled {
					batches++
				}
			case "STALL":
				stalled = true
			case "ERR":
				t.Fatalf("round %d: child: %s", round, rest)
			}
			if stalled && batches == 5 { // writes went on past the stall
				break
			}
		}
		_ = child.Kill() // "signal: killed"
		now += int64(time.Minute)
		e := open(t, engine.Options{Backend: embedded.Dir(dir), Clock: fixedClock(now), Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 20_000})
		s := e.Stats()
		if hook == "ckpt" && (s.Bloom.Restored == 0 || s.Bloom.Mode != "warm" || s.Bloom.RebuiltKeys != 0) {
			t.Fatalf("round %d: after a kill inside a checkpoint: %d restored, mode %s, %d rebuilt; want the one before it restored, warm",
				round, s.Bloom.Restored, s.Bloom.Mode, s.Bloom.RebuiltKeys)
		}
		var keys [][]byte
		for k, at := range acked {
			if now-at < int64(3*time.Hour) {
				keys = append(keys, []byte(k))
			}
		}
		allDuplicates(t, e, keys)
		if o, err := e.MarkIfAbsent(context.Background(), fmt.Appendf(nil, "never-%d", round)); err != nil || o != engine.New {
			t.Fatalf("round %d: a new key: %v, %v", round, o, err)
		}
		if hook == "move" && e.Stats().Store.ColdPartitions == 0 {
			// The interrupted move is completed by the reopened store.
			waitFor(t, "the interrupted move to complete", func() bool { return e.Stats().Store.ColdPartitions > 0 })
		}
		_ = e.Close()
		t.Logf("round %d (%s): %d keys checked, %d restored, %d journal keys", round, hook, len(keys), s.Bloom.Restored, s.Bloom.JournalKeys)
	}
}

// fixedClock is a clock that stays at t (Unix ns).
type fixedClock = enginetest.FixedClock

// TestImportRestoresFromCheckpoint: an export taken after a checkpoint
// carries the checkpoint's files beside the sealed ones, so the imported
// store restores its open partition from them and the journal after the
// checkpoint, with nothing scanned; every key is a Duplicate.
func TestImportRestoresFromCheckpoint(t *testing.T) {
	enginetest.SetCheckpointKeys(100)
	defer enginetest.SetCheckpointKeys(0)
	mem := newCrashFS()
	e, o, keys, _, closeEngine := checkpointedEngine(t, mem)
	ctx := context.Background()
	if _, err := e.Export(ctx, "exp", 1); err != nil {
		t.Fatal(err)
	}
	if err := closeEngine(); err != nil {
		t.Fatal(err)
	}
	setDir(&o, "other")
	if _, err := importExport(ctx, "exp", &o, 0); err != nil {
		t.Fatal(err)
	}
	e2 := open(t, o)
	defer e2.Close()
	if s := e2.Stats(); s.Bloom.Mode != "warm" || s.Bloom.Restored != 1 || s.Bloom.RebuiltKeys != 0 || s.Bloom.SealedLoaded != 1 {
		t.Fatalf("after import: mode %s, %d restored, %d keys rebuilt by a scan, %d sealed loaded; want warm, 1, 0, 1",
			s.Bloom.Mode, s.Bloom.Restored, s.Bloom.RebuiltKeys, s.Bloom.SealedLoaded)
	}
	allDuplicates(t, e2, keys)
}
