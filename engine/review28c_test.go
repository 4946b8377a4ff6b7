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

// r28cShort is the window of the namespace "short" in r28cBuild.
const r28cShort = 150 * time.Minute

// r28cHist is a history built by r28cBuild, crashed.
type r28cHist struct {
	o      engine.Options
	crash  crashFS         // the machine crash's file system
	def    [][]byte        // default-namespace keys, all live and not forgotten
	short  [][][]byte      // "short" keys by hour
	forgot map[string]bool // "ns/key", forgotten after their move
	early  string          // an earlier checkpoint's file (name)
	earlyB []byte          // and its content
}

func r28cStart() time.Time { return newClock().Now() }

// r28cSealed is the sealed file of hour h.
func r28cSealed(h int) string { return hourFile(h) }

// r28cBuild: hour partitions over a 4-hour window (5 live) and a namespace
// "short" of 150 minutes; 40 default and 10 short keys marked in each of
// hours 0..4, hours 0..3 sealed and moved into the cold database; a key of
// hour 1 (cold), a short key of hour 3 (cold) and a key of hour 4 (hot)
// forgotten; checkpoints every 25 keys, the last one after the seals, then
// 7 keys only in the journal; then a machine crash (CrashClone).
func r28cBuild(t *testing.T) *r28cHist {
	t.Helper()
	ctx := context.Background()
	fs := newCrashFS()
	clock := newClock()
	o := engine.Options{Dir: "db", FS: fs, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000,
		NamespaceWindows: map[string]time.Duration{"short": r28cShort}}
	e := open(t, o)
	defer func() { _ = e.Close() }()
	short, err := e.Namespace("short")
	if err != nil {
		t.Fatal(err)
	}
	h := &r28cHist{o: o, forgot: map[string]bool{}}
	mark := func(ns *engine.Namespace, keys [][]byte) {
		t.Helper()
		out := make([]engine.Outcome, len(keys))
		if err := ns.MarkBatch(ctx, keys, nil, out); err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			if r != engine.New {
				t.Fatalf("fresh key %s is %v", keys[i], r)
			}
		}
	}
	def, _ := e.Namespace("")
	gen := func(format string, n int, args ...any) [][]byte {
		out := make([][]byte, n)
		for i := range out {
			out[i] = fmt.Appendf(nil, format+"-%d", append(args, i)...)
		}
		return out
	}
	for hr := range 5 {
		d := gen("c-h%d", 40, hr)
		s := gen("s-h%d", 10, hr)
		mark(def, d)
		mark(short, s)
		h.def = append(h.def, d...)
		h.short = append(h.short, s)
		if hr < 4 {
			clock.Add(time.Hour)
		}
	}
	start := r28cStart()
	waitSealed(t, e, start, start.Add(time.Hour), start.Add(2*time.Hour), start.Add(3*time.Hour))
	waitFor(t, "hours 0..3 moved", func() bool { return e.Stats().ColdPartitions >= 4 })
	clock.Add(10 * time.Minute)
	time.Sleep(50 * time.Millisecond) // the checkpoint hour 4's marks woke
	if files := checkpointFiles(t, fs); len(files) > 0 {
		h.early = files[0]
		h.earlyB = read(t, fs, files[0])
	}
	// Forget keys in moved partitions and in the open one.
	for _, f := range []struct {
		ns  *engine.Namespace
		nsn string
		key string
	}{{def, "", "c-h1-3"}, {short, "short", "s-h3-4"}, {def, "", "c-h4-5"}} {
		info, err := f.ns.Forget(ctx, []byte(f.key))
		if err != nil || info.Outcome != engine.Duplicate {
			t.Fatalf("Forget %s/%s: %v %v", f.nsn, f.key, info.Outcome, err)
		}
		h.forgot[f.nsn+"/"+f.key] = true
	}
	var kept [][]byte
	for _, k := range h.def {
		if !h.forgot["/"+string(k)] {
			kept = append(kept, k)
		}
	}
	h.def = kept
	before := e.Stats().BloomCheckpoints
	pad := gen("c-pad", 30)
	mark(def, pad)
	h.def = append(h.def, pad...)
	waitFor(t, "a checkpoint after the seals", func() bool { return e.Stats().BloomCheckpoints > before })
	time.Sleep(50 * time.Millisecond) // no checkpoint in flight
	tail := gen("c-tail", 7)
	mark(def, tail)
	h.def = append(h.def, tail...)
	h.crash = fs.CrashClone(vfs.CrashCloneCfg{})
	if h.early != "" && len(checkpointFiles(t, h.crash)) == 1 && checkpointFiles(t, h.crash)[0] == h.early {
		h.early = "" // no earlier generation: the same file
	}
	return h
}

// check verifies every answer of e against the history: every live
// default key Duplicate (claimed), short keys Duplicate inside their
// window and New after it, forgotten keys New, fresh keys New.
func (h *r28cHist) check(t *testing.T, e *engine.Engine, what string) {
	t.Helper()
	ctx := context.Background()
	waitWarm(t, e)
	claims := make([]engine.Claim, len(h.def))
	if err := e.ClaimBatch(ctx, h.def, nil, claims); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, c := range claims {
		if c.Outcome != engine.Duplicate {
			if bad++; bad <= 5 {
				t.Errorf("%s: acknowledged %s is %v", what, h.def[i], c.Outcome)
			}
		}
	}
	short, _ := e.Namespace("short")
	for hr, keys := range h.short {
		out := make([]engine.KeyInfo, len(keys))
		if err := short.LookupBatch(ctx, keys, out); err != nil {
			t.Fatal(err)
		}
		want := engine.Duplicate
		if hr < 2 { // committed at hour hr:00, now 4:10: 250 and 190 minutes ago
			want = engine.New
		}
		for i, info := range out {
			w := want
			if h.forgot["short/"+string(keys[i])] {
				w = engine.New
			}
			if info.Outcome != w {
				if bad++; bad <= 5 {
					t.Errorf("%s: short/%s (hour %d) is %v, want %v", what, keys[i], hr, info.Outcome, w)
				}
			}
		}
	}
	for id := range h.forgot {
		nsn, key, _ := strings.Cut(id, "/")
		ns, _ := e.Namespace(nsn)
		info, err := ns.Lookup(ctx, []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		if info.Outcome != engine.New {
			bad++
			t.Errorf("%s: forgotten %s is %v, want New", what, id, info.Outcome)
		}
	}
	fresh := make([][]byte, 50)
	for i := range fresh {
		fresh[i] = fmt.Appendf(nil, "fresh-%s-%d", what, i)
	}
	out := make([]engine.Outcome, len(fresh))
	if err := e.MarkBatch(ctx, fresh, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.New {
			bad++
			t.Errorf("%s: fresh key %s is %v", what, fresh[i], o)
		}
	}
	if bad > 0 {
		t.Fatalf("%s: %d wrong answers", what, bad)
	}
	h.def = append(h.def, fresh...)
}

// TestReview28cMixedDamageAfterMoves: after a crash with four sealed
// partitions moved into the cold database and the open one checkpointed,
// some sealed files and checkpoint files are damaged, swapped, replaced
// by another store's or by an earlier generation's, and others are left
// alone. The files are merged together at Open (one MergeSnapshots for the
// sealed files, one for the checkpoint's): every refused file must cost
// its own partition a scan and no more, every good one must load, and
// every answer must be what was acknowledged: live keys Duplicate, keys
// forgotten in moved partitions New, the short namespace's keys New after
// its window, fresh keys New. A second crash after the rebuilt partitions
// are sealed again must load every sealed file.
func TestReview28cMixedDamageAfterMoves(t *testing.T) {
	engine.SetCheckpointKeys(25)
	defer engine.SetCheckpointKeys(0)
	const perHour = 50 // 40 default + 10 short keys a closed hour
	// The open hour holds its 50 keys, 30 pad and 7 tail keys, and a
	// forgotten one (Forget deletes it from the store).
	const openHour = 50 + 30 + 7 - 1
	var other *r28cHist // another store, the same history
	for _, tc := range []struct {
		name     string
		tamper   func(t *testing.T, h *r28cHist)
		loaded   uint64
		restored bool   // the open hour restored from the checkpoint
		rebuilt  uint64 // keys scanned
	}{
		{name: "untouched", loaded: 4, restored: true, rebuilt: 0},
		{name: "flipped one, swapped two, kept one", loaded: 1, restored: true, rebuilt: 3*perHour - 1, tamper: func(t *testing.T, h *r28cHist) {
			rewrite(t, h.crash, r28cSealed(0), func(b []byte) { b[len(b)/2] ^= 0x10 })
			b2, b3 := read(t, h.crash, r28cSealed(2)), read(t, h.crash, r28cSealed(3))
			write(t, h.crash, r28cSealed(2), b3)
			write(t, h.crash, r28cSealed(3), b2)
		}},
		{name: "truncated sealed, flipped checkpoint", loaded: 3, restored: false, rebuilt: perHour - 1 + openHour, tamper: func(t *testing.T, h *r28cHist) {
			b := read(t, h.crash, r28cSealed(1))
			write(t, h.crash, r28cSealed(1), b[:len(b)-8])
			for _, n := range checkpointFiles(t, h.crash) {
				rewrite(t, h.crash, n, func(b []byte) { b[len(b)-20] ^= 1 })
			}
		}},
		{name: "another store's sealed and checkpoint files", loaded: 3, restored: false, rebuilt: perHour + openHour, tamper: func(t *testing.T, h *r28cHist) {
			write(t, h.crash, r28cSealed(2), read(t, other.crash, r28cSealed(2)))
			theirs := checkpointFiles(t, other.crash)
			for _, n := range checkpointFiles(t, h.crash) {
				write(t, h.crash, n, read(t, other.crash, theirs[0]))
			}
		}},
		{name: "sealed files swapped for the checkpoint's", loaded: 3, restored: false, rebuilt: perHour - 1 + openHour, tamper: func(t *testing.T, h *r28cHist) {
			// Hour 1's sealed file and the open hour's checkpoint trade
			// contents: each has a good checksum, another name.
			ck := checkpointFiles(t, h.crash)
			if len(ck) != 1 {
				t.Fatalf("checkpoint files %v", ck)
			}
			s, c := read(t, h.crash, r28cSealed(1)), read(t, h.crash, ck[0])
			write(t, h.crash, r28cSealed(1), c)
			write(t, h.crash, ck[0], s)
		}},
		{name: "an earlier generation left, the current one gone", loaded: 4, restored: false, rebuilt: openHour, tamper: func(t *testing.T, h *r28cHist) {
			if h.early == "" {
				t.Skip("no earlier checkpoint generation was seen")
			}
			for _, n := range checkpointFiles(t, h.crash) {
				if err := h.crash.Remove(n); err != nil {
					t.Fatal(err)
				}
			}
			write(t, h.crash, h.early, h.earlyB)
		}},
		{name: "every sealed file gone", loaded: 0, restored: true, rebuilt: 4*perHour - 2, tamper: func(t *testing.T, h *r28cHist) {
			for h0 := range 4 {
				if err := h.crash.Remove(r28cSealed(h0)); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := r28cBuild(t)
			if tc.tamper != nil {
				if other == nil {
					other = r28cBuild(t)
				}
				tc.tamper(t, h)
			}
			o := h.o
			o.FS = h.crash
			o.Clock = fixedClock(r28cStart().Add(4*time.Hour + 10*time.Minute).UnixNano())
			e := open(t, o)
			defer func() { _ = e.Close() }()
			s := e.Stats()
			h.check(t, e, "after the crash")
			s2 := e.Stats()
			if s.BloomSealedLoaded != tc.loaded || (s.BloomRestored > 0) != tc.restored || s2.BloomRebuiltKeys != tc.rebuilt {
				t.Errorf("%d sealed loaded, %d restored, %d keys scanned; want %d, restored %v, %d", s.BloomSealedLoaded, s.BloomRestored, s2.BloomRebuiltKeys, tc.loaded, tc.restored, tc.rebuilt)
			}
			// Rebuilt partitions are sealed again: a second crash loads
			// every sealed file.
			start := r28cStart()
			waitSealed(t, e, start, start.Add(time.Hour), start.Add(2*time.Hour), start.Add(3*time.Hour))
			before := e.Stats().BloomCheckpoints
			pad := make([][]byte, 30)
			for i := range pad {
				pad[i] = fmt.Appendf(nil, "again-%d", i)
			}
			if err := e.MarkBatch(context.Background(), pad, nil, make([]engine.Outcome, len(pad))); err != nil {
				t.Fatal(err)
			}
			h.def = append(h.def, pad...)
			waitFor(t, "a checkpoint", func() bool { return e.Stats().BloomCheckpoints > before })
			time.Sleep(50 * time.Millisecond)
			again := h.crash.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			o.FS = again
			e = open(t, o)
			if s := e.Stats(); s.BloomSealedLoaded != 4 || s.BloomMode != "warm" {
				t.Errorf("second crash: %d sealed loaded, mode %s, %d restored; want 4, warm", s.BloomSealedLoaded, s.BloomMode, s.BloomRestored)
			}
			h.check(t, e, "after a second crash")
		})
	}
}

// TestReview28cForgetMovedThenRecommit: a key forgotten in a moved (cold)
// partition, then committed again in the open one, is a Duplicate after a
// crash whether the cold partition's sealed file is loaded or the
// partition is scanned; forgotten again, it is New after the next crash.
func TestReview28cForgetMovedThenRecommit(t *testing.T) {
	engine.SetCheckpointKeys(25)
	defer engine.SetCheckpointKeys(0)
	for _, damage := range []bool{false, true} {
		t.Run(fmt.Sprintf("sealed file damaged=%v", damage), func(t *testing.T) {
			ctx := context.Background()
			h := r28cBuild(t)
			o := h.o
			o.FS = h.crash
			clock := newClock()
			clock.Add(4*time.Hour + 20*time.Minute)
			o.Clock = clock
			if damage {
				rewrite(t, h.crash, r28cSealed(1), func(b []byte) { b[len(b)/3] ^= 4 })
			}
			e := open(t, o)
			waitWarm(t, e)
			key := []byte("c-h1-3") // forgotten in the cold partition of hour 1
			if r, err := e.MarkIfAbsent(ctx, key); err != nil || r != engine.New {
				t.Fatalf("the forgotten key, marked again: %v %v", r, err)
			}
			crashed := h.crash.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			o.FS = crashed
			if damage {
				rewrite(t, crashed, r28cSealed(1), func(b []byte) { b[len(b)/3] ^= 4 })
			}
			e = open(t, o)
			waitWarm(t, e)
			if info, err := e.Lookup(ctx, key); err != nil || info.Outcome != engine.Duplicate {
				t.Fatalf("re-committed key after a crash: %v %v", info.Outcome, err)
			}
			if info, err := e.Forget(ctx, key); err != nil || info.Outcome != engine.Duplicate {
				t.Fatalf("Forget: %v %v", info.Outcome, err)
			}
			crashed = crashed.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			o.FS = crashed
			e = open(t, o)
			defer func() { _ = e.Close() }()
			waitWarm(t, e)
			if info, err := e.Lookup(ctx, key); err != nil || info.Outcome != engine.New {
				t.Fatalf("forgotten twice, after a crash: %v %v", info.Outcome, err)
			}
			allDuplicates(t, e, h.def)
		})
	}
}
