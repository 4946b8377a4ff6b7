package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Attacks on the one-step logged mark behind the archive (markLogScript,
// archiveBeforeMark, the settle and the Unmark give-back).

// lmRedisErr is an error reply from Redis as go-redis reports one (not a
// lost reply: the call fails at once).
type lmRedisErr string

func (e lmRedisErr) Error() string { return string(e) }
func (lmRedisErr) RedisError()     {}

// lmHook intercepts the engine's mark pipeline (its first EVALSHA names
// the archive log as its first key: markLogScript) and, in mode
// "late", fails it at once (a redis error) and sends a copy of it
// through other after delay; otherwise it runs it and loses its replies.
type lmHook struct {
	logKey string
	mode   string
	delay  time.Duration
	other  *goredis.Client
	state  atomic.Int32 // 0 off, 1 armed (mark next), 2 settle next, 3 done
	late   chan []any   // the late copy's answers
}

func (h *lmHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *lmHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *lmHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() != "evalsha" {
			return next(ctx, cmds)
		}
		isMark := len(cmds[0].Args()) > 3 && fmt.Sprint(cmds[0].Args()[3]) == h.logKey
		switch {
		case h.state.Load() == 1 && isMark:
			h.state.Store(2)
			if h.mode == "late" {
				copies := make([][]any, len(cmds))
				for i, c := range cmds {
					copies[i] = append([]any(nil), c.Args()...)
				}
				go func() {
					time.Sleep(h.delay)
					var got []any
					for _, a := range copies {
						v, err := h.other.Do(context.Background(), a...).Result()
						got = append(got, fmt.Sprint(v, err))
					}
					h.late <- got
				}()
				h.state.Store(3)
				err := lmRedisErr("ERR injected: the caller gave up on the mark")
				for _, c := range cmds {
					c.SetErr(err)
				}
				return err
			}
			_ = next(ctx, cmds)
			err := errors.New("read tcp: connection reset by peer (injected)")
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		return next(ctx, cmds)
	}
}

// TestLoggedMarkAttackLateCopyAfterShortFence: a mark whose call the
// client gave up on (a redis error: no settle) is given back by Unmark,
// which fences the key for a lease. A copy of the mark script reaching
// Redis after the fence but before LogBy (the archive read + 1 s) must not
// commit a key whose MarkBatch failed. With Lease 2 s the fence outlives
// LogBy; with Lease 100 ms it does not.
func TestLoggedMarkAttackLateCopyAfterShortFence(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	for _, lease := range []time.Duration{2 * time.Second, 100 * time.Millisecond} {
		t.Run(fmt.Sprint("lease=", lease), func(t *testing.T) {
			ctx := context.Background()
			prefix := fmt.Sprintf("lmlate-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			h := &lmHook{logKey: prefix + "\x00\x00", mode: "late", delay: 600 * time.Millisecond, other: srv.Client(t), late: make(chan []any, 1)}
			hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			hc.AddHook(h)
			oa := redisArchiveOptions(hc, prefix, arch)
			oa.Lease = lease
			a := ra2Open(t, oa)
			ob := redisArchiveOptions(plain, prefix, arch)
			ob.Lease = lease
			b := ra2Open(t, ob)
			keys := keysOf("lmlate", 5)
			out := make([]engine.Outcome, len(keys))
			h.state.Store(1)
			err := a.MarkBatch(ctx, keys, nil, out)
			if err == nil {
				t.Fatalf("MarkBatch whose mark call failed answered %v, want an error", out)
			}
			t.Logf("MarkBatch: %v", err)
			var got []any
			select {
			case got = <-h.late:
			case <-time.After(5 * time.Second):
				t.Fatal("the late copy never ran")
			}
			t.Logf("late copy answered %q", got)
			info := make([]engine.KeyInfo, len(keys))
			if err := b.LookupBatch(ctx, keys, info); err != nil {
				t.Fatal(err)
			}
			for i := range info {
				if info[i].Outcome != engine.New {
					t.Errorf("key %s, whose MarkBatch failed, after a late copy of its mark (lease %v): %v from %v, want New", keys[i], lease, info[i].Outcome, info[i].Source)
				}
			}
			n := 0
			for _, e := range gReadLog(t, plain, prefix) {
				for _, k := range e.commits {
					if strings.Contains(k, "lmlate") {
						n++
					}
				}
			}
			if n > 0 {
				t.Errorf("the archive log holds %d commits of the failed mark's keys", n)
			}
		})
	}
}

// TestLoggedMarkAttackExpiryBoundary: three engines on one prefix, a 3 s
// window. One marks fresh keys continuously; the two others mark, as
// they cross Redis's window, the keys it acknowledged (committed between
// 2.6 and 3.4 s ago), while Redis is paused for 300 ms now and then and
// the drain is stalled once for 1.5 s. No acknowledged key may be New
// again (failures, ErrUnavailable, are allowed).
func TestLoggedMarkAttackExpiryBoundary(t *testing.T) {
	srv := redistest.Start(t)
	prefix := fmt.Sprintf("lmexp-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	var engs []*engine.Engine
	for i := 0; i < 3; i++ {
		o := redisArchiveOptions(srv.Client(t), prefix, arch)
		// A 6 s window: the archive answers once partitions up to the
		// window less tier.LogSkew are sealed, which a 3 s window left a
		// second for (under -race on a loaded machine, every call failed).
		o.Window, o.Lease, o.ArchiveWindow, o.Logger = 6*time.Second, time.Second, 30*time.Second, quiet
		engs = append(engs, ra2Open(t, o))
	}
	ctx := context.Background()
	type acked struct {
		key []byte
		at  time.Time
	}
	var mu sync.Mutex
	var all []acked
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var marks, errs, checked atomic.Int64
	wg.Add(1)
	go func() { // the writer
		defer wg.Done()
		for n := 0; ; n++ {
			select {
			case <-stop:
				return
			case <-time.After(40 * time.Millisecond):
			}
			keys := keysOf(fmt.Sprintf("lmexp-%d", n), 10)
			out := make([]engine.Outcome, len(keys))
			if err := engs[0].MarkBatch(ctx, keys, nil, out); err != nil {
				errs.Add(1)
				continue
			}
			now := time.Now()
			mu.Lock()
			for i, o := range out {
				if o != engine.New {
					t.Errorf("fresh key %s: %v", keys[i], o)
				}
				all = append(all, acked{keys[i], now})
			}
			mu.Unlock()
			marks.Add(1)
		}
	}()
	for r := 1; r <= 2; r++ {
		wg.Add(1)
		go func(e *engine.Engine) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
				now := time.Now()
				var keys [][]byte
				var ages []time.Duration
				mu.Lock()
				for _, a := range all {
					if age := now.Sub(a.at); age > 2600*time.Millisecond && age < 3400*time.Millisecond {
						keys, ages = append(keys, a.key), append(ages, age)
					}
				}
				mu.Unlock()
				if len(keys) == 0 {
					continue
				}
				out := make([]engine.Outcome, len(keys))
				if err := e.MarkBatch(ctx, keys, nil, out); err != nil {
					errs.Add(1)
					continue
				}
				checked.Add(int64(len(keys)))
				for i, o := range out {
					if o == engine.New {
						t.Errorf("acknowledged key %s (committed %v ago) marked New again", keys[i], ages[i])
					}
				}
			}
		}(engs[r])
	}
	plain := srv.Client(t)
	time.Sleep(4 * time.Second)
	for i := 0; i < 4; i++ {
		srv.Pause()
		time.Sleep(300 * time.Millisecond)
		srv.Resume()
		time.Sleep(time.Second)
	}
	lease := ra2StallDrain(t, plain, prefix)
	time.Sleep(1500 * time.Millisecond)
	gFreeDrain(t, plain, lease)
	time.Sleep(4 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("%d writer batches, %d boundary keys checked, %d failed calls", marks.Load(), checked.Load(), errs.Load())
	if checked.Load() < 100 {
		t.Fatalf("only %d boundary keys checked", checked.Load())
	}
}

// TestLoggedMarkAttackRefusedAndBadInput: bad keys in a MarkBatch behind
// the archive return typed errors and write nothing; a sliding namespace
// and an engine with MaxAttempts on the prefix are reported.
func TestLoggedMarkAttackRefusedAndBadInput(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("lmbad-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	a := ra2Open(t, redisArchiveOptions(plain, prefix, arch))
	gMarkNew(t, a, keysOf("lmbad-warm", 2))
	xlen := func() int64 { n, _ := plain.XLen(ctx, prefix+"\x00\x00").Result(); return n }
	before := xlen()
	good := keysOf("lmbad", 3)
	for _, c := range []struct {
		bad  []byte
		want error
	}{{[]byte{}, engine.ErrEmptyKey}, {make([]byte, engine.DefaultMaxKeySize+1), engine.ErrKeyTooLong}} {
		keys := [][]byte{good[0], good[1], c.bad, good[2]}
		out := make([]engine.Outcome, len(keys))
		err := a.MarkBatch(ctx, keys, nil, out)
		if !errors.Is(err, c.want) {
			t.Errorf("MarkBatch with a bad key (%d bytes): %v, want %v", len(c.bad), err, c.want)
		}
		var ke *engine.KeyError
		if !errors.As(err, &ke) || ke.Index != 2 {
			t.Errorf("KeyError of %v: %+v", err, ke)
		}
	}
	if n := xlen(); n != before {
		t.Errorf("the log grew from %d to %d entries after refused batches", before, n)
	}
	info := make([]engine.KeyInfo, len(good))
	if err := a.LookupBatch(ctx, good, info); err != nil {
		t.Fatal(err)
	}
	for i := range info {
		if info[i].Outcome != engine.New {
			t.Errorf("good key %s of a refused batch: %v", good[i], info[i].Outcome)
		}
	}
	o := redisArchiveOptions(plain, prefix, arch)
	o.Logger = quiet
	o.Namespaces = map[string]engine.NamespaceOptions{"slide": {Sliding: true}}
	if e, err := engine.Open(&o); err == nil {
		_ = e.Close()
		t.Errorf("a sliding namespace over Redis opened")
	} else {
		t.Logf("sliding namespace over Redis: %v", err)
	}
	o = redisArchiveOptions(plain, prefix, arch)
	o.Logger, o.MaxAttempts = quiet, 3
	e, err := engine.Open(&o)
	if err == nil {
		defer e.Close()
		t.Logf("an engine with MaxAttempts opened on the prefix")
		k := keysOf("lmbad-ma", 3)
		out := make([]engine.Outcome, len(k))
		if err := e.MarkBatch(ctx, k, nil, out); err != nil {
			t.Fatal(err)
		}
		if err := a.MarkBatch(ctx, k, nil, out); err != nil || out[0] != engine.Duplicate {
			t.Errorf("one-step engine's mark of keys the MaxAttempts engine marked: %v %v", out, err)
		}
	} else if !errors.Is(err, engine.ErrLayout) {
		t.Errorf("MaxAttempts engine on the prefix: %v, want ErrLayout or a working engine", err)
	} else {
		t.Logf("MaxAttempts engine on the prefix: %v", err)
	}
}

// TestLoggedMarkAttackMixedPathsAndForget: the same keys, in the default
// namespace and one with its own ArchiveWindow (14 s), are marked by one
// engine (one step), claimed and committed by another, and done (Do) by a
// third, concurrently: each key is acknowledged at most once. Some marked
// keys are forgotten (ForgetBatch) and some of those marked again; the
// marking engine is closed and reopened. After Redis's 3 s window every
// acknowledged key is Duplicate from the archive for every engine, the
// forgotten-only keys are New; past the namespace's 14 s its keys are New.
// (The namespace's window leaves room for the marking loop: its first
// keys are seconds older than its last under -race, and the check inside
// the window comes once the last have left Redis.)
func TestLoggedMarkAttackMixedPathsAndForget(t *testing.T) {
	srv := redistest.Start(t)
	prefix := fmt.Sprintf("lmmix-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	ctx := context.Background()
	mk := func() engine.Options {
		o := redisArchiveOptions(srv.Client(t), prefix, arch)
		// A 6 s window: the archive answers once partitions up to the
		// window less tier.LogSkew are sealed, which a 3 s window left a
		// second for (under -race on a loaded machine, every call failed).
		o.Window, o.Lease, o.ArchiveWindow, o.Logger = 6*time.Second, time.Second, 30*time.Second, quiet
		o.Namespaces = map[string]engine.NamespaceOptions{"aw": {ArchiveWindow: 14 * time.Second}}
		return o
	}
	engs := []*engine.Engine{ra2Open(t, mk()), ra2Open(t, mk()), ra2Open(t, mk())}
	keys := keysOf("lmmix", 200)
	started := time.Now()
	var acks [2][200]atomic.Int32
	var wg sync.WaitGroup
	for ni, nsName := range []string{"", "aw"} {
		for w := 0; w < 3; w++ {
			wg.Add(1)
			go func(ni, w int, nsName string) {
				defer wg.Done()
				ns, err := engs[w].Namespace(nsName)
				if err != nil {
					t.Error(err)
					return
				}
				for lo := 0; lo < len(keys); lo += 20 {
					batch := keys[lo : lo+20]
					// A batch whose call fails (ErrUnavailable while the
					// archive catches up) is sent again, as a consumer's
					// redelivery would: a failed call acknowledged nothing.
					retry := func(what string, err error) bool {
						if err == nil {
							return false
						}
						if !errors.Is(err, engine.ErrUnavailable) || time.Since(started) > time.Minute {
							t.Errorf("%s: %v", what, err)
							return false
						}
						time.Sleep(100 * time.Millisecond)
						return true
					}
					switch w {
					case 0:
						out := make([]engine.Outcome, len(batch))
						var err error
						for err = ns.MarkBatch(ctx, batch, nil, out); retry("mark", err); err = ns.MarkBatch(ctx, batch, nil, out) {
						}
						if err != nil {
							continue
						}
						for i, o := range out {
							if o == engine.New {
								acks[ni][lo+i].Add(1)
							}
						}
					case 1:
						cls := make([]engine.Claim, len(batch))
						var err error
						for err = ns.ClaimBatch(ctx, batch, nil, cls); retry("claim", err); err = ns.ClaimBatch(ctx, batch, nil, cls) {
						}
						if err != nil {
							continue
						}
						var news []engine.Claim
						var idx []int
						for i := range cls {
							if cls[i].Outcome == engine.New {
								news, idx = append(news, cls[i]), append(idx, lo+i)
							}
						}
						errs := make([]error, len(news))
						for err = engs[1].CommitBatch(ctx, news, errs); retry("commit", err); err = engs[1].CommitBatch(ctx, news, errs) {
						}
						for i := range news {
							if errs[i] == nil {
								acks[ni][idx[i]].Add(1)
							}
						}
					case 2:
						for i, k := range batch {
							o, err := ns.Do(ctx, k, func(context.Context) error { return nil })
							for retry("do", err) {
								o, err = ns.Do(ctx, k, func(context.Context) error { return nil })
							}
							if err == nil && o == engine.New {
								acks[ni][lo+i].Add(1)
							}
						}
					}
				}
			}(ni, w, nsName)
		}
	}
	wg.Wait()
	committed := time.Now()
	for ni := range acks {
		for i := range acks[ni] {
			if n := acks[ni][i].Load(); n != 1 {
				t.Errorf("namespace %d key %s acknowledged %d times, want once", ni, keys[i], n)
			}
		}
	}
	// Forget and re-mark, then close and reopen the marking engine.
	fresh := keysOf("lmmixf", 20)
	gMarkNew(t, engs[0], fresh)
	info := make([]engine.KeyInfo, len(fresh))
	if err := engs[0].ForgetBatch(ctx, fresh, info); err != nil {
		t.Fatal(err)
	}
	gMarkNew(t, engs[0], fresh[:10])
	if err := engs[0].Close(); err != nil {
		t.Fatal(err)
	}
	engs[0] = ra2Open(t, mk())
	out := make([]engine.Outcome, len(fresh))
	lmMark(t, engs[0], nil, fresh[:10], out[:10])
	for i := 0; i < 10; i++ {
		if out[i] != engine.Duplicate {
			t.Errorf("re-marked key %s after reopen: %v", fresh[i], out[i])
		}
	}
	waitFromArchive(t, engs[1], append(append([][]byte{}, keys...), fresh[:10]...), 20*time.Second)
	for w, e := range engs {
		o := make([]engine.Outcome, len(keys))
		lmMark(t, e, nil, keys, o)
		for i := range o {
			if o[i] != engine.Duplicate {
				t.Errorf("engine %d: acknowledged key %s past Redis's window: %v", w, keys[i], o[i])
			}
		}
	}
	if err := engs[2].LookupBatch(ctx, fresh[10:], info[10:]); err != nil {
		t.Fatal(err)
	}
	for i := 10; i < 20; i++ {
		if info[i].Outcome != engine.New {
			t.Errorf("forgotten key %s past Redis's window: %v from %v, want New", fresh[i], info[i].Outcome, info[i].Source)
		}
	}
	nsAW, _ := engs[1].Namespace("aw")
	mid := make([]engine.KeyInfo, len(keys))
	if err := nsAW.LookupBatch(ctx, keys, mid); err != nil {
		t.Fatal(err)
	}
	for i := range mid {
		if mid[i].Outcome != engine.Duplicate {
			t.Fatalf("namespace aw key %s %v after commit: %v from %v", keys[i], time.Since(committed), mid[i].Outcome, mid[i].Source)
		}
	}
	time.Sleep(time.Until(committed.Add(16 * time.Second)))
	ns0, _ := engs[0].Namespace("aw")
	o := make([]engine.Outcome, len(keys))
	lmMark(t, nil, ns0, keys, o)
	for i := range o {
		if o[i] != engine.New {
			t.Errorf("namespace aw key %s past its 14 s archive window: %v, want New", keys[i], o[i])
		}
	}
	d := make([]engine.KeyInfo, len(keys))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := engs[2].LookupBatch(ctx, keys, d)
		if err == nil {
			break
		}
		t.Logf("lookup: %v", err)
		if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	for i := range d {
		if d[i].Outcome != engine.Duplicate {
			t.Errorf("default namespace key %s 16 s after commit (archive window 30 s): %v", keys[i], d[i].Outcome)
		}
	}
}

// lmMark marks keys on e (or ns), trying again for up to 10 s while the
// call fails with ErrUnavailable (a reopened engine's archive catching up).
func lmMark(t *testing.T, e *engine.Engine, ns *engine.Namespace, keys [][]byte, out []engine.Outcome) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var err error
		if ns != nil {
			err = ns.MarkBatch(context.Background(), keys, nil, out)
		} else {
			err = e.MarkBatch(context.Background(), keys, nil, out)
		}
		if err == nil {
			return
		}
		if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
}
