package redis_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// afterSetHook applies the first pipeline starting with a SET (a mark's
// SET NX), runs fn, then loses the pipeline's replies: the store settles
// the marks through the claim script after fn's calls. With hold it
// sends nothing and keeps the commands in held instead: their messages
// reach the server late, when the test sends them (lateSETs).
type afterSetHook struct {
	mu    sync.Mutex
	armed bool
	fn    func()
	hold  bool
	held  [][]any
}

func (h *afterSetHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *afterSetHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *afterSetHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		h.mu.Lock()
		fire := h.armed && len(cmds) > 0 && cmds[0].Name() == "set"
		if fire {
			h.armed = false
		}
		fn := h.fn
		h.mu.Unlock()
		if !fire {
			return next(ctx, cmds)
		}
		if h.hold {
			h.mu.Lock()
			for _, c := range cmds {
				h.held = append(h.held, c.Args())
			}
			h.mu.Unlock()
		} else {
			_ = next(ctx, cmds)
		}
		fn()
		for _, c := range cmds {
			c.SetErr(errLost)
		}
		return errLost
	}
}

// settleEngines opens n engines on one prefix of a server of their own
// (NoSharedCache, for Forget); the first's client carries the returned
// hook and never resends a command itself.
func settleEngines(t *testing.T, n int) (*afterSetHook, []*engine.Engine) {
	_, h, es := settleServer(t, n)
	return h, es
}

// settleServer is settleEngines, with their server.
func settleServer(t *testing.T, n int) (*redistest.Server, *afterSetHook, []*engine.Engine) {
	srv := redistest.Start(t)
	prefix := fmt.Sprintf("settle-%d:", time.Now().UnixNano())
	h := &afterSetHook{}
	es := make([]*engine.Engine, n)
	for i := range es {
		c := srv.Client(t)
		if i == 0 {
			c = srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
			c.AddHook(h)
		}
		e, err := engine.Open(&engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, NoSharedCache: true, Logger: quietEngine,
			Backend: redis.NewBackend(c, redis.Config{Prefix: prefix})})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		es[i] = e
	}
	return srv, h, es
}

func (h *afterSetHook) arm(fn func()) {
	h.mu.Lock()
	h.armed, h.fn = true, fn
	h.mu.Unlock()
}

// TestMarkSettlesForgetsBetween: a's MarkBatch (keys k0, k0 repeated
// with another digest, k1, k2) is applied and its replies lost; before
// the settling script, b forgets k0 and k1, c marks k0 (New) and claims
// and releases k1, and b forgets k2 twice with c's mark between. a's
// batch must answer k0 New (its commit came first), its repeat Conflict,
// k1 New, k2 New; c's commit of k0 and k2 stays, k1 is free.
func TestMarkSettlesForgetsBetween(t *testing.T) {
	h, es := settleEngines(t, 3)
	a, b, c := es[0], es[1], es[2]
	ctx := context.Background()
	k0, k1, k2 := []byte("k0"), []byte("k1"), []byte("k2")
	var cNew0, cNew2 engine.Outcome
	h.arm(func() {
		info := make([]engine.KeyInfo, 2)
		if err := b.ForgetBatch(ctx, [][]byte{k0, k1}, info); err != nil {
			t.Errorf("forget: %v", err)
		}
		t.Logf("b's forget of k0, k1: %v %v", info[0].Outcome, info[1].Outcome)
		var err error
		if cNew0, err = c.MarkIfAbsent(ctx, k0); err != nil {
			t.Errorf("c's mark: %v", err)
		}
		cl, err := c.Claim(ctx, k1)
		if err != nil || cl.Outcome != engine.New {
			t.Errorf("c's claim of k1: %v %v", cl.Outcome, err)
		} else if err := c.Release(ctx, cl); err != nil {
			t.Errorf("c's release: %v", err)
		}
		if _, err := b.Forget(ctx, k2); err != nil {
			t.Errorf("forget k2: %v", err)
		}
		if o, err := c.MarkIfAbsent(ctx, k2); err != nil || o != engine.New {
			t.Errorf("c's mark of k2: %v %v", o, err)
		}
		if _, err := b.Forget(ctx, k2); err != nil {
			t.Errorf("forget k2 again: %v", err)
		}
		if cNew2, err = c.MarkIfAbsent(ctx, k2); err != nil {
			t.Errorf("c's second mark of k2: %v", err)
		}
	})
	keys := [][]byte{k0, k0, k1, k2}
	digests := []engine.Digest{{1}, {2}, {3}, {4}}
	out := make([]engine.Outcome, len(keys))
	if err := a.MarkBatch(ctx, keys, digests, out); err != nil {
		t.Fatalf("a's batch: %v", err)
	}
	t.Logf("a's batch: %v; c's marks of k0, k2 (second): %v %v", out, cNew0, cNew2)
	want := []engine.Outcome{engine.New, engine.Conflict, engine.New, engine.New}
	for i := range want {
		if out[i] != want[i] {
			t.Errorf("a's batch[%d] (%s) = %v, want %v", i, keys[i], out[i], want[i])
		}
	}
	if cNew0 != engine.New || cNew2 != engine.New {
		t.Errorf("c's marks after the Forgets: %v %v, want New", cNew0, cNew2)
	}
	info := make([]engine.KeyInfo, 3)
	if err := b.LookupBatch(ctx, [][]byte{k0, k1, k2}, info); err != nil {
		t.Fatal(err)
	}
	if info[0].Outcome != engine.Duplicate || info[1].Outcome != engine.New || info[2].Outcome != engine.Duplicate {
		t.Errorf("after: k0 %v, k1 %v, k2 %v; want Duplicate (c's commit), New (forgotten, released), Duplicate (c's)", info[0].Outcome, info[1].Outcome, info[2].Outcome)
	}
}

// TestMarkDeadlineBeforeSettle: a's mark is applied and its reply
// lost; the call's deadline ends before the settling script. The call
// must fail with an error matching ErrUnavailable (or the context's), and
// whatever it left must not make the key Duplicate for the message's
// redelivery (to a or to b), since nobody was told New.
func TestMarkDeadlineBeforeSettle(t *testing.T) {
	h, es := settleEngines(t, 2)
	a, b := es[0], es[1]
	for _, who := range []string{"b", "a"} {
		key := []byte("deadline-" + who)
		h.arm(func() { time.Sleep(150 * time.Millisecond) })
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		o, err := a.MarkIfAbsent(ctx, key)
		cancel()
		t.Logf("a's mark, deadline ended before the settle: %v, %v", o, err)
		if err == nil {
			continue
		}
		if !errors.Is(err, engine.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("error %v matches neither ErrUnavailable nor the context's", err)
		}
		e := b
		if who == "a" {
			e = a
		}
		o2, err := e.MarkIfAbsent(context.Background(), key)
		if err != nil || o2 != engine.New {
			t.Errorf("redelivery to %s: %v %v, want New (a's call failed, nobody was told New)", who, o2, err)
		}
	}
}
