package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
)

// checkpointFiles lists the checkpoint files in the sealed directory.
func checkpointFiles(t *testing.T, fs vfs.FS) []string {
	t.Helper()
	names, err := fs.List("db/tierdedup-sealed")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range names {
		if strings.HasSuffix(n, ".ckpt") {
			out = append(out, "db/tierdedup-sealed/"+n)
		}
	}
	return out
}

// checkpointedEngine commits keys over two hours with a checkpoint every
// 100 keys, hour 0 sealed, and 30 keys after the last checkpoint it waited
// for. It returns the options, every key, and the content of the first
// checkpoint's file (an earlier state of the open partition's filter).
func checkpointedEngine(t *testing.T, mem vfs.FS) (*engine.Engine, engine.Options, [][]byte, []byte) {
	t.Helper()
	clock := newClock()
	o := engine.Options{Dir: "db", FS: mem, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000}
	e := open(t, o)
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
	waitCheckpoints := func(n uint64) {
		deadline := time.Now().Add(10 * time.Second)
		for e.Stats().BloomCheckpoints < n {
			if time.Now().After(deadline) {
				t.Fatalf("%d checkpoints, want %d", e.Stats().BloomCheckpoints, n)
			}
			time.Sleep(time.Millisecond)
		}
	}
	mark(150)
	waitCheckpoints(1)
	files := checkpointFiles(t, mem)
	if len(files) != 1 {
		t.Fatalf("after the first checkpoint: files %v", files)
	}
	first := readFile(t, mem, files[0])
	mark(450)
	clock.Add(time.Hour)
	before := e.Stats().BloomCheckpoints
	mark(300)
	waitSealed(t, e, clock.Now().Add(-time.Hour))
	waitCheckpoints(before + 1)
	time.Sleep(50 * time.Millisecond) // no checkpoint in flight
	mark(30)
	return e, o, keys, first
}

// TestCheckpointRestore: after a crash, the open partition's filter is
// restored from the last checkpoint and the journal after it (warm at
// Open, nothing scanned, only the keys after the checkpoint read back);
// a checkpoint file removed, damaged, of another store or of an earlier
// checkpoint is not trusted, and the partition is rebuilt by a scan.
// Every acknowledged key is a Duplicate either way.
func TestCheckpointRestore(t *testing.T) {
	engine.SetCheckpointKeys(100)
	defer engine.SetCheckpointKeys(0)
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
			mem := vfs.NewCrashableMem()
			e, o, keys, first := checkpointedEngine(t, mem)
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			otherMem := vfs.NewCrashableMem()
			other, _, _, _ := checkpointedEngine(t, otherMem)
			otherCrashed := otherMem.CrashClone(vfs.CrashCloneCfg{})
			_ = other.Close()
			if tc.tamper != nil {
				tc.tamper(t, crashed, otherCrashed, first)
			}
			o.FS = crashed
			e = open(t, o)
			defer e.Close()
			s := e.Stats()
			if tc.restored {
				if s.BloomMode != "warm" || s.BloomRestored != 1 || s.BloomRebuiltKeys != 0 || s.BloomSealedLoaded != 1 {
					t.Fatalf("after the crash: mode %s, %d restored, %d rebuilt, %d sealed loaded; want warm, 1, 0, 1",
						s.BloomMode, s.BloomRestored, s.BloomRebuiltKeys, s.BloomSealedLoaded)
				}
				if s.BloomJournalKeys == 0 || s.BloomJournalKeys >= 200 {
					t.Fatalf("%d keys read from the journal, want the few after the last checkpoint", s.BloomJournalKeys)
				}
			}
			allDuplicates(t, e, keys)
			if s := e.Stats(); !tc.restored && (s.BloomRestored != 0 || s.BloomRebuiltKeys != 330) {
				t.Fatalf("%d restored, %d rebuilt by a scan; want 0 and the open hour's 330", s.BloomRestored, s.BloomRebuiltKeys)
			}
			if o, err := e.MarkIfAbsent(context.Background(), []byte("brand-new")); err != nil || o != engine.New {
				t.Fatalf("a new key: %v, %v", o, err)
			}
		})
	}
}
