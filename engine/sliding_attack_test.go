package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
)

func saOpts(fs vfs.FS, clock *fakeClock, lease time.Duration) engine.Options {
	return engine.Options{Backend: &embedded.Backend{Dir: "s", FS: fs}, Window: slideWindow, Partition: slidePart, ExpectedKeys: 1000,
		Clock: clock, Lease: lease, Logger: quiet, Namespaces: map[string]engine.NamespaceOptions{"": {Sliding: true}}}
}

func saMark(t *testing.T, e *engine.Engine, k string) engine.Outcome {
	t.Helper()
	g, err := e.MarkIfAbsent(context.Background(), []byte(k))
	if err != nil {
		t.Fatalf("mark %q: %v", k, err)
	}
	return g
}

// holdMark arms a one-shot MarkBeforeCommit hold.
func holdMark(t *testing.T) (entered, release chan struct{}) {
	return holdOnce(t, enginetest.SetMarkBeforeCommit)
}

// holdOnce arms a one-shot hold in the hook set sets: the first call to
// reach it closes entered and waits for release; the hook is cleared when
// the test ends.
func holdOnce(t *testing.T, set func(func())) (entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	var armed atomic.Bool
	armed.Store(true)
	set(func() {
		if armed.CompareAndSwap(true, false) {
			close(entered)
			<-release
		}
	})
	t.Cleanup(func() { set(nil) })
	return
}

func waitCh(t *testing.T, c chan struct{}) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("never reached")
	}
}

// Attack 3 with MaxAttempts: a refresh claim whose lease ended is left in
// memory; the next mark of the committed key must be Duplicate, not Poison.
func TestSlideAttackLeaseLostRefreshMaxAttempts(t *testing.T) {
	for _, durable := range []bool{false, true} {
		t.Run(fmt.Sprint("durable=", durable), func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			o := saOpts(vfs.NewMem(), clock, time.Minute)
			o.MaxAttempts, o.DurableClaims = 1, durable
			e := open(t, o)
			defer e.Close()
			if g := saMark(t, e, "k"); g != engine.New {
				t.Fatal(g)
			}
			clock.Add(slideWindow - time.Minute)
			entered, release := holdMark(t)
			out := make([]engine.Outcome, 2)
			done := make(chan error, 1)
			go func() { done <- e.MarkBatch(ctx, [][]byte{[]byte("k"), []byte("fresh")}, nil, out) }()
			waitCh(t, entered)
			clock.Add(2 * time.Minute)
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			t.Logf("held mark answered %v", out)
			if out[0] != engine.Duplicate {
				t.Errorf("k answered %v", out[0])
			}
			// k is committed (first commit still inside its window? it was at
			// window-1min, now window+1min: first commit may have expired, the
			// refresh was not written). Check relative to Lookup.
			in, err := e.Lookup(ctx, []byte("k"))
			g := saMark(t, e, "k")
			t.Logf("after: Lookup %v (%v), mark %v", in.Outcome, err, g)
			if g == engine.Poison || g == engine.InFlight {
				t.Errorf("next mark of the refreshed key after its claim's lease ended: %v, want decided New/Duplicate (not poisoned by a leftover duplicate claim)", g)
			}
		})
	}
}

// Same, but the key is well inside its window (no expiry confusion): the
// key is committed; the next mark must be Duplicate.
func TestSlideAttackLeaseLostRefreshMaxAttemptsInsideWindow(t *testing.T) {
	for _, sliding := range []bool{true, false} {
		t.Run(fmt.Sprint("sliding=", sliding), func(t *testing.T) { slideAttackLeaseLostInside(t, sliding) })
	}
}

func slideAttackLeaseLostInside(t *testing.T, sliding bool) {
	ctx := context.Background()
	clock := newClock()
	o := saOpts(vfs.NewMem(), clock, time.Minute)
	o.MaxAttempts = 1
	o.Namespaces = map[string]engine.NamespaceOptions{"": {Sliding: sliding}}
	e := open(t, o)
	defer e.Close()
	if g := saMark(t, e, "k"); g != engine.New {
		t.Fatal(g)
	}
	clock.Add(slidePart + time.Minute)
	entered, release := holdMark(t)
	out := make([]engine.Outcome, 2)
	done := make(chan error, 1)
	go func() { done <- e.MarkBatch(ctx, [][]byte{[]byte("k"), []byte("fresh")}, nil, out) }()
	waitCh(t, entered)
	clock.Add(2 * time.Minute)
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if out[0] != engine.Duplicate {
		t.Errorf("k answered %v", out[0])
	}
	in, err := e.Lookup(ctx, []byte("k"))
	if err != nil || in.Outcome != engine.Duplicate {
		t.Errorf("Lookup k: %v %v want Duplicate", in.Outcome, err)
	}
	if g := saMark(t, e, "k"); g != engine.Duplicate {
		t.Errorf("next mark of committed key k after the held mark's refresh claim expired: %v, want Duplicate", g)
	}
	var outs [2]engine.Outcome
	if err := e.MarkBatch(ctx, [][]byte{[]byte("k"), []byte("k")}, nil, outs[:]); err != nil || outs[0] != engine.Duplicate || outs[1] != engine.Duplicate {
		t.Errorf("batch re-mark: %v %v", outs, err)
	}
}

// Attack 5: repeated refreshing key in a batch, with New keys; then crash.
func TestSlideAttackRepeatedRefreshCrash(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewCrashableMem()
	o := saOpts(fs, clock, 0)
	e := open(t, o)
	for _, k := range []string{"k", "j"} {
		if g := saMark(t, e, k); g != engine.New {
			t.Fatal(g)
		}
	}
	clock.Add(slideWindow - time.Minute)
	keys := [][]byte{[]byte("k"), []byte("x"), []byte("k"), []byte("j"), []byte("x"), []byte("k"), []byte("j")}
	out := make([]engine.Outcome, len(keys))
	if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	want := []engine.Outcome{engine.Duplicate, engine.New, engine.Duplicate, engine.Duplicate, engine.Duplicate, engine.Duplicate, engine.Duplicate}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("answers %v, want %v", out, want)
			break
		}
	}
	if r := e.Stats().Calls.Refreshes; r != 2 {
		t.Errorf("Refreshes %d, want 2", r)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	e.Close()
	clock.Add(2 * time.Hour)
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	for _, k := range []string{"k", "j", "x"} {
		if g := saMark(t, e, k); g != engine.Duplicate {
			t.Errorf("after crash %q: %v want Duplicate", k, g)
		}
	}
}

// Attack 4 with SetBeforeDurable: held after pinning, past the lease.
func TestSlideAttackForgetDuringDurable(t *testing.T) {
	for _, withNew := range []bool{true, false} {
		t.Run(fmt.Sprint("withNew=", withNew), func(t *testing.T) {
			ctx := context.Background()
			clock := newClock()
			e := open(t, saOpts(vfs.NewMem(), clock, time.Minute))
			defer e.Close()
			if g := saMark(t, e, "k"); g != engine.New {
				t.Fatal(g)
			}
			clock.Add(slidePart + time.Minute)
			entered, release := holdOnce(t, enginetest.SetBeforeDurable)
			keys := [][]byte{[]byte("k")}
			if withNew {
				keys = append(keys, []byte("fresh"))
			}
			out := make([]engine.Outcome, len(keys))
			done := make(chan error, 1)
			go func() { done <- e.MarkBatch(ctx, keys, nil, out) }()
			waitCh(t, entered)
			clock.Add(5 * time.Minute)
			fdone := make(chan error, 1)
			var info engine.KeyInfo
			go func() {
				var err error
				info, err = e.Forget(ctx, []byte("k"))
				fdone <- err
			}()
			var ferr error
			forgetFirst := false
			select {
			case ferr = <-fdone:
				forgetFirst = true
			case <-time.After(300 * time.Millisecond):
			}
			close(release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !forgetFirst {
				ferr = <-fdone
			}
			t.Logf("mark %v; forget (returned before release: %v) %v %v", out, forgetFirst, info.Outcome, ferr)
			in, _ := e.Lookup(ctx, []byte("k"))
			if ferr == nil && info.Outcome != engine.New {
				if in.Outcome != engine.New {
					t.Errorf("Forget succeeded (%v) but Lookup after the mark: %v, want New", info.Outcome, in.Outcome)
				}
				if g := saMark(t, e, "k"); g != engine.New {
					t.Errorf("Forget succeeded but next mark %v, want New", g)
				}
			} else if !errors.Is(ferr, engine.ErrInFlight) && ferr != nil {
				t.Errorf("forget err %v", ferr)
			}
		})
	}
}

// Attack 1: keeps re-sending via MarkBatch with irregular gaps; never New;
// then expires within window+partition of the last arrival.
func TestSlideAttackExpiry(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	e := open(t, saOpts(vfs.NewMem(), clock, 0))
	defer e.Close()
	gaps := []time.Duration{50 * time.Minute, 3*time.Hour + 50*time.Minute, 7 * time.Minute, 2 * time.Hour, 3*time.Hour + 59*time.Minute, 61 * time.Minute, 3*time.Hour + 30*time.Minute}
	if g := saMark(t, e, "k"); g != engine.New {
		t.Fatal(g)
	}
	for i, gap := range gaps {
		clock.Add(gap)
		out := make([]engine.Outcome, 3)
		if err := e.MarkBatch(ctx, [][]byte{[]byte(fmt.Sprint("n", i)), []byte("k"), []byte(fmt.Sprint("m", i))}, nil, out); err != nil {
			t.Fatal(err)
		}
		if out[1] != engine.Duplicate {
			t.Fatalf("re-send %d after %v: %v", i, gap, out[1])
		}
	}
	clock.Add(slideWindow - time.Minute)
	if in, _ := e.Lookup(ctx, []byte("k")); in.Outcome != engine.Duplicate {
		t.Errorf("window-1m after last arrival: %v", in.Outcome)
	}
	clock.Add(slidePart + 2*time.Minute)
	if g := saMark(t, e, "k"); g != engine.New {
		t.Errorf("window+partition after last arrival: %v want New", g)
	}
}

// Attack 5: concurrent goroutines marking hot keys across partition
// boundaries: each hot key New exactly once, never New afterwards, and no
// leftover InFlight once quiet.
func TestSlideAttackHotConcurrent(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewCrashableMem()
	o := saOpts(fs, clock, time.Hour)
	e := open(t, o)
	hot := []string{"h0", "h1", "h2", "h3"}
	var news [4]atomic.Int64
	var inflight atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				keys := [][]byte{[]byte(fmt.Sprint("u", w, "-", i)), []byte(hot[(w+i)%4]), []byte(hot[(w+i+1)%4]), []byte(hot[(w+i)%4])}
				out := make([]engine.Outcome, len(keys))
				if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
					t.Error(err)
					return
				}
				if out[0] != engine.New && out[0] != engine.InFlight {
					t.Errorf("unique key %v", out[0]) // InFlight: lease ended under the fake clock's jumps (documented)
				}
				for j := 1; j < 4; j++ {
					h := keys[j][1] - '0'
					switch out[j] {
					case engine.New:
						news[h].Add(1)
					case engine.InFlight:
						inflight.Add(1)
					}
				}
			}
		}()
	}
	for range 40 {
		time.Sleep(15 * time.Millisecond)
		clock.Add(17 * time.Minute)
	}
	close(stop)
	wg.Wait()
	for h := range news {
		if n := news[h].Load(); n != 1 {
			t.Errorf("hot key %d New %d times, want 1", h, n)
		}
	}
	t.Logf("InFlight answers while concurrent: %d; refreshes %d", inflight.Load(), e.Stats().Calls.Refreshes)
	for _, h := range hot {
		if g := saMark(t, e, h); g != engine.Duplicate {
			t.Errorf("quiet mark of %s: %v", h, g)
		}
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	e.Close()
	clock.Add(slideWindow - 5*time.Minute)
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	for _, h := range hot {
		if g := saMark(t, e, h); g != engine.Duplicate {
			t.Errorf("after crash %s: %v want Duplicate", h, g)
		}
	}
}

// Attack 3: Close during a held MarkBatch; reopen; the refresh held.
func TestSlideAttackCloseDuringMark(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewCrashableMem()
	o := saOpts(fs, clock, 0)
	e := open(t, o)
	if g := saMark(t, e, "k"); g != engine.New {
		t.Fatal(g)
	}
	clock.Add(slideWindow - time.Minute)
	entered, release := holdMark(t)
	out := make([]engine.Outcome, 2)
	done := make(chan error, 1)
	go func() { done <- e.MarkBatch(ctx, [][]byte{[]byte("k"), []byte("fresh")}, nil, out) }()
	waitCh(t, entered)
	cdone := make(chan error, 1)
	go func() { cdone <- e.Close() }()
	time.Sleep(100 * time.Millisecond)
	close(release)
	merr := <-done
	cerr := <-cdone
	t.Logf("mark %v %v; close %v", out, merr, cerr)
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	clock.Add(2 * time.Hour)
	setFS(&o, crashed)
	e = open(t, o)
	defer e.Close()
	if merr == nil {
		for _, k := range []string{"k", "fresh"} {
			if g := saMark(t, e, k); g != engine.Duplicate {
				t.Errorf("after close+crash %q: %v want Duplicate", k, g)
			}
		}
	} else {
		if g := saMark(t, e, "fresh"); g != engine.New {
			t.Errorf("failed mark but fresh %v", g)
		}
	}
}

// Attack 3: ctx canceled between claim and commit: claims given back.
func TestSlideAttackCancelBeforeCommit(t *testing.T) {
	clock := newClock()
	e := open(t, saOpts(vfs.NewMem(), clock, 0))
	defer e.Close()
	if g := saMark(t, e, "k"); g != engine.New {
		t.Fatal(g)
	}
	clock.Add(slidePart + time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	var armed atomic.Bool
	armed.Store(true)
	enginetest.SetMarkBeforeCommit(func() {
		if armed.CompareAndSwap(true, false) {
			cancel()
		}
	})
	defer enginetest.SetMarkBeforeCommit(nil)
	out := make([]engine.Outcome, 2)
	err := e.MarkBatch(ctx, [][]byte{[]byte("k"), []byte("fresh")}, nil, out)
	t.Logf("canceled mark: %v %v", out, err)
	if g := saMark(t, e, "k"); g != engine.Duplicate {
		t.Errorf("k after canceled mark: %v", g)
	}
	if g := saMark(t, e, "fresh"); err != nil && g != engine.New {
		t.Errorf("fresh after failed mark: %v", g)
	}
	// only duplicates batch canceled
	armed.Store(true)
	clock.Add(slidePart)
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	err = e.MarkBatch(ctx, [][]byte{[]byte("k")}, nil, out[:1])
	t.Logf("canceled dup-only mark: %v %v", out[:1], err)
	if g := saMark(t, e, "k"); g != engine.Duplicate {
		t.Errorf("k after canceled mark 2: %v", g)
	}
}

// Attack 5: namespace window + results + archive + crash.
func TestSlideAttackNSWindowResultsArchive(t *testing.T) {
	ctx := context.Background()
	clock := newClock()
	fs := vfs.NewCrashableMem()
	o := saOpts(fs, clock, 0)
	o.Archive = pebble.ArchiveDir{Dir: "arch", FS: fs}
	o.ArchiveWindow = 48 * time.Hour
	o.Namespaces = map[string]engine.NamespaceOptions{"w": {Sliding: true, Window: 2 * time.Hour}, "": {Sliding: true}}
	e := open(t, o)
	ns, _ := e.Namespace("w")
	res := func(context.Context) ([]byte, error) { return []byte("r"), nil }
	if g, _, err := ns.DoResult(ctx, []byte("k"), res); err != nil || g != engine.New {
		t.Fatal(g, err)
	}
	for i := range 5 {
		clock.Add(100 * time.Minute)
		out := make([]engine.Outcome, 3)
		if err := ns.MarkBatch(ctx, [][]byte{[]byte("k"), []byte(fmt.Sprint("n", i)), []byte("k")}, nil, out); err != nil {
			t.Fatal(err)
		}
		if out[0] != engine.Duplicate || out[2] != engine.Duplicate || out[1] != engine.New {
			t.Errorf("round %d: %v", i, out)
		}
		in, err := ns.Lookup(ctx, []byte("k"))
		if err != nil || in.Outcome != engine.Duplicate || string(in.Result) != "r" {
			t.Errorf("round %d lookup: %v %q %v", i, in.Outcome, in.Result, err)
		}
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	e.Close()
	clock.Add(110 * time.Minute)
	setFS(&o, crashed)
	o.Archive = pebble.ArchiveDir{Dir: "arch", FS: crashed}
	e = open(t, o)
	defer e.Close()
	ns, _ = e.Namespace("w")
	in, err := ns.Lookup(ctx, []byte("k"))
	if err != nil || in.Outcome != engine.Duplicate || string(in.Result) != "r" {
		t.Errorf("after crash lookup: %v %q %v", in.Outcome, in.Result, err)
	}
	g, r, err := ns.DoResult(ctx, []byte("k"), res)
	if err != nil || g != engine.Duplicate || string(r) != "r" {
		t.Errorf("after crash DoResult: %v %q %v", g, r, err)
	}
	clock.Add(2*time.Hour + time.Minute)
	if g, err := ns.MarkIfAbsent(ctx, []byte("k")); err != nil || g != engine.New {
		t.Errorf("2h+ after last arrival, ns window 2h: %v %v want New", g, err)
	}
}
