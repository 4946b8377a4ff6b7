package enginetest_test

// More attacks on the embedded store's ownership of its partitions' lives
// (tier/embedded/life.go) and on the archive behind it, through the
// public API, combining what life_attack_test.go attacks one at a time:
// a stalled archive and Forget, clock jumps, reopen with changed
// configurations, durable claims, crashes.
//
// The world (laWorld), its options and helpers are life_attack_test.go's:
// hourly partitions, a 4-hour Window (5 live partitions: the current one
// and 4 before it) and a 12-hour ArchiveWindow.

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

// TestLife2AttackCommitAsyncAcrossJumpThenClose shows whether commits
// queued with CommitAsync while the clock jumps (taking partitions out of
// the window, so the archiver closes them for writes and takes them) and
// then flushed by Close, are kept: every commit whose done got nil must be
// Duplicate after a reopen with a longer Window and ArchiveWindow, and
// stay Duplicate (from the archive) once the clock has moved past the new
// window, for the archive window. The history committed before stays
// Duplicate too.
func TestLife2AttackCommitAsyncAcrossJumpThenClose(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	mem := vfs.NewMem()
	o := laOptions(clock, mem, pebble.ArchiveDir{Dir: "archive", FS: mem})
	o.Lease = 3 * time.Hour
	w := newLAWorld(t, o, clock)
	w.hours(4) // history in 0..3; the clock at 4
	const n = 400
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("async-%03d", i))
	}
	claims := make([]engine.Claim, n)
	if err := w.e.ClaimBatch(ctx, keys, nil, claims); err != nil {
		t.Fatal(err)
	}
	for i, c := range claims {
		if c.Outcome != engine.New {
			t.Fatalf("claim %s: %v", keys[i], c.Outcome)
		}
	}
	var mu sync.Mutex
	acked := map[int]bool{}
	var failed []string
	var dones sync.WaitGroup
	dones.Add(n)
	jumped := make(chan struct{})
	go func() {
		defer close(jumped)
		time.Sleep(time.Millisecond)
		w.clock.Add(2*time.Hour + 59*time.Minute) // clock at 6:59: partitions 0 and 1 leave the window
		_, _ = w.e.Lookup(ctx, []byte("tick"))
	}()
	for i := range claims {
		i := i
		w.e.CommitAsync(ctx, claims[i], func(err error) {
			defer dones.Done()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", keys[i], err))
				return
			}
			acked[i] = true
		})
		if i == n/2 {
			<-jumped
		}
	}
	if err := w.e.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	dones.Wait()
	w.e = nil
	t.Logf("%d commits acknowledged, %d failed (first: %v)", len(acked), len(failed), failed[:min(1, len(failed))])
	if len(acked) == 0 {
		t.Fatal("no commit acknowledged: the test shows nothing")
	}
	w.o.Window, w.o.ArchiveWindow = 6*time.Hour, 16*time.Hour
	w.e = open(t, w.o)
	check := func(what string) {
		t.Helper()
		out := make([]engine.KeyInfo, n)
		if err := w.e.LookupBatch(ctx, keys, out); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		bad := 0
		for i := range keys {
			if acked[i] && out[i].Outcome != engine.Duplicate {
				if bad == 0 {
					t.Errorf("%s: acknowledged commit %s is %v from %v, want Duplicate", what, keys[i], out[i].Outcome, out[i].Source)
				}
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%s: %d of %d acknowledged commits not Duplicate (archive %+v)", what, bad, len(acked), *w.e.Stats().Archive)
		}
	}
	check("reopened with a 6-hour window")
	w.mustDup("history, reopened", 0, 3)
	w.advance(9 * laPart) // the commits (at 6:59) are 9 hours old: past the window, inside the archive window
	w.commit()
	if st, ok := laWaitLag(w.e, 10*time.Second); !ok {
		t.Fatalf("the archive lags: %+v", *st.Archive)
	}
	check("9 hours on")
	w.mustDup("history, 9 hours on", w.cur()-15, w.cur())
	w.reopen(nil)
	check("9 hours on, reopened")
}

// l2Ack is a key acknowledged (a mark answered New, or a durable claim's
// commit returned nil), or a durable claim answered New and abandoned,
// with the clock read before its call.
type l2Ack struct {
	key    []byte
	before time.Time
}

// TestLife2AttackCrashClonesDuringMarksAndJumps shows whether machine
// crashes (CrashClone of the one filesystem holding the store and the
// archive) taken while three goroutines mark fresh keys, a fourth claims
// keys with DurableClaims (MaxAttempts 1) and commits half of them,
// abandoning the others, and the clock jumps by 1 to 7 hours at a time
// (partitions leave the window at once: the write floor, the archiver,
// the store's drops), lose nothing: each clone, reopened at its crash's
// clock with a longer Window (6 h) and ArchiveWindow (16 h), must answer
// Duplicate for every key acknowledged before the crash that is less than
// 11 hours old (the old archive window, a partition's margin kept), and
// for every abandoned durable claim less than 3 hours old Poison (its
// attempt counted; never New, never Duplicate); an abandoned claim is
// never Duplicate at any age. Then the clone's clock moves 4 hours on and
// the archive catches up: the same again.
func TestLife2AttackCrashClonesDuringMarksAndJumps(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	crash := newCrashFS()
	o := laOptions(clock, crash, pebble.ArchiveDir{Dir: "archive", FS: crash})
	o.ExpectedKeys, o.Logger = 20000, quiet
	o.DurableClaims, o.MaxAttempts, o.Lease = true, 1, time.Hour
	e := open(t, o)
	type clone struct {
		fs        crashFS
		at        time.Time
		acked     []l2Ack
		abandoned []l2Ack
	}
	var mu sync.Mutex
	var acked, abandoned []l2Ack
	var clones []clone
	var markErrs atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := make([]engine.Outcome, 8)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				keys := make([][]byte, 8)
				for k := range keys {
					keys[k] = fmt.Appendf(nil, "m%d-%06d-%d", g, i, k)
				}
				before := clock.Now()
				if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
					markErrs.Add(1)
					continue
				}
				mu.Lock()
				for k, oc := range out {
					if oc == engine.New {
						acked = append(acked, l2Ack{keys[k], before})
					}
				}
				mu.Unlock()
			}
		}()
	}
	wg.Add(1)
	go func() { // durable claims, every other one committed
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			key := fmt.Appendf(nil, "d-%06d", i)
			before := clock.Now()
			c, err := e.Claim(ctx, key)
			if err != nil || c.Outcome != engine.New {
				continue
			}
			if i%2 == 1 {
				mu.Lock()
				abandoned = append(abandoned, l2Ack{key, before})
				mu.Unlock()
				continue
			}
			if err := e.Commit(ctx, c); err == nil {
				mu.Lock()
				acked = append(acked, l2Ack{key, before})
				mu.Unlock()
			}
		}
	}()
	jumps := []time.Duration{laPart, 7 * laPart, 2 * laPart, laPart, 5 * laPart, 3 * laPart}
	for step := range 24 {
		time.Sleep(8 * time.Millisecond)
		clock.Add(jumps[step%len(jumps)])
		_, _ = e.Lookup(ctx, []byte("tick"))
		if step%3 == 2 {
			time.Sleep(3 * time.Millisecond)
			mu.Lock()
			c := clone{at: clock.Now(), acked: slices.Clone(acked), abandoned: slices.Clone(abandoned)}
			c.fs = crash.CrashClone(vfs.CrashCloneCfg{})
			clones = append(clones, c)
			mu.Unlock()
		}
	}
	close(stop)
	wg.Wait()
	_ = e.Close()
	t.Logf("%d clones, %d keys acknowledged, %d durable claims abandoned, %d marks failed", len(clones), len(acked), len(abandoned), markErrs.Load())
	const margin = time.Hour
	for n, c := range clones {
		cl := enginetest.ClockAt(c.at)
		o2 := laOptions(cl, c.fs, pebble.ArchiveDir{Dir: "archive", FS: c.fs})
		o2.ExpectedKeys, o2.Logger = 20000, quiet
		o2.DurableClaims, o2.MaxAttempts, o2.Lease = true, 1, time.Hour
		o2.Window, o2.ArchiveWindow = 6*time.Hour, 16*time.Hour
		e2, err := engine.Open(&o2)
		if err != nil {
			t.Errorf("clone %d: open: %v", n, err)
			continue
		}
		checkClone := func(what string) {
			now := cl.Now()
			var keys [][]byte
			for _, a := range c.acked {
				if now.Sub(a.before) < laAW-margin {
					keys = append(keys, a.key)
				}
			}
			out := make([]engine.KeyInfo, len(keys))
			if err := e2.LookupBatch(ctx, keys, out); err != nil {
				t.Errorf("clone %d %s: lookup: %v", n, what, err)
				return
			}
			bad := 0
			for i, in := range out {
				if in.Outcome != engine.Duplicate {
					if bad == 0 {
						t.Errorf("clone %d %s: acknowledged key %s is %v from %v, want Duplicate", n, what, keys[i], in.Outcome, in.Source)
					}
					bad++
				}
			}
			if bad > 0 {
				t.Errorf("clone %d %s: %d of %d acknowledged keys younger than %v not Duplicate", n, what, bad, len(keys), laAW-margin)
			}
			keys = keys[:0]
			for _, a := range c.abandoned {
				keys = append(keys, a.key)
			}
			out = make([]engine.KeyInfo, len(keys))
			if err := e2.LookupBatch(ctx, keys, out); err != nil {
				t.Errorf("clone %d %s: lookup: %v", n, what, err)
				return
			}
			for i, in := range out {
				young := now.Sub(c.abandoned[i].before) < laWindow-margin
				switch {
				case in.Outcome == engine.Duplicate:
					t.Errorf("clone %d %s: abandoned durable claim %s (never committed) is Duplicate from %v", n, what, keys[i], in.Source)
				case young && in.Outcome != engine.Poison:
					t.Errorf("clone %d %s: abandoned durable claim %s, %v old, is %v, want Poison", n, what, keys[i], now.Sub(c.abandoned[i].before), in.Outcome)
				}
			}
		}
		checkClone("reopened")
		cl.Add(4 * laPart)
		_, _ = e2.Lookup(ctx, []byte("tick"))
		if st, ok := laWaitLag(e2, 10*time.Second); !ok {
			t.Errorf("clone %d: the archive lags: %+v", n, *st.Archive)
		}
		checkClone("4 hours on")
		_ = e2.Close()
	}
}
