package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Attacks on a Forget's LogBy behind Redis's archive,
// combined with clock skew, short windows, pauses, late copies and mixed
// batches.

// flbShort is o with the shortest window in Redis an archive takes (5 s
// of 1 s partitions: Partition + 2*tier.LogSkew; 300 ms Lease), so keys
// reach the archive soon.
func flbShort(o engine.Options) engine.Options {
	o.Window, o.Partition, o.Lease = 5*time.Second, time.Second, 300*time.Millisecond
	o.Logger = quiet
	return o
}

// flbRetry calls do until it succeeds, for up to 5 s while it fails with
// ErrUnavailable (with a short window in Redis, a read waits for a partition
// the drain has not sealed yet); any other error fails the test.
func flbRetry(t *testing.T, what string, do func() error) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		err := do()
		if err == nil {
			return
		}
		if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// flbMarkNew marks keys on e (an engine or a namespace), retrying while
// the archive is unavailable (a partition not sealed yet), and wants each
// New.
func flbMarkNew(t *testing.T, e interface {
	MarkBatch(context.Context, [][]byte, []engine.Digest, []engine.Outcome) error
}, keys [][]byte) {
	t.Helper()
	out := make([]engine.Outcome, len(keys))
	flbRetry(t, "mark", func() error { return e.MarkBatch(context.Background(), keys, nil, out) })
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("mark of key %s: %v, want New", keys[i], o)
		}
	}
}

// flbForget runs forget until it succeeds (as flbRetry), arming h anew
// before each attempt: the copy kept is the script call of the attempt
// that succeeded, not of one refused before it (an earlier LogBy).
func flbForget(t *testing.T, h *bkLateForget, forget func() error) {
	t.Helper()
	flbRetry(t, "forget", func() error {
		h.mu.Lock()
		h.copies = nil
		h.mu.Unlock()
		h.armed.Store(true)
		return forget()
	})
}

// flbSend sends copies of the forget script now and returns each copy's
// answers, one a key; an error or an answer that is not a list of strings
// fails the test.
func flbSend(t *testing.T, copies [][]any, do func(args []any) (any, error)) [][]string {
	t.Helper()
	if len(copies) == 0 {
		t.Fatal("the hook kept no copy of the forget script call")
	}
	var ans [][]string
	for _, args := range copies {
		v, err := do(args)
		list, ok := v.([]any)
		if err != nil || !ok || len(list) == 0 {
			t.Fatalf("a copy of the forget script answered %v, %v", v, err)
		}
		a := make([]string, len(list))
		for i, x := range list {
			a[i], _ = x.(string)
		}
		ans = append(ans, a)
	}
	return ans
}

// flbDeliver sends the copies h kept now (and forgets them).
func flbDeliver(t *testing.T, h *bkLateForget, do func(args []any) (any, error)) [][]string {
	t.Helper()
	h.mu.Lock()
	copies := h.copies
	h.copies = nil
	h.mu.Unlock()
	return flbSend(t, copies, do)
}

// flbEvery fails the test unless every key's answer in ans passes ok:
// want says what was expected, when the copies were sent.
func flbEvery(t *testing.T, ans [][]string, when, want string, ok func(string) bool) {
	t.Helper()
	for _, a := range ans {
		for _, v := range a {
			if !ok(v) {
				t.Errorf("%s: a copy of the forget script answered %q for a key (all: %q), want %s", when, v, a, want)
				return
			}
		}
	}
}

// flbAllLate: every key's answer is the refusal past LogBy, L: the key
// was absent and the copy came later than LogBy, so it wrote nothing.
func flbAllLate(t *testing.T, ans [][]string, when string) {
	t.Helper()
	flbEvery(t, ans, when, "L (past LogBy: nothing written)", func(v string) bool { return v == "L" })
}

// flbRig is the late-Forget attacks' setup: a redis-server of their own,
// a plain client (the marker's, and the one late copies arrive through), a
// fresh prefix, a PostgreSQL archive, and a client whose hook keeps the
// Forget's script calls (the forgetter's).
type flbRig struct {
	plain, hooked *goredis.Client
	h             *bkLateForget
	prefix        string
	arch          postgres.Archive
}

func newFLBRig(t *testing.T, name string) *flbRig {
	t.Helper()
	srv := redistest.Start(t)
	r := &flbRig{plain: srv.Client(t), hooked: srv.Client(t), h: &bkLateForget{},
		prefix: fmt.Sprintf("%s-%d:", name, time.Now().UnixNano()), arch: redisArchive(t)}
	r.hooked.AddHook(r.h)
	return r
}

// options are the attacks' options (flbShort) over client c.
func (r *flbRig) options(c goredis.UniversalClient) engine.Options {
	return flbShort(redisArchiveOptions(c, r.prefix, r.arch))
}

// send sends one kept copy through the plain client.
func (r *flbRig) send(args []any) (any, error) {
	return r.plain.Do(context.Background(), args...).Result()
}

// TestFLBSkewAheadShortWindow: the forgetting engine's clock is ahead of
// Redis's (1.5 s, 1.9 s: within tier.LogSkew) and Redis's window is
// as short as Open takes (5 s of 1 s partitions). LogBy is
// the forgetter's clock plus a second; a commit made after the Forget by
// an engine whose clock agrees with Redis leaves Redis a window later. A
// late copy of the Forget's script delivered once that commit left Redis
// (but before LogBy by the forgetter's clock) would append a removal that
// hides it. Last, the marker's clock 0.9 s behind Redis's as well (each
// engine within tier.LogSkew of Redis, 2.4 s apart).
func TestFLBSkewAheadShortWindow(t *testing.T) {
	for _, c := range []struct{ skew, mskew time.Duration }{
		{0, 0}, {1500 * time.Millisecond, 0}, {1900 * time.Millisecond, 0},
		{1500 * time.Millisecond, -900 * time.Millisecond},
	} {
		skew := c.skew
		t.Run(fmt.Sprintf("skew=%v,marker=%v", skew, c.mskew), func(t *testing.T) {
			r := newFLBRig(t, "flbsw")
			h := r.h
			ctx := context.Background()
			of := r.options(r.hooked)
			of.Clock = bkClock{skew}
			f := ra2Open(t, of)
			om := r.options(r.plain)
			om.Clock = bkClock{c.mskew}
			m := ra2Open(t, om)
			keys := keysOf("flbsw", 20)
			flbMarkNew(t, m, keys) // C0
			waitFromArchive(t, m, keys, 20*time.Second)
			info := make([]engine.KeyInfo, len(keys))
			start := time.Now()
			// The Forget must succeed for the attack (a clock far off may
			// fail one: retried, its copy kept anew each time).
			for attempt := 1; ; attempt++ {
				h.mu.Lock()
				h.copies = nil
				h.mu.Unlock()
				h.armed.Store(true)
				err := f.ForgetBatch(ctx, keys, info)
				if err == nil {
					break
				}
				if !bkTyped(err) {
					t.Fatalf("untyped: %v", err)
				}
				if attempt == 10 {
					t.Fatalf("the Forget failed ten times: %v", err)
				}
				time.Sleep(200 * time.Millisecond)
			}
			flbMarkNew(t, m, keys) // C1, acknowledged after the Forget
			acked := time.Now()
			// Wait until C1 left Redis (answered from the archive).
			waitFromArchive(t, m, keys, 20*time.Second)
			ans := flbDeliver(t, h, r.send)
			t.Logf("late copy delivered %v after the Forget started, %v after C1: %q", time.Since(start).Round(time.Millisecond), time.Since(acked).Round(time.Millisecond), ans)
			flbAllLate(t, ans, "after C1 left Redis")
			bkStaysDuplicate(t, m, keys, acked, fmt.Sprint("skew ", skew))
		})
	}
}

// TestFLBLateCopyMoments: copies of one Forget's script delivered at three
// moments (before the key is committed again, after the commit while Redis
// holds it, after it left for the archive), with the forgetter's clock
// behind or ahead of Redis's (5 s window in Redis). Each commit acknowledged after the Forget
// must stay Duplicate; the copy before the commit only repeats the
// Forget's own removal.
func TestFLBLateCopyMoments(t *testing.T) {
	for _, skew := range []time.Duration{-500 * time.Millisecond, 500 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(fmt.Sprint("skew=", skew), func(t *testing.T) {
			r := newFLBRig(t, "flbm")
			h := r.h
			ctx := context.Background()
			// m (Redis's clock) drains: a drainer behind Redis seals
			// late for an archive read.
			m := ra2Open(t, r.options(r.plain))
			ra2WaitDrainer(t, m, 5*time.Second)
			of := r.options(r.hooked)
			of.Clock = bkClock{skew}
			f := ra2Open(t, of)
			keys := keysOf("flbm", 12)
			flbMarkNew(t, m, keys)
			waitFromArchive(t, m, keys, 20*time.Second)
			info := make([]engine.KeyInfo, len(keys))
			flbForget(t, h, func() error { return f.ForgetBatch(ctx, keys, info) })
			h.mu.Lock()
			copies := h.copies
			h.mu.Unlock()
			do := func() [][]string {
				return flbSend(t, copies, r.send)
			}
			// The keys were in the archive only: the Forget left no fence
			// in Redis, so a copy finds them absent and, by LogBy,
			// appends the Forget's own removal again ("1"), or past it
			// writes nothing ("L"; the copy comes later than LogBy on a
			// loaded machine with the forgetter's clock behind Redis's).
			flbEvery(t, do(), "before the commit", "the Forget's own removal again (1) or nothing (L)", func(v string) bool { return v == "1" || v == "L" })
			// The key must still be New (the copy only removed again).
			flbRetry(t, "lookup", func() error { return m.LookupBatch(ctx, keys, info) })
			for i := range info {
				if info[i].Outcome != engine.New {
					t.Errorf("key %s forgotten, a copy delivered: %v from %v, want New", keys[i], info[i].Outcome, info[i].Source)
				}
			}
			flbMarkNew(t, m, keys)
			acked := time.Now()
			// Another value (the commit made since): kept, Held.
			flbEvery(t, do(), "after the commit, in Redis", "0 (Held: another value kept)", func(v string) bool { return v == "0" })
			bkStaysDuplicate(t, m, keys, acked, "copy while in Redis")
			waitFromArchive(t, m, keys, 20*time.Second)
			flbAllLate(t, do(), "after the commit left Redis")
			bkStaysDuplicate(t, m, keys, acked, "copy after archived")
			out := make([]engine.Outcome, len(keys))
			flbRetry(t, "mark again", func() error { return m.MarkBatch(ctx, keys, nil, out) })
			for i, o := range out {
				if o == engine.New {
					t.Errorf("key %s marked New a second time inside the archive window", keys[i])
				}
			}
		})
	}
}

// TestFLBForgetBatchMixedPaused: a ForgetBatch of keys still in Redis,
// keys only in the archive and keys never marked, with Redis paused across
// it (0.5 s, 1.5 s, 2 s; the forgetter's clock 0.5 s behind, 0.5 s or 1.5 s
// ahead; a 5 s window in Redis) while
// a second engine on the prefix marks half of the keys once the Forget
// started. A nil Forget leaves every key it did not race New; every error
// is typed; a mark acknowledged New after the Forget started stays
// Duplicate unless the Forget answered it from Redis (it removed that
// commit) or failed (a failed ForgetBatch may have removed any commit it
// read in Redis: a mark acknowledged before that read). With its deletes also held 2 s on their way, the Forget is
// refused past its LogBy, and the keys only the archive holds that no
// mark raced stay Duplicate.
func TestFLBForgetBatchMixedPaused(t *testing.T) {
	for _, c := range []struct {
		pause, skew time.Duration
	}{{500 * time.Millisecond, 500 * time.Millisecond}, {2 * time.Second, -500 * time.Millisecond}, {1500 * time.Millisecond, 1500 * time.Millisecond}} {
		t.Run(fmt.Sprintf("pause=%v,skew=%v", c.pause, c.skew), func(t *testing.T) {
			srv := redistest.Start(t)
			ctx := context.Background()
			prefix := fmt.Sprintf("flbx-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			m := ra2Open(t, flbShort(redisArchiveOptions(bkClient(t, srv), prefix, arch)))
			ra2WaitDrainer(t, m, 5*time.Second)
			fc := bkClient(t, srv)
			var slowOn atomic.Bool // on for the 2 s pause (below)
			fc.AddHook(bkSlowForget(c.pause, 1, &slowOn))
			of := redisArchiveOptions(fc, prefix, arch)
			of.Clock = bkClock{c.skew}
			f := ra2Open(t, flbShort(of))
			archived := keysOf("flbx-arch", 10)
			flbMarkNew(t, m, archived)
			waitFromArchive(t, m, archived, 20*time.Second)
			inRedis := keysOf("flbx-redis", 10)
			flbMarkNew(t, m, inRedis)
			never := keysOf("flbx-never", 10)
			keys := append(append(append([][]byte{}, archived...), inRedis...), never...)
			info := make([]engine.KeyInfo, len(keys))
			var ferr error
			var wg sync.WaitGroup
			started := time.Now()
			slowOn.Store(c.pause == 2*time.Second)
			srv.Pause()
			wg.Add(1)
			go func() {
				defer wg.Done()
				fctx, cancel := context.WithTimeout(ctx, 6*time.Second)
				defer cancel()
				ferr = f.ForgetBatch(fctx, keys, info)
			}()
			time.Sleep(c.pause)
			srv.Resume()
			// Marks racing the Forget: every other key.
			type mk struct {
				i   int
				o   engine.Outcome
				err error
				at  time.Time
			}
			var marks []mk
			var mu sync.Mutex
			for i := 0; i < len(keys); i += 2 {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					o, err := m.MarkIfAbsent(ctx, keys[i])
					mu.Lock()
					marks = append(marks, mk{i, o, err, time.Now()})
					mu.Unlock()
				}(i)
			}
			wg.Wait()
			t.Logf("forget after %v: %v", time.Since(started).Round(time.Millisecond), ferr)
			if ferr != nil && !bkTyped(ferr) {
				t.Errorf("untyped forget error: %v", ferr)
			}
			// Held 2 s on their way as well, its deletes reach Redis 2 s
			// or more after its archive read ended, past a LogBy 0.5 s
			// after it by Redis's clock.
			late := errors.Is(ferr, redis.ErrPastLogBy)
			if c.pause == 2*time.Second && !late {
				t.Errorf("a Forget stalled %v: %v, want its refusal past LogBy", c.pause, ferr)
			}
			marked := map[int]mk{}
			for _, x := range marks {
				if x.err != nil && !bkTyped(x.err) {
					t.Errorf("untyped mark error: %v", x.err)
				}
				marked[x.i] = x
			}
			verify := func(when string) {
				got := make([]engine.KeyInfo, len(keys))
				for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
					err := m.LookupBatch(ctx, keys, got)
					if err == nil {
						break
					}
					if !errors.Is(err, engine.ErrUnavailable) || time.Now().After(deadline) {
						t.Fatalf("%s: %v", when, err)
					}
				}
				for i := range keys {
					x, raced := marked[i]
					// A nil Forget says which commits it removed from
					// Redis; a failed one may have removed any commit it
					// read there (a mark acknowledged before its read),
					// as documented: a raced key is then either.
					forgotFromRedis := ferr != nil || info[i].Outcome == engine.Duplicate && info[i].Source != engine.SourceArchive
					switch {
					case raced && x.err == nil && x.o == engine.New && !forgotFromRedis && got[i].Outcome != engine.Duplicate:
						t.Errorf("%s: key %s marked New during the Forget (forget %v from %v, %v): %v from %v, want Duplicate", when, keys[i], info[i].Outcome, info[i].Source, ferr, got[i].Outcome, got[i].Source)
					case raced && x.err == nil && x.o == engine.Duplicate && ferr == nil && got[i].Outcome != engine.New:
						t.Errorf("%s: key %s Duplicate when marked during the Forget, Forget nil: %v from %v, want New", when, keys[i], got[i].Outcome, got[i].Source)
					case !raced && ferr == nil && got[i].Outcome != engine.New:
						t.Errorf("%s: key %s forgotten (nil): %v from %v, want New", when, keys[i], got[i].Outcome, got[i].Source)
					case !raced && late && i < 10 && got[i].Outcome != engine.Duplicate:
						t.Errorf("%s: key %s held by the archive only, its Forget refused past LogBy: %v from %v, want Duplicate (nothing written)", when, keys[i], got[i].Outcome, got[i].Source)
					case !raced && ferr != nil && i >= 20 && got[i].Outcome != engine.New:
						t.Errorf("%s: key %s never marked: %v from %v", when, keys[i], got[i].Outcome, got[i].Source)
					}
				}
			}
			verify("at once")
			time.Sleep(5 * time.Second)
			verify("past Redis's window")
		})
	}
}

// TestFLBCloseWhileForgetStalled: an engine's Forget of archived keys is
// stalled by a paused Redis (0.7 s, 1.5 s) and the engine is Closed
// meanwhile (5 s window in Redis); a second
// engine then marks the keys (after Redis resumes). The Forget fails with
// a typed error (or succeeds before the Close); every mark acknowledged
// New after it stays Duplicate through and past Redis's window.
func TestFLBCloseWhileForgetStalled(t *testing.T) {
	for _, pause := range []time.Duration{700 * time.Millisecond, 1500 * time.Millisecond} {
		t.Run(fmt.Sprint("pause=", pause), func(t *testing.T) { flbCloseWhileForgetStalled(t, pause) })
	}
}

func flbCloseWhileForgetStalled(t *testing.T, pause time.Duration) {
	srv := redistest.Start(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("flbc-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	m := ra2Open(t, flbShort(redisArchiveOptions(bkClient(t, srv), prefix, arch)))
	ra2WaitDrainer(t, m, 5*time.Second)
	fc := bkClient(t, srv)
	// Past a second, the Forget's deletes are held on their way for the
	// pause too: a Redis pause lands mostly in the call's reads, after
	// which its LogBy counts.
	var slowOn atomic.Bool
	slowOn.Store(pause > time.Second)
	fc.AddHook(bkSlowForget(pause, 1, &slowOn))
	f := ra2Open(t, flbShort(redisArchiveOptions(fc, prefix, arch)))
	keys := keysOf("flbc", 20)
	flbMarkNew(t, m, keys)
	waitFromArchive(t, m, keys, 20*time.Second)
	info := make([]engine.KeyInfo, len(keys))
	done := make(chan error, 1)
	srv.Pause()
	go func() { done <- f.ForgetBatch(ctx, keys, info) }()
	time.Sleep(300 * time.Millisecond)
	cerr := make(chan error, 1)
	go func() { cerr <- f.Close() }()
	time.Sleep(pause - 300*time.Millisecond)
	srv.Resume()
	ferr := <-done
	t.Logf("forget: %v; close: %v", ferr, <-cerr)
	if ferr != nil && !bkTyped(ferr) {
		t.Errorf("untyped forget error: %v", ferr)
	}
	out := make([]engine.Outcome, len(keys))
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		err := m.MarkBatch(ctx, keys, nil, out)
		if err == nil {
			break
		}
		if !bkTyped(err) || time.Now().After(deadline) {
			t.Fatalf("mark: %v", err)
		}
	}
	// Refused past its LogBy, the Forget wrote nothing for these keys
	// (each held by the archive only): every one is still a Duplicate.
	late := errors.Is(ferr, redis.ErrPastLogBy)
	if pause > time.Second && !late {
		// Its deletes reach Redis at least the pause after its archive
		// read ended, past LogBy (a second after it).
		t.Errorf("a Forget stalled %v: %v, want its refusal past LogBy", pause, ferr)
	}
	var acked [][]byte
	for i, o := range out {
		if o == engine.New {
			acked = append(acked, keys[i])
			if late {
				t.Errorf("key %s: the Forget was refused past its LogBy, then the key marked New: it removed something", keys[i])
			}
		} else if ferr == nil {
			t.Errorf("key %s: Forget returned nil, then marked %v", keys[i], o)
		}
	}
	at := time.Now()
	t.Logf("%d of %d keys New after the stalled Forget", len(acked), len(keys))
	if len(acked) == 0 {
		return
	}
	bkStaysDuplicate(t, m, acked, at, "after the stalled Forget")
	waitFromArchive(t, m, acked, 20*time.Second)
	bkStaysDuplicate(t, m, acked, at, "archived, after the stalled Forget")
}

// flbNSLateCopy: m marks keys of namespace ns, waits for the archive, f
// forgets them with its script's copy kept, m marks them again
// (acknowledged New), and once that commit left Redis the copy arrives:
// every key must stay Duplicate.
func flbNSLateCopy(t *testing.T, m, f *engine.Engine, ns string, h *bkLateForget, do func(args []any) (any, error)) {
	t.Helper()
	ctx := context.Background()
	mn, err := m.Namespace(ns)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := f.Namespace(ns)
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOf("flbns-"+ns, 12)
	mark := func() { flbMarkNew(t, mn, keys) }
	info := make([]engine.KeyInfo, len(keys))
	waitArch := func() { waitFromArchive(t, mn, keys, 20*time.Second) }
	mark()
	waitArch()
	flbForget(t, h, func() error { return fn.ForgetBatch(ctx, keys, info) })
	for i := range info {
		if info[i].Outcome != engine.Duplicate {
			t.Fatalf("forget of %s in %q found %v from %v, want Duplicate", keys[i], ns, info[i].Outcome, info[i].Source)
		}
	}
	mark()
	acked := time.Now()
	waitArch()
	flbAllLate(t, flbDeliver(t, h, do), fmt.Sprintf("namespace %q, after the commit left Redis", ns))
	bkStaysDuplicate(t, mn, keys, acked, fmt.Sprintf("namespace %q", ns))
}

// TestFLBNamespaceArchiveWindow: a Forget's late copy in a namespace with
// an archive window of its own (the forgetter 1.5 s ahead of Redis); and
// an open of the forgetter with that namespace's settings changed
// (another archive window, a Window of its own, the namespace left out):
// the prefix's binding refuses each (ErrLayout), so no engine on the
// prefix runs that namespace under other windows.
func TestFLBNamespaceArchiveWindow(t *testing.T) {
	for _, c := range []struct {
		name string
		f    engine.NamespaceOptions
	}{
		{"same", engine.NamespaceOptions{ArchiveWindow: 30 * time.Second}},
		{"other-archive-window", engine.NamespaceOptions{ArchiveWindow: 20 * time.Second}},
		{"own-window", engine.NamespaceOptions{Window: 2 * time.Second}},
		{"absent", engine.NamespaceOptions{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newFLBRig(t, "flbns")
			om := r.options(r.plain)
			om.Namespaces = map[string]engine.NamespaceOptions{"nsa": {ArchiveWindow: 30 * time.Second}}
			m := ra2Open(t, om)
			ra2WaitDrainer(t, m, 5*time.Second)
			of := r.options(r.hooked)
			of.Clock = bkClock{1500 * time.Millisecond}
			if c.f != (engine.NamespaceOptions{}) {
				of.Namespaces = map[string]engine.NamespaceOptions{"nsa": c.f}
			}
			f, err := engine.Open(&of)
			if c.name != "same" {
				if !errors.Is(err, engine.ErrLayout) {
					if f != nil {
						_ = f.Close()
					}
					t.Fatalf("open with nsa %+v: %v, want ErrLayout", c.f, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("the prefix's own options refused: %v", err)
			}
			t.Cleanup(func() { _ = f.Close() })
			flbNSLateCopy(t, m, f, "nsa", r.h, r.send)
		})
	}
}

// TestFLBMixedBatchLateCopy: one ForgetBatch of keys still in Redis, keys
// only in the archive and keys never marked, its script call kept; every
// key is then marked (acknowledged New) on a second engine, and once those
// commits left Redis the copy arrives: each key stays Duplicate (5 s window
// in Redis, the forgetter 0.5 s ahead of Redis).
func TestFLBMixedBatchLateCopy(t *testing.T) {
	r := newFLBRig(t, "flbmx")
	h := r.h
	ctx := context.Background()
	m := ra2Open(t, r.options(r.plain))
	ra2WaitDrainer(t, m, 5*time.Second)
	of := r.options(r.hooked)
	of.Clock = bkClock{500 * time.Millisecond}
	f := ra2Open(t, of)
	archived := keysOf("flbmx-arch", 8)
	flbMarkNew(t, m, archived)
	waitFromArchive(t, m, archived, 20*time.Second)
	inRedis := keysOf("flbmx-redis", 8)
	flbMarkNew(t, m, inRedis)
	keys := append(append(append([][]byte{}, archived...), inRedis...), keysOf("flbmx-never", 8)...)
	info := make([]engine.KeyInfo, len(keys))
	flbForget(t, h, func() error { return f.ForgetBatch(ctx, keys, info) })
	for i := range keys {
		want := engine.Duplicate
		if i >= 16 {
			want = engine.New
		}
		if info[i].Outcome != want {
			t.Errorf("forget of %s found %v from %v, want %v", keys[i], info[i].Outcome, info[i].Source, want)
		}
	}
	flbMarkNew(t, m, keys)
	acked := time.Now()
	waitFromArchive(t, m, keys, 20*time.Second)
	flbAllLate(t, flbDeliver(t, h, r.send), "mixed batch, after the commits left Redis")
	bkStaysDuplicate(t, m, keys, acked, "mixed batch")
}
