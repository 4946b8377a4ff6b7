package enginetest_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/internal/enginetest"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// dmShort is the window of the namespace "short" in dmBuild.
const dmShort = 150 * time.Minute

// dmHist is a history built by dmBuild, crashed.
type dmHist struct {
	o      engine.Options
	crash  crashFS         // the machine crash's file system
	def    [][]byte        // default-namespace keys, all live and not forgotten
	short  [][][]byte      // "short" keys by hour
	forgot map[string]bool // "ns/key", forgotten after their move
	early  string          // an earlier checkpoint's file (name)
	earlyB []byte          // and its content
}

func dmStart() time.Time { return newClock().Now() }

// dmSealed is the sealed file of hour h.
func dmSealed(h int) string { return hourFile(h) }

// dmBuild: hour partitions over a 4-hour window (5 live) and a namespace
// "short" of 150 minutes; 40 default and 10 short keys marked in each of
// hours 0..4, hours 0..3 sealed and moved into the cold database; a key of
// hour 1 (cold), a short key of hour 3 (cold) and a key of hour 4 (hot)
// forgotten; checkpoints every 25 keys, started only where it lets them:
// one after the seals (an earlier generation) and the last one after 30
// more keys, then 7 keys only in the journal; then a machine crash
// (CrashClone).
func dmBuild(t *testing.T) *dmHist {
	t.Helper()
	ctx := context.Background()
	fs := newCrashFS()
	clock := newClock()
	o := engine.Options{Backend: &embedded.Backend{Dir: "db", FS: fs}, Clock: clock, Window: 4 * time.Hour, Partition: time.Hour, ExpectedKeys: 1000,
		Namespaces: map[string]engine.NamespaceOptions{"short": {Window: dmShort}}}
	e := open(t, o)
	gate := newCheckpointGate(t)
	defer func() {
		gate.release()
		_ = e.Close()
	}()
	short, err := e.Namespace("short")
	if err != nil {
		t.Fatal(err)
	}
	h := &dmHist{o: o, forgot: map[string]bool{}}
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
	start := dmStart()
	waitSealed(t, e, start, start.Add(time.Hour), start.Add(2*time.Hour), start.Add(3*time.Hour))
	waitFor(t, "hours 0..3 moved", func() bool { return e.Stats().Store.ColdPartitions >= 4 })
	clock.Add(10 * time.Minute)
	gate.allow(t, e, 1) // the one hour 4's marks woke: of hour 4 only
	files := checkpointFiles(t, fs)
	if len(files) != 1 {
		t.Fatalf("checkpoint files after the seals: %v", files)
	}
	h.early, h.earlyB = files[0], read(t, fs, files[0])
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
	pad := gen("c-pad", 30)
	mark(def, pad)
	h.def = append(h.def, pad...)
	gate.allow(t, e, 2) // it starts after the pad's keys: it covers them
	tail := gen("c-tail", 7)
	mark(def, tail) // under 25: wakes none, nor would one start
	h.def = append(h.def, tail...)
	h.crash = fs.CrashClone(vfs.CrashCloneCfg{})
	if files := checkpointFiles(t, h.crash); len(files) != 1 || files[0] == h.early {
		t.Fatalf("checkpoint files at the crash: %v (the earlier one: %s)", files, h.early)
	}
	return h
}

// check verifies every answer of e against the history: every live
// default key Duplicate (claimed), short keys Duplicate inside their
// window and New after it, forgotten keys New, fresh keys New.
func (h *dmHist) check(t *testing.T, e *engine.Engine, what string) {
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

// TestMixedDamageAfterMoves: after a crash with four sealed
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
func TestMixedDamageAfterMoves(t *testing.T) {
	enginetest.SetCheckpointKeys(25)
	defer enginetest.SetCheckpointKeys(0)
	const perHour = 50 // 40 default + 10 short keys a closed hour
	// The open hour holds its 50 keys, 30 pad and 7 tail keys, and a
	// forgotten one (Forget deletes it from the store).
	const openHour = 50 + 30 + 7 - 1
	var other *dmHist // another store, the same history
	for _, tc := range []struct {
		name     string
		tamper   func(t *testing.T, h *dmHist)
		loaded   uint64
		restored bool   // the open hour restored from the checkpoint
		rebuilt  uint64 // keys scanned
	}{
		{name: "untouched", loaded: 4, restored: true, rebuilt: 0},
		{name: "flipped one, swapped two, kept one", loaded: 1, restored: true, rebuilt: 3*perHour - 1, tamper: func(t *testing.T, h *dmHist) {
			rewrite(t, h.crash, dmSealed(0), func(b []byte) { b[len(b)/2] ^= 0x10 })
			b2, b3 := read(t, h.crash, dmSealed(2)), read(t, h.crash, dmSealed(3))
			write(t, h.crash, dmSealed(2), b3)
			write(t, h.crash, dmSealed(3), b2)
		}},
		{name: "truncated sealed, flipped checkpoint", loaded: 3, restored: false, rebuilt: perHour - 1 + openHour, tamper: func(t *testing.T, h *dmHist) {
			b := read(t, h.crash, dmSealed(1))
			write(t, h.crash, dmSealed(1), b[:len(b)-8])
			for _, n := range checkpointFiles(t, h.crash) {
				rewrite(t, h.crash, n, func(b []byte) { b[len(b)-20] ^= 1 })
			}
		}},
		{name: "another store's sealed and checkpoint files", loaded: 3, restored: false, rebuilt: perHour + openHour, tamper: func(t *testing.T, h *dmHist) {
			write(t, h.crash, dmSealed(2), read(t, other.crash, dmSealed(2)))
			theirs := checkpointFiles(t, other.crash)
			for _, n := range checkpointFiles(t, h.crash) {
				write(t, h.crash, n, read(t, other.crash, theirs[0]))
			}
		}},
		{name: "sealed files swapped for the checkpoint's", loaded: 3, restored: false, rebuilt: perHour - 1 + openHour, tamper: func(t *testing.T, h *dmHist) {
			// Hour 1's sealed file and the open hour's checkpoint trade
			// contents: each has a good checksum, another name.
			ck := checkpointFiles(t, h.crash)
			if len(ck) != 1 {
				t.Fatalf("checkpoint files %v", ck)
			}
			s, c := read(t, h.crash, dmSealed(1)), read(t, h.crash, ck[0])
			write(t, h.crash, dmSealed(1), c)
			write(t, h.crash, ck[0], s)
		}},
		{name: "an earlier generation left, the current one gone", loaded: 4, restored: false, rebuilt: openHour, tamper: func(t *testing.T, h *dmHist) {
			for _, n := range checkpointFiles(t, h.crash) {
				if err := h.crash.Remove(n); err != nil {
					t.Fatal(err)
				}
			}
			write(t, h.crash, h.early, h.earlyB)
		}},
		{name: "every sealed file gone", loaded: 0, restored: true, rebuilt: 4*perHour - 2, tamper: func(t *testing.T, h *dmHist) {
			for h0 := range 4 {
				if err := h.crash.Remove(dmSealed(h0)); err != nil {
					t.Fatal(err)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := dmBuild(t)
			if tc.tamper != nil {
				if other == nil {
					other = dmBuild(t)
				}
				tc.tamper(t, h)
			}
			o := h.o
			setFS(&o, h.crash)
			o.Clock = fixedClock(dmStart().Add(4*time.Hour + 10*time.Minute).UnixNano())
			e := open(t, o)
			gate := newCheckpointGate(t) // the rebuild's end wakes one
			defer func() {
				gate.release()
				_ = e.Close()
			}()
			s := e.Stats()
			h.check(t, e, "after the crash")
			s2 := e.Stats()
			if s.Bloom.SealedLoaded != tc.loaded || (s.Bloom.Restored > 0) != tc.restored || s2.Bloom.RebuiltKeys != tc.rebuilt {
				t.Errorf("%d sealed loaded, %d restored, %d keys scanned; want %d, restored %v, %d", s.Bloom.SealedLoaded, s.Bloom.Restored, s2.Bloom.RebuiltKeys, tc.loaded, tc.restored, tc.rebuilt)
			}
			// Rebuilt partitions are sealed again: a second crash loads
			// every sealed file.
			start := dmStart()
			waitSealed(t, e, start, start.Add(time.Hour), start.Add(2*time.Hour), start.Add(3*time.Hour))
			pad := make([][]byte, 30)
			for i := range pad {
				pad[i] = fmt.Appendf(nil, "again-%d", i)
			}
			if err := e.MarkBatch(context.Background(), pad, nil, make([]engine.Outcome, len(pad))); err != nil {
				t.Fatal(err)
			}
			h.def = append(h.def, pad...)
			// It starts after the seals and the pad: it covers the open hour.
			gate.allow(t, e, e.Stats().Bloom.Checkpoints+1)
			again := h.crash.CrashClone(vfs.CrashCloneCfg{})
			gate.release()
			_ = e.Close()
			setFS(&o, again)
			e = open(t, o)
			if s := e.Stats(); s.Bloom.SealedLoaded != 4 || s.Bloom.Mode != "warm" {
				t.Errorf("second crash: %d sealed loaded, mode %s, %d restored; want 4, warm", s.Bloom.SealedLoaded, s.Bloom.Mode, s.Bloom.Restored)
			}
			h.check(t, e, "after a second crash")
		})
	}
}

// TestForgetMovedThenRecommit: a key forgotten in a moved (cold)
// partition, then committed again in the open one, is a Duplicate after a
// crash whether the cold partition's sealed file is loaded or the
// partition is scanned; forgotten again, it is New after the next crash.
func TestForgetMovedThenRecommit(t *testing.T) {
	enginetest.SetCheckpointKeys(25)
	defer enginetest.SetCheckpointKeys(0)
	for _, damage := range []bool{false, true} {
		t.Run(fmt.Sprintf("sealed file damaged=%v", damage), func(t *testing.T) {
			ctx := context.Background()
			h := dmBuild(t)
			o := h.o
			setFS(&o, h.crash)
			clock := newClock()
			clock.Add(4*time.Hour + 20*time.Minute)
			o.Clock = clock
			if damage {
				rewrite(t, h.crash, dmSealed(1), func(b []byte) { b[len(b)/3] ^= 4 })
			}
			e := open(t, o)
			waitWarm(t, e)
			key := []byte("c-h1-3") // forgotten in the cold partition of hour 1
			if r, err := e.MarkIfAbsent(ctx, key); err != nil || r != engine.New {
				t.Fatalf("the forgotten key, marked again: %v %v", r, err)
			}
			crashed := h.crash.CrashClone(vfs.CrashCloneCfg{})
			_ = e.Close()
			setFS(&o, crashed)
			if damage && readFile(t, crashed, dmSealed(1)) != nil { // resealed before the crash
				rewrite(t, crashed, dmSealed(1), func(b []byte) { b[len(b)/3] ^= 4 })
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
			setFS(&o, crashed)
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

// TestCrashWhileRebuilding: Open after a crash finds hour 1's
// sealed file and the checkpoint damaged and starts rebuilding them (held
// cold by the rebuild gate); meanwhile keys are committed and a key of a
// moved partition forgotten, and the machine crashes again before the
// rebuild ends (nothing resealed, no new checkpoint). The next Open must
// answer everything as acknowledged: the journal of both processes after
// the old checkpoint, the damaged files still refused.
func TestCrashWhileRebuilding(t *testing.T) {
	enginetest.SetCheckpointKeys(25)
	defer enginetest.SetCheckpointKeys(0)
	ctx := context.Background()
	h := dmBuild(t)
	rewrite(t, h.crash, dmSealed(1), func(b []byte) { b[len(b)/2] ^= 2 })
	for _, n := range checkpointFiles(t, h.crash) {
		rewrite(t, h.crash, n, func(b []byte) { b[200] ^= 2 })
	}
	gate := make(chan struct{})
	enginetest.SetRebuildGate(gate)
	defer enginetest.SetRebuildGate(nil)
	o := h.o
	setFS(&o, h.crash)
	o.Clock = fixedClock(dmStart().Add(4*time.Hour + 10*time.Minute).UnixNano())
	e := open(t, o)
	if m := e.Stats().Bloom.Mode; m == "warm" {
		t.Fatalf("mode %s with the rebuild held", m)
	}
	more := make([][]byte, 60)
	for i := range more {
		more[i] = fmt.Appendf(nil, "cold-mode-%d", i)
	}
	out := make([]engine.Outcome, len(more))
	if err := e.MarkBatch(ctx, more, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, r := range out {
		if r != engine.New {
			t.Fatalf("fresh %s is %v while rebuilding", more[i], r)
		}
	}
	h.def = append(h.def, more...)
	if info, err := e.Forget(ctx, []byte("c-h2-7")); err != nil || info.Outcome != engine.Duplicate {
		t.Fatalf("Forget while rebuilding: %v %v", info.Outcome, err)
	}
	h.forgot["/c-h2-7"] = true
	var kept [][]byte
	for _, k := range h.def {
		if string(k) != "c-h2-7" {
			kept = append(kept, k)
		}
	}
	h.def = kept
	time.Sleep(30 * time.Millisecond)
	crashed := h.crash.CrashClone(vfs.CrashCloneCfg{})
	_ = e.Close()
	enginetest.SetRebuildGate(nil)
	setFS(&o, crashed)
	e = open(t, o)
	defer func() { _ = e.Close() }()
	s := e.Stats()
	h.check(t, e, "after the second crash")
	t.Logf("second Open: %d sealed loaded, %d restored, %d journal keys, %d scanned", s.Bloom.SealedLoaded, s.Bloom.Restored, s.Bloom.JournalKeys, e.Stats().Bloom.RebuiltKeys)
}
