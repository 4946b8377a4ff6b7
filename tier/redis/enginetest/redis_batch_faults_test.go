package enginetest_test

// Tests of the Redis tier behind the engine: batch
// scripts per chunk of 256 keys on one server, per key on a Cluster;
// marks without MaxAttempts as SET NX GET per key, given back (Unmark) when
// their call fails.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// mm key states behind Redis, by index mod 6.
const (
	mmsFree = iota
	mmsHeld
	mmsCommitted
	mmsReleasedOnce
	mmsPoisoned
	mmsExpired
	mmsStates
)

func mmbatch(tag string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s-%05d", tag, i)
	}
	return keys
}

func mmstate(keys [][]byte, state int) [][]byte {
	var out [][]byte
	for i := range keys {
		if i%mmsStates == state {
			out = append(out, keys[i])
		}
	}
	return out
}

func mmclaims(t *testing.T, e *engine.Engine, keys [][]byte, want engine.Outcome) []engine.Claim {
	t.Helper()
	cl := make([]engine.Claim, len(keys))
	if len(keys) == 0 {
		return cl
	}
	if err := e.ClaimBatch(context.Background(), keys, nil, cl); err != nil {
		t.Fatal(err)
	}
	for i := range cl {
		if cl[i].Outcome != want {
			t.Fatalf("setup claim of %s = %v, want %v", keys[i], cl[i].Outcome, want)
		}
	}
	return cl
}

// mmsetupEngine leaves each key in the state of its index mod 6, made by
// the engines other (another process) and short (one whose 100 ms lease
// is left to expire).
func mmsetupEngine(t *testing.T, other, short *engine.Engine, keys [][]byte, max int) {
	t.Helper()
	ctx := context.Background()
	mmclaims(t, other, mmstate(keys, mmsHeld), engine.New)
	cl := mmclaims(t, other, mmstate(keys, mmsCommitted), engine.New)
	if err := other.CommitBatch(ctx, cl, nil); err != nil {
		t.Fatal(err)
	}
	cl = mmclaims(t, other, mmstate(keys, mmsReleasedOnce), engine.New)
	if err := other.ReleaseBatch(ctx, cl, nil); err != nil {
		t.Fatal(err)
	}
	for range max {
		cl = mmclaims(t, other, mmstate(keys, mmsPoisoned), engine.New)
		if err := other.ReleaseBatch(ctx, cl, nil); err != nil {
			t.Fatal(err)
		}
	}
	mmclaims(t, short, mmstate(keys, mmsExpired), engine.New)
	time.Sleep(150 * time.Millisecond)
}

func mmwantState(i, max int) engine.Outcome {
	switch i % mmsStates {
	case mmsHeld:
		return engine.InFlight
	case mmsCommitted:
		return engine.Duplicate
	case mmsPoisoned:
		if max > 0 {
			return engine.Poison
		}
	}
	return engine.New
}

type mmredisCfg struct {
	name   string
	client func(t *testing.T) goredis.UniversalClient
	shapes []int
}

// TestRedisEngineShapes: ClaimBatch (then CommitBatch) and
// MarkBatch of 1, 255, 256, 257 and 1000 keys in mixed states (held or
// committed by another engine, released once or MaxAttempts times, a
// lease left to expire), with and without MaxAttempts, on one server
// (with the server's scripts flushed before every call) and on a
// Cluster: each key answers by its own state, repeats follow their first
// occurrence, every New key is a Duplicate for every other engine after
// its commit, and ForgetBatch frees them all.
func TestRedisEngineShapes(t *testing.T) {
	srv := redistest.Start(t)
	single := srv.Client(t)
	cfgs := []mmredisCfg{
		{"single", func(*testing.T) goredis.UniversalClient { return single }, []int{1, 255, 256, 257, 1000}},
		{"cluster", func(t *testing.T) goredis.UniversalClient { return redistest.StartCluster(t).Client(t) }, []int{1, 257, 1000}},
	}
	ctx := context.Background()
	for _, cfg := range cfgs {
		t.Run(cfg.name, func(t *testing.T) {
			c := cfg.client(t)
			flush := func() {
				if cfg.name == "single" {
					if err := single.ScriptFlush(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			for _, max := range []int{0, 3} {
				for _, n := range cfg.shapes {
					t.Run(fmt.Sprintf("max=%d/n=%d", max, n), func(t *testing.T) {
						prefix := fmt.Sprintf("mme-%d-%d-%d:", max, n, time.Now().UnixNano())
						o := engine.Options{MaxAttempts: max, Window: time.Hour, Partition: 10 * time.Minute, NoSharedCache: true}
						a := openRedis(t, c, prefix, o)
						defer a.Close()
						b := openRedis(t, c, prefix, o)
						defer b.Close()
						so := o
						so.Lease = 100 * time.Millisecond
						short := openRedis(t, c, prefix, so)
						defer short.Close()

						keys := mmbatch("claim", n)
						mmsetupEngine(t, b, short, keys, max)
						// Repeats of a free, a committed and a held key at the end.
						batch := append(append([][]byte(nil), keys...), keys[0])
						if n > mmsCommitted {
							batch = append(batch, keys[mmsCommitted], keys[mmsHeld])
						}
						flush()
						cl := make([]engine.Claim, len(batch))
						if err := a.ClaimBatch(ctx, batch, nil, cl); err != nil {
							t.Fatal(err)
						}
						for i := range batch {
							want := mmwantState(i, max)
							switch {
							case i == n: // a repeat of a New key
								want = engine.InFlight
							case i > n && i == n+1:
								want = engine.Duplicate
							case i > n:
								want = engine.InFlight
							}
							if cl[i].Outcome != want {
								t.Fatalf("claim of %s (position %d of %d) = %v, want %v", batch[i], i, len(batch), cl[i].Outcome, want)
							}
						}
						if cl[0].Outcome == engine.New {
							flush()
							if err := a.Extend(ctx, &cl[0], time.Minute); err != nil {
								t.Fatalf("Extend: %v", err)
							}
						}
						flush()
						errs := make([]error, len(cl))
						if err := a.CommitBatch(ctx, cl, errs); err != nil {
							t.Fatalf("CommitBatch: %v %v", err, errors.Join(errs...))
						}
						flush()
						info := make([]engine.KeyInfo, n)
						if err := b.LookupBatch(ctx, keys, info); err != nil {
							t.Fatal(err)
						}
						for i := range keys {
							want := mmwantState(i, max)
							if want == engine.New {
								want = engine.Duplicate
							}
							if info[i].Outcome != want {
								t.Fatalf("other engine's lookup of %s = %+v, want %v", keys[i], info[i], want)
							}
						}

						// Marks of the same shapes over fresh keys in mixed states.
						mkeys := mmbatch("mark", n)
						mmsetupEngine(t, b, short, mkeys, max)
						mbatch := append(append([][]byte(nil), mkeys...), mkeys[0])
						flush()
						out := make([]engine.Outcome, len(mbatch))
						if err := a.MarkBatch(ctx, mbatch, nil, out); err != nil {
							t.Fatal(err)
						}
						for i := range mbatch {
							want := mmwantState(i, max)
							if i == n {
								want = engine.Duplicate
							}
							if out[i] != want {
								t.Fatalf("mark of %s (position %d of %d) = %v, want %v", mbatch[i], i, len(mbatch), out[i], want)
							}
						}
						flush()
						if err := b.MarkBatch(ctx, mkeys, nil, out[:n]); err != nil {
							t.Fatal(err)
						}
						for i := range mkeys {
							want := mmwantState(i, max)
							if want == engine.New {
								want = engine.Duplicate
							}
							if out[i] != want {
								t.Fatalf("other engine's mark of %s = %v, want %v", mkeys[i], out[i], want)
							}
						}
						// Forget everything a committed (a's memory forgets too).
						flush()
						err := a.ForgetBatch(ctx, mkeys, info)
						if n > mmsHeld && !errors.Is(err, engine.ErrInFlight) || n <= mmsHeld && err != nil {
							t.Fatalf("ForgetBatch with held keys: %v, want ErrInFlight", err)
						}
						for i := range mkeys {
							if (i%mmsStates == mmsHeld) != (info[i].Outcome == engine.InFlight) {
								t.Fatalf("ForgetBatch found %s %+v", mkeys[i], info[i])
							}
						}
						flush()
						if err := b.LookupBatch(ctx, mkeys, info); err != nil {
							t.Fatal(err)
						}
						for i := range mkeys {
							if i%mmsStates == mmsHeld {
								continue
							}
							if info[i].Outcome != engine.New {
								t.Fatalf("lookup after ForgetBatch of %s = %+v, want New", mkeys[i], info[i])
							}
						}
					})
				}
			}
		})
	}
}

// mmpartial is a go-redis hook that, armed, makes the next pipeline
// whose first command is named cmd (after skipping skip such pipelines)
// run only its first apply commands on the server, then fail every
// command as a dropped connection would (apply < 0: run them all and lose
// every reply).
type mmpartial struct {
	armed atomic.Bool
	cmd   string
	skip  atomic.Int32
	apply int
	hits  atomic.Int32
	min   int // fault only pipelines of at least min commands
}

func (h *mmpartial) arm(cmd string, skip int32, apply int) {
	h.cmd, h.apply = cmd, apply
	h.skip.Store(skip)
	h.armed.Store(true)
}

func (h *mmpartial) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (h *mmpartial) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }

var errMmDropped = errors.New("connection reset (batch)")

func (h *mmpartial) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if !h.armed.Load() || len(cmds) == 0 || len(cmds) < h.min || cmds[0].Name() != h.cmd || logTrim(cmds) {
			return next(ctx, cmds)
		}
		if h.skip.Add(-1) >= 0 {
			return next(ctx, cmds)
		}
		if !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		h.hits.Add(1)
		run := cmds
		if h.apply >= 0 && h.apply < len(cmds) {
			run = cmds[:h.apply]
		}
		if len(run) > 0 {
			_ = next(ctx, run)
		}
		for _, c := range cmds {
			c.SetErr(errMmDropped)
		}
		return errMmDropped
	}
}

// logTrim reports whether cmds is one of the drain's own scripts, which
// may go through a faulted client too and for which no fault is meant:
// the trim of an archive log (one script call whose second key is the
// log's trim mark, Prefix ‖ NUL ‖ 0xff ‖ "trimmed") or the drain lease's
// renewal (one script call whose key is Prefix ‖ NUL ‖ 0xff ‖ "drain").
func logTrim(cmds []goredis.Cmder) bool {
	if len(cmds) != 1 {
		return false
	}
	args := cmds[0].Args()
	if len(args) < 4 {
		return false
	}
	if key, _ := args[3].(string); len(args) == 4+2 && strings.HasSuffix(key, "\x00\xffdrain") {
		return true
	}
	if len(args) < 5 {
		return false
	}
	key, _ := args[4].(string)
	return strings.HasSuffix(key, "\x00\xfftrimmed")
}

// settled checks a MarkBatch whose SET NX replies were lost (some
// applied, or all, or none): it answers New for each fresh key and
// Duplicate for each fourth (acknowledged before by the other engine),
// and the other engine finds every key marked.
func settled(t *testing.T, ctx context.Context, err error, other *engine.Engine, keys [][]byte, out []engine.Outcome) {
	t.Helper()
	if err != nil {
		t.Fatalf("MarkBatch through a dropped connection: %v, want its lost replies settled", err)
	}
	for i := range keys {
		want := engine.New
		if i%4 == 0 {
			want = engine.Duplicate
		}
		if out[i] != want {
			t.Fatalf("mark of %s through a dropped connection: %v, want %v", keys[i], out[i], want)
		}
	}
	info := make([]engine.KeyInfo, len(keys))
	if err := other.LookupBatch(ctx, keys, info); err != nil {
		t.Fatal(err)
	}
	for i := range info {
		if info[i].Outcome != engine.Duplicate {
			t.Fatalf("the other engine's lookup of %s after the settled mark: %v, want Duplicate", keys[i], info[i].Outcome)
		}
	}
}

// TestRedisFailedMarkGivesBack: a MarkBatch whose SET NX pipeline the
// server applied in part, whole or not at all, its replies lost, settles
// them in the same call (settled). One whose commit script with
// MaxAttempts the server applied only in part (the connection dropped
// after some of its chunks), or whole with every reply lost, fails with
// ErrUnavailable; afterwards no key of it stays marked or held for
// another engine (the marks are given back), the keys another engine had
// acknowledged before stay Duplicate, and the retry of the mark answers
// New for each fresh key exactly once.
func TestRedisFailedMarkGivesBack(t *testing.T) {
	srv := redistest.Start(t)
	ctx := context.Background()
	plain := srv.Client(t)
	type fault struct {
		name  string
		max   int
		cmd   string
		skip  int32
		apply int
	}
	faults := []fault{
		{"setnx-partial", 0, "set", 0, 300},
		{"setnx-lost", 0, "set", 0, -1},
		{"setnx-none", 0, "set", 0, 0},
		{"script-claim-partial", 3, "evalsha", 0, 2},
		{"script-commit-partial", 3, "evalsha", 1, 2},
		{"script-commit-lost", 3, "evalsha", 1, -1},
	}
	for _, f := range faults {
		t.Run(f.name, func(t *testing.T) {
			h := &mmpartial{}
			hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			hc.AddHook(h)
			prefix := fmt.Sprintf("mmg-%s-%d:", f.name, time.Now().UnixNano())
			o := engine.Options{MaxAttempts: f.max, Window: time.Hour, Partition: 10 * time.Minute, Lease: 2 * time.Second}
			a := openRedis(t, hc, prefix, o)
			defer a.Close()
			b := openRedis(t, plain, prefix, o)
			defer b.Close()
			const n = 1000
			keys := mmbatch("g", n)
			// b acknowledges every fourth key first.
			var acked [][]byte
			for i := 0; i < n; i += 4 {
				acked = append(acked, keys[i])
			}
			out := make([]engine.Outcome, n)
			if err := b.MarkBatch(ctx, acked, nil, out[:len(acked)]); err != nil {
				t.Fatal(err)
			}
			h.arm(f.cmd, f.skip, f.apply)
			err := a.MarkBatch(ctx, keys, nil, out)
			if h.hits.Load() != 1 {
				t.Fatalf("the fault did not fire (%d hits; MarkBatch %v)", h.hits.Load(), err)
			}
			if f.cmd == "set" {
				// A mark's SET NX whose reply was lost is settled in the
				// same call (the claim script finds what it applied, or
				// marks the key): the call answers as if the connection
				// had held, and every process agrees.
				settled(t, ctx, err, b, keys, out)
				return
			}
			if !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("MarkBatch through a dropped connection: %v, want ErrUnavailable", err)
			}
			info := make([]engine.KeyInfo, n)
			if err := b.LookupBatch(ctx, keys, info); err != nil {
				t.Fatal(err)
			}
			for i := range keys {
				want := engine.New
				if i%4 == 0 {
					want = engine.Duplicate
				}
				if f.name == "script-claim-partial" && i < f.apply*256 && want == engine.New && info[i].Outcome == engine.InFlight {
					// A claim whose reply was lost is not given back: it
					// holds the key until its lease ends, and the retry
					// of this engine finds it its own (documented).
					continue
				}
				if info[i].Outcome != want {
					t.Fatalf("after the failed mark, the other engine's lookup of %s = %+v, want %v", keys[i], info[i], want)
				}
			}
			// The other engine marks every odd key: over a fence, an undone
			// mark, a claim given back, or nothing.
			var odd [][]byte
			for i := 1; i < n; i += 2 {
				odd = append(odd, keys[i])
			}
			oddOut := make([]engine.Outcome, len(odd))
			if err := b.MarkBatch(ctx, odd, nil, oddOut); err != nil {
				t.Fatal(err)
			}
			for i, o := range oddOut {
				want := engine.New
				if f.name == "script-claim-partial" && 2*i+1 < f.apply*256 {
					want = engine.InFlight // a's claim, until its lease ends
				}
				if o != want {
					t.Fatalf("the other engine's mark of %s after the failed mark = %v, want %v", odd[i], o, want)
				}
			}
			if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
				t.Fatalf("retried MarkBatch: %v", err)
			}
			for i := range keys {
				want := engine.New
				if i%4 == 0 || i%2 == 1 && oddOut[i/2] == engine.New {
					want = engine.Duplicate
				}
				if out[i] != want {
					t.Fatalf("retried mark of %s = %v, want %v", keys[i], out[i], want)
				}
			}
			if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
				t.Fatal(err)
			}
			for i := range keys {
				if out[i] != engine.Duplicate {
					t.Fatalf("the other engine's mark of %s after the retry = %v, want Duplicate", keys[i], out[i])
				}
			}
		})
	}
}

// TestRedisKillMidBatch: a server with appendfsync always is
// killed while an engine marks (and, with MaxAttempts, claims and
// commits) batches of 257 keys; after a restart, every key a call
// acknowledged New is a Duplicate for a fresh engine, and once the lease
// has passed no key the failed calls touched is InFlight.
func TestRedisKillMidBatch(t *testing.T) {
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
			ctx := context.Background()
			prefix := fmt.Sprintf("mmk-%d:", time.Now().UnixNano())
			o := engine.Options{MaxAttempts: max, Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Second}
			c := srv.ClientWith(t, &goredis.Options{MaxRetries: 1, DialTimeout: 200 * time.Millisecond})
			a := openRedis(t, c, prefix, o)
			var mu sync.Mutex
			var ackedKeys, tried [][]byte
			stop := make(chan struct{})
			done := make(chan struct{})
			var failures atomic.Int32
			go func() {
				defer close(done)
				for r := 0; ; r++ {
					select {
					case <-stop:
						return
					default:
					}
					keys := mmbatch(fmt.Sprintf("r%d", r), 257)
					out := make([]engine.Outcome, len(keys))
					cctx, cancel := context.WithTimeout(ctx, time.Second)
					err := a.MarkBatch(cctx, keys, nil, out)
					cancel()
					mu.Lock()
					tried = append(tried, keys...)
					if err == nil {
						for i, o := range out {
							if o == engine.New {
								ackedKeys = append(ackedKeys, keys[i])
							}
						}
					} else {
						failures.Add(1)
					}
					mu.Unlock()
					if err != nil {
						time.Sleep(20 * time.Millisecond)
					}
				}
			}()
			time.Sleep(300 * time.Millisecond)
			srv.Kill()
			time.Sleep(300 * time.Millisecond)
			close(stop)
			<-done
			if failures.Load() == 0 {
				t.Fatal("no mark failed while the server was down")
			}
			srv.Restart()
			a.Close()
			mu.Lock()
			acked, all := ackedKeys, tried
			mu.Unlock()
			if len(acked) == 0 {
				t.Fatal("nothing was acknowledged before the kill")
			}
			fresh := openRedis(t, srv.Client(t), prefix, o)
			defer fresh.Close()
			info := make([]engine.KeyInfo, len(acked))
			if err := fresh.LookupBatch(ctx, acked, info); err != nil {
				t.Fatal(err)
			}
			for i := range acked {
				if info[i].Outcome != engine.Duplicate {
					t.Fatalf("acknowledged key %s after the restart = %+v, want Duplicate", acked[i], info[i])
				}
			}
			time.Sleep(1100 * time.Millisecond) // the lease (and a fence's life)
			info = make([]engine.KeyInfo, len(all))
			if err := fresh.LookupBatch(ctx, all, info); err != nil {
				t.Fatal(err)
			}
			for i := range all {
				if info[i].Outcome == engine.InFlight {
					t.Fatalf("key %s still InFlight after the lease", all[i])
				}
			}
			out := make([]engine.Outcome, len(all))
			if err := fresh.MarkBatch(ctx, all, nil, out); err != nil {
				t.Fatal(err)
			}
			for i := range all {
				if out[i] != engine.New && out[i] != engine.Duplicate {
					t.Fatalf("mark of %s after the lease = %v", all[i], out[i])
				}
			}
			t.Logf("%d keys acknowledged, %d tried, %d failed calls", len(acked), len(all), failures.Load())
		})
	}
}

// TestRedisPausedMark: a MarkBatch of 600 keys sent to a paused
// server returns by its deadline; once the server resumes (the mark and
// its give-back both land, in either order), no key is left marked for
// another engine: without MaxAttempts every key is New for it at once
// (the give-back undid or fenced each mark), with MaxAttempts once the
// lease has ended (a claim whose reply was lost is not given back). The
// first engine's retry then answers Duplicate for what the other marked.
func TestRedisPausedMark(t *testing.T) {
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			srv := redistest.Start(t)
			ctx := context.Background()
			prefix := fmt.Sprintf("mmp-%d:", time.Now().UnixNano())
			o := engine.Options{MaxAttempts: max, Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Second}
			a := openRedis(t, srv.Client(t), prefix, o)
			b := openRedis(t, srv.Client(t), prefix, o)
			defer b.Close()
			keys := mmbatch("p", 600)
			out := make([]engine.Outcome, len(keys))
			srv.Pause()
			dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			start := time.Now()
			err := a.MarkBatch(dctx, keys, nil, out)
			cancel()
			took := time.Since(start)
			srv.Resume()
			if err == nil {
				t.Fatal("MarkBatch against a paused server succeeded")
			}
			if !errors.Is(err, engine.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("MarkBatch against a paused server: %v", err)
			}
			if took > 2*time.Second {
				t.Fatalf("MarkBatch against a paused server took %v", took)
			}
			a.Close() // waits for the late pipelines
			if max > 0 {
				time.Sleep(1100 * time.Millisecond)
			}
			info := make([]engine.KeyInfo, len(keys))
			if err := b.LookupBatch(ctx, keys, info); err != nil {
				t.Fatal(err)
			}
			for i := range keys {
				if info[i].Outcome != engine.New {
					t.Fatalf("after the failed mark and the resume, %s = %+v, want New", keys[i], info[i])
				}
			}
			if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
				t.Fatal(err)
			}
			for i := range keys {
				if out[i] != engine.New {
					t.Fatalf("other engine's mark of %s = %v, want New", keys[i], out[i])
				}
			}
		})
	}
}

// TestRedisArchiveGiveBack: behind Redis with an archive, marks are
// one script call per chunk of 256 keys that commits each free key and
// appends the call's commits to the archive log (markLogScript). A
// MarkBatch of 600 keys whose mark pipeline the server applied whole, or
// one chunk of, with every reply lost, settles the lost replies through
// the claim script: every key is New, and after Redis's window Duplicate
// from the archive. When the settling pipeline is lost too, the call
// fails and is given back: each applied commit is undone and its removal
// logged after it. Once Redis's window has passed (the keys a MarkBatch
// acknowledged answer Duplicate from the archive), the given back keys
// are New for another engine, not Duplicate from the archive.
func TestRedisArchiveGiveBack(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	for _, apply := range []int{-1, 1} {
		t.Run(fmt.Sprint("apply=", apply), func(t *testing.T) {
			t.Parallel()
			h, settle := &mmpartial{min: 3}, &mmpartial{}
			hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			hc.AddHook(h)
			hc.AddHook(settle)
			prefix := fmt.Sprintf("mmar-%d:", time.Now().UnixNano())
			arch := redisArchive(t)
			a := open(t, redisArchiveOptions(hc, prefix, arch))
			defer a.Close()
			b := open(t, redisArchiveOptions(plain, prefix, arch))
			defer b.Close()
			acked, lost, settled := keysOf("acked", 600), keysOf("lost", 600), keysOf("settled", 600)
			out := make([]engine.Outcome, 600)
			if err := a.MarkBatch(ctx, acked, nil, out); err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				if o != engine.New {
					t.Fatalf("mark of fresh key %d = %v", i, o)
				}
			}
			// The mark's replies lost: settled.
			h.arm("evalsha", 0, apply)
			if err := a.MarkBatch(ctx, settled, nil, out); err != nil || h.hits.Load() != 1 {
				t.Fatalf("MarkBatch with the mark replies lost: %v (fault hits %d), want them settled", err, h.hits.Load())
			}
			for i, o := range out {
				if o != engine.New {
					t.Fatalf("settled mark of fresh key %d = %v", i, o)
				}
			}
			acked = append(acked, settled...)
			// The mark's replies and the settling script's lost: given back.
			h.arm("evalsha", 0, apply)
			settle.arm("evalsha", 1, 0)
			err := a.MarkBatch(ctx, lost, nil, out)
			if h.hits.Load() != 2 || settle.hits.Load() != 1 || !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("MarkBatch with the mark and settling replies lost: %v (fault hits %d, %d)", err, h.hits.Load(), settle.hits.Load())
			}
			info := make([]engine.KeyInfo, 600)
			if err := b.LookupBatch(ctx, lost, info); err != nil {
				t.Fatal(err)
			}
			for i := range info {
				if info[i].Outcome != engine.New {
					t.Fatalf("given-back key %s before the window passed = %+v, want New", lost[i], info[i])
				}
			}
			waitFromArchive(t, b, acked, 20*time.Second)
			if err := b.LookupBatch(ctx, lost, info); err != nil {
				t.Fatal(err)
			}
			for i := range info {
				if info[i].Outcome != engine.New {
					t.Fatalf("given-back key %s after the window passed = %+v, want New", lost[i], info[i])
				}
			}
			if err := b.MarkBatch(ctx, lost, nil, out); err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				if o != engine.New {
					t.Fatalf("other engine's mark of given-back key %s = %v, want New", lost[i], o)
				}
			}
		})
	}
}

// mmproxy forwards loopback TCP to a Redis server. Armed, it forwards
// the next request that contains match to the server, swallows the reply
// and drops the connection: the server applied the request, its caller
// never learnt it, and go-redis retries the pipeline on a new connection.
type mmproxy struct {
	addr    string
	match   atomic.Value // string
	armed   atomic.Bool
	dropped atomic.Int32
}

func mmstartProxy(t *testing.T, target string) *mmproxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	p := &mmproxy{addr: l.Addr().String()}
	p.match.Store("")
	go func() {
		for {
			cc, err := l.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", target)
			if err != nil {
				cc.Close()
				continue
			}
			var drop atomic.Bool
			go func() {
				defer sc.Close()
				buf := make([]byte, 256<<10)
				for {
					n, err := cc.Read(buf)
					if n > 0 {
						m, _ := p.match.Load().(string)
						if m != "" && strings.Contains(strings.ToLower(string(buf[:n])), m) && p.armed.CompareAndSwap(true, false) {
							drop.Store(true)
						}
						if _, werr := sc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
			go func() {
				defer cc.Close()
				defer sc.Close()
				buf := make([]byte, 256<<10)
				for {
					n, err := sc.Read(buf)
					if n > 0 && drop.Load() {
						time.Sleep(20 * time.Millisecond) // let the server finish the request
						p.dropped.Add(1)
						return
					}
					if n > 0 {
						if _, werr := cc.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

// TestRedisMarkReplyLostRetried: the reply to a MarkBatch's
// pipeline (SET NX GET per key without MaxAttempts; the claim script,
// then the commit script, with it) is lost after the server applied it,
// and go-redis retries the pipeline on a new connection inside the same
// call. The caller's first mark of each key must be New ("never drops a
// new message"), as a retried claim is its own (TestRetriedClaimIsOwnClaim);
// a Duplicate here is a message no one processes.
func TestRedisMarkReplyLostRetried(t *testing.T) {
	for _, tc := range []struct {
		name  string
		max   int
		match string
	}{
		{"max=0/setnx", 0, "\r\nnx\r\n"},
		{"max=3/claim-script", 3, "evalsha"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			p := mmstartProxy(t, srv.Addr)
			c := goredis.NewClient(&goredis.Options{Addr: p.addr, MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond})
			defer c.Close()
			ctx := context.Background()
			prefix := fmt.Sprintf("mmrl-%d:", time.Now().UnixNano())
			o := engine.Options{MaxAttempts: tc.max, Window: time.Hour, Partition: 10 * time.Minute}
			a := openRedis(t, c, prefix, o)
			defer a.Close()
			for _, n := range []int{1, 300} {
				keys := mmbatch(fmt.Sprint("rl", n), n)
				out := make([]engine.Outcome, n)
				before := p.dropped.Load()
				p.match.Store(tc.match)
				p.armed.Store(true)
				err := a.MarkBatch(ctx, keys, nil, out)
				p.armed.Store(false)
				if p.dropped.Load() != before+1 {
					t.Fatalf("n=%d: the proxy dropped %d replies, want 1: no retry was exercised (MarkBatch %v)", n, p.dropped.Load()-before, err)
				}
				if err != nil {
					t.Fatalf("n=%d: MarkBatch with one lost reply, retried by the client: %v", n, err)
				}
				var notNew []string
				for i := range keys {
					if out[i] != engine.New {
						notNew = append(notNew, fmt.Sprintf("%s=%v", keys[i], out[i]))
					}
				}
				if len(notNew) > 0 {
					t.Errorf("n=%d: %d of %d fresh keys, whose mark pipeline's reply was lost and retried by the client, not New (want New): first %v", n, len(notNew), n, notNew[0])
					continue
				}
				b := openRedis(t, srv.Client(t), prefix, o)
				if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
					t.Fatal(err)
				}
				b.Close()
				for i := range keys {
					if out[i] != engine.Duplicate {
						t.Fatalf("n=%d: other engine's mark of %s = %v, want Duplicate", n, keys[i], out[i])
					}
				}
			}
		})
	}
}

// holdHook holds each pipeline that take accepts for delay before
// sending it, as a paused connection would; held counts them.
type holdHook struct {
	delay time.Duration
	take  func(cmds []goredis.Cmder) bool
	held  atomic.Int64
}

func (h *holdHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *holdHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *holdHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && h.take(cmds) {
			h.held.Add(1)
			time.Sleep(h.delay)
		}
		return next(ctx, cmds)
	}
}

// TestRedisArchiveLateMark: behind Redis with an archive a mark reads
// the archive first and may commit only until LogBy, half of
// tier.LogSkew after that read (a commit that left Redis's window later
// may not be in what the read saw). A mark pipeline held longer than
// that on its way writes nothing: MarkBatch fails (ErrUnavailable), the
// keys are New for another engine, and the log holds none of them. The
// next MarkBatch of the same keys is New.
func TestRedisArchiveLateMark(t *testing.T) {
	srv := redistest.Start(t)
	plain := srv.Client(t)
	ctx := context.Background()
	// Once armed, the next pipeline of at least three EVALSHAs (a mark's
	// chunks) is held.
	var armed atomic.Bool
	h := &holdHook{delay: tier.LogSkew/2 + 300*time.Millisecond, take: func(cmds []goredis.Cmder) bool {
		return len(cmds) >= 3 && cmds[0].Name() == "evalsha" && armed.CompareAndSwap(true, false)
	}}
	hc := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	hc.AddHook(h)
	prefix := fmt.Sprintf("late-%d:", time.Now().UnixNano())
	arch := redisArchive(t)
	a := open(t, redisArchiveOptions(hc, prefix, arch))
	defer a.Close()
	b := open(t, redisArchiveOptions(plain, prefix, arch))
	defer b.Close()
	keys := keysOf("late", 600)
	out := make([]engine.Outcome, len(keys))
	before, err := plain.XLen(ctx, prefix+"\x00\x00").Result()
	if err != nil && !errors.Is(err, goredis.Nil) {
		t.Fatal(err)
	}
	armed.Store(true)
	if err := a.MarkBatch(ctx, keys, nil, out); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("a mark held %v on its way: %v, want ErrUnavailable", h.delay, err)
	}
	info := make([]engine.KeyInfo, len(keys))
	if err := b.LookupBatch(ctx, keys, info); err != nil {
		t.Fatal(err)
	}
	for i := range info {
		if info[i].Outcome != engine.New {
			t.Fatalf("key %s after the late mark = %+v, want New", keys[i], info[i])
		}
	}
	msgs, err := plain.XRange(ctx, prefix+"\x00\x00", "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if c, ok := m.Values["c"].(string); ok && strings.Contains(c, "late-") {
			t.Fatalf("the log holds a commit of the late mark: entry %s (%d entries before)", m.ID, before)
		}
	}
	if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("the next mark of %s = %v, want New", keys[i], o)
		}
	}
}
