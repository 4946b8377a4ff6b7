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

// TestAdversarialWaitReplicasClientRetry: WaitReplicas beside go-redis's
// own retries. The replica is stopped (SIGSTOP: still "online" for the
// master), the client's ReadTimeout (150 ms) is shorter than WaitTimeout
// (1 s). A mark's first copy is applied on the master and its WAIT blocks;
// the read times out and go-redis sends the pipeline again on a new
// connection, where the mark finds its own commit (no write) and WAIT
// has nothing of that connection's to wait for. Whatever MarkBatch
// answers, a key it acknowledged New must be on the replica: the master
// is SIGKILLed, the replica promoted, and every acknowledged key must be
// Duplicate there.
func TestAdversarialWaitReplicasClientRetry(t *testing.T) {
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			master := redistest.Start(t)
			replica := redistest.StartReplica(t, master)
			replica.WaitSynced(t)
			prefix := fmt.Sprintf("advw-%d:", time.Now().UnixNano())
			opts := func(c goredis.UniversalClient, wait int) *engine.Options {
				return &engine.Options{Window: time.Hour, Partition: 10 * time.Minute, MaxAttempts: max, Logger: quietEngine,
					Backend: redis.NewBackend(c, redis.Config{Prefix: prefix, WaitReplicas: wait, WaitTimeout: time.Second})}
			}
			c := master.ClientWith(t, &goredis.Options{ReadTimeout: 150 * time.Millisecond, MaxRetries: 3})
			e, err := engine.Open(opts(c, 1))
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ctx := context.Background()
			keys := make([][]byte, 100)
			for i := range keys {
				keys[i] = fmt.Appendf(nil, "k-%d", i)
			}
			replica.Pause()
			resumed := false
			defer func() {
				if !resumed {
					replica.Resume()
				}
			}()
			out := make([]engine.Outcome, len(keys))
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err = e.MarkBatch(cctx, keys, nil, out)
			cancel()
			var acked [][]byte
			if err == nil {
				for i, o := range out {
					if o == engine.New {
						acked = append(acked, keys[i])
					}
				}
			}
			t.Logf("MarkBatch with the replica stopped: err=%v, %d keys acknowledged New", err, len(acked))
			master.Kill()
			replica.Resume()
			resumed = true
			rc := replica.Client(t)
			if err := rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Fatal(err)
			}
			promoted, err := engine.Open(opts(rc, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer promoted.Close()
			if len(acked) == 0 {
				if !errors.Is(err, engine.ErrUnavailable) && err != nil {
					t.Fatalf("MarkBatch: %v", err)
				}
				return
			}
			info := make([]engine.KeyInfo, len(acked))
			if err := promoted.LookupBatch(ctx, acked, info); err != nil {
				t.Fatal(err)
			}
			lost := 0
			for _, in := range info {
				if in.Outcome != engine.Duplicate {
					lost++
				}
			}
			if lost > 0 {
				t.Fatalf("WaitReplicas 1, replica stopped: MarkBatch acknowledged %d keys New; after the failover %d of them are New again (never replicated)", len(acked), lost)
			}
		})
	}
}

// stepHook is a go-redis hook driven by a queue of steps, one per
// pipeline (a new connection's handshake passes): "pass"; "lose" (sent,
// applied, the reply lost); "hold" (not sent, failed at once; sent by
// deliver); "twice" (sent, applied, reply lost, then between fires and
// the pipeline is sent again, as go-redis retries it: the caller reads
// the second copy's replies); "late-first" (the first copy held, the
// second sent; deliver sends the first). An empty queue passes.
type stepHook struct {
	mu      sync.Mutex
	steps   []string
	held    []heldPipe
	names   []string
	between func()
}

type heldPipe struct {
	cmds []goredis.Cmder
	next goredis.ProcessPipelineHook
}

func (h *stepHook) DialHook(next goredis.DialHook) goredis.DialHook          { return next }
func (h *stepHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook { return next }
func (h *stepHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) == 0 || cmds[0].Name() == "client" || cmds[0].Name() == "hello" {
			return next(ctx, cmds)
		}
		h.mu.Lock()
		step := "pass"
		if len(h.steps) > 0 {
			step, h.steps = h.steps[0], h.steps[1:]
		}
		h.names = append(h.names, fmt.Sprintf("%s:%s×%d", step, cmds[0].Name(), len(cmds)))
		between := h.between
		h.mu.Unlock()
		switch step {
		case "lose":
			_ = next(ctx, cmds)
		case "hold":
			h.mu.Lock()
			h.held = append(h.held, heldPipe{copyCmds(cmds), next})
			h.mu.Unlock()
		case "twice":
			_ = next(ctx, copyCmds(cmds))
			if between != nil {
				between()
			}
			return next(ctx, cmds)
		case "late-first":
			h.mu.Lock()
			h.held = append(h.held, heldPipe{copyCmds(cmds), next})
			h.mu.Unlock()
			return next(ctx, cmds)
		default:
			return next(ctx, cmds)
		}
		for _, c := range cmds {
			c.SetErr(errLost)
		}
		return errLost
	}
}

// copyCmds makes fresh commands of cmds' arguments (a copy sent apart
// from the caller's, whose replies the caller never reads).
func copyCmds(cmds []goredis.Cmder) []goredis.Cmder {
	out := make([]goredis.Cmder, len(cmds))
	for i, c := range cmds {
		out[i] = goredis.NewCmd(context.Background(), c.Args()...)
	}
	return out
}

func (h *stepHook) push(steps ...string) {
	h.mu.Lock()
	h.steps = append(h.steps, steps...)
	h.mu.Unlock()
}

// deliver sends the held pipelines, in the order given by idx (indices
// into the held list), and returns how many there were.
func (h *stepHook) deliver(idx ...int) int {
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	if idx == nil {
		for i := range held {
			idx = append(idx, i)
		}
	}
	for _, i := range idx {
		_ = held[i].next(context.Background(), held[i].cmds)
	}
	return len(held)
}

func (h *stepHook) log() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.names...)
}

func advKeys(tag string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "%s-%d", tag, i)
	}
	return keys
}

// advEngines opens a (through a client with h) and b (a plain client)
// on one prefix.
func advEngines(t *testing.T, srv *redistest.Server, h *stepHook, o engine.Options) (a, b *engine.Engine) {
	t.Helper()
	prefix := fmt.Sprintf("adv-%d:", time.Now().UnixNano())
	c := srv.ClientWith(t, &goredis.Options{MaxRetries: -1})
	c.AddHook(h)
	o.Logger = quietEngine
	o.Backend = redis.NewBackend(c, redis.Config{Prefix: prefix})
	a, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	o.Backend = redis.NewBackend(srv.Client(t), redis.Config{Prefix: prefix})
	b, err = engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return a, b
}

// advLookup answers keys through a new engine on the same prefix as
// e's options (nothing cached).
func advLookup(t *testing.T, srv *redistest.Server, o engine.Options, prefix string, keys [][]byte) []engine.Outcome {
	t.Helper()
	o.Logger = quietEngine
	o.Backend = redis.NewBackend(srv.Client(t), redis.Config{Prefix: prefix})
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	info := make([]engine.KeyInfo, len(keys))
	if err := e.LookupBatch(context.Background(), keys, info); err != nil {
		t.Fatal(err)
	}
	out := make([]engine.Outcome, len(keys))
	for i := range info {
		out[i] = info[i].Outcome
	}
	return out
}

func countNot(out []engine.Outcome, want engine.Outcome) int {
	n := 0
	for _, o := range out {
		if o != want {
			n++
		}
	}
	return n
}

// TestAdversarialTwoLostRetriesLateGiveBacks: adoption (tier.Request.Earlier) with two engine-level
// retries. Call 1's mark is applied and its reply lost, its give-back
// held; call 2 (a retry naming call 1's token) adopts the mark and its
// reply is lost too, its give-back held; call 3 is acknowledged New. Both
// late give-backs then arrive (in each order): every key call 3
// acknowledged stays Duplicate for another engine.
func TestAdversarialTwoLostRetriesLateGiveBacks(t *testing.T) {
	srv := redistest.Start(t)
	for _, max := range []int{0, 3} {
		for _, order := range [][]int{{0, 1}, {1, 0}} {
			t.Run(fmt.Sprintf("max=%d/order=%v", max, order), func(t *testing.T) {
				h := &stepHook{}
				a, b := advEngines(t, srv, h, engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, MaxAttempts: max})
				ctx := context.Background()
				keys := advKeys("order", 200)
				out := make([]engine.Outcome, len(keys))
				if max == 0 {
					h.push("lose", "lose", "hold") // mark (SET NX) applied, reply lost; the settling script's reply lost too; give-back held
				} else {
					h.push("pass", "lose", "hold") // claim; commit applied, reply lost; give-back held
				}
				if err := a.MarkBatch(ctx, keys, nil, out); !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("call 1: %v (%v)", err, h.log())
				}
				if max == 0 {
					h.push("pass", "lose", "hold") // SET NX finds the earlier mark; the adopting script applied, reply lost; give-back held
				} else {
					h.push("pass", "lose", "hold") // claim adopts the commit; commit's reply lost; give-back held
				}
				if err := a.MarkBatch(ctx, keys, nil, out); !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("call 2: %v (%v)", err, h.log())
				}
				if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
					t.Fatalf("call 3: %v (%v)", err, h.log())
				}
				if n := countNot(out, engine.New); n > 0 {
					t.Fatalf("call 3: %d keys not New (its own lost marks), %v (%v)", n, out[:3], h.log())
				}
				if n := h.deliver(order...); n != 2 {
					t.Fatalf("%d give-backs held, want 2 (%v)", n, h.log())
				}
				if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
					t.Fatal(err)
				}
				if n := countNot(out, engine.Duplicate); n > 0 {
					t.Fatalf("%d of %d keys acknowledged New by call 3 are New again for another engine after the two late give-backs (pipelines: %v)", n, len(keys), h.log())
				}
			})
		}
	}
}

// TestAdversarialClaimAdoptsLostMark: adoption across call kinds. A MarkBatch is
// applied and its reply lost, its give-back held; the consumer's retry is
// a ClaimBatch (a Do-style consumer), which adopts the commit (New).
// commit: the claims are committed (acknowledged), the late give-back
// arrives, the keys must stay Duplicate. release: the handler fails, the
// claims are released (the adopted commit is undone), another engine
// marks the keys (acknowledged New), then the late give-back arrives:
// those keys must stay Duplicate.
func TestAdversarialClaimAdoptsLostMark(t *testing.T) {
	srv := redistest.Start(t)
	for _, max := range []int{0, 3} {
		for _, end := range []string{"commit", "release"} {
			t.Run(fmt.Sprintf("max=%d/%s", max, end), func(t *testing.T) {
				h := &stepHook{}
				a, b := advEngines(t, srv, h, engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, MaxAttempts: max})
				ctx := context.Background()
				keys := advKeys("pay", 150)
				out := make([]engine.Outcome, len(keys))
				if max == 0 {
					h.push("lose", "hold")
				} else {
					h.push("pass", "lose", "hold")
				}
				if err := a.MarkBatch(ctx, keys, nil, out); !errors.Is(err, engine.ErrUnavailable) {
					t.Fatalf("mark: %v (%v)", err, h.log())
				}
				claims := make([]engine.Claim, len(keys))
				if err := a.ClaimBatch(ctx, keys, nil, claims); err != nil {
					t.Fatal(err)
				}
				for i := range claims {
					if claims[i].Outcome != engine.New {
						t.Fatalf("claim retrying the lost mark of %s: %v, want New (%v)", keys[i], claims[i].Outcome, h.log())
					}
				}
				acked := keys
				if end == "commit" {
					if err := a.CommitBatch(ctx, claims, nil); err != nil {
						t.Fatal(err)
					}
				} else {
					if err := a.ReleaseBatch(ctx, claims, nil); err != nil {
						t.Fatal(err)
					}
					if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
						t.Fatal(err)
					}
					if n := countNot(out, engine.New); n > 0 {
						t.Fatalf("after the release, %d keys not New for another engine", n)
					}
				}
				if n := h.deliver(); n != 1 {
					t.Fatalf("%d give-backs held, want 1 (%v)", n, h.log())
				}
				if err := b.MarkBatch(ctx, acked, nil, out); err != nil {
					t.Fatal(err)
				}
				if n := countNot(out, engine.Duplicate); n > 0 {
					t.Fatalf("%s: %d of %d acknowledged keys New again after the late give-back of the lost mark (%v)", end, n, len(acked), h.log())
				}
			})
		}
	}
}

// TestAdversarialForgetCopies: Forget's copies. A Forget's delete script is sent twice.
// twice: go-redis retries it after a lost reply (the first copy applied);
// the second copy must answer what the first removed (Duplicate: the key
// was committed), and the key is free after. late-first: the first copy
// arrives late, after the second answered and another engine marked the
// key again (acknowledged New): the late copy must not remove that mark.
// twice-mark: another engine marks the key between the two copies
// (acknowledged New): the second copy finds a value written since the
// read and keeps it, so the Forget answers InFlight (ErrInFlight: the
// answer of a copy read after the first copy's effect, which
// docs/reliability.md names), and the mark must survive.
func TestAdversarialForgetCopies(t *testing.T) {
	srv := redistest.Start(t)
	for _, max := range []int{0, 3} {
		for _, mode := range []string{"twice", "late-first", "twice-mark"} {
			t.Run(fmt.Sprintf("max=%d/%s", max, mode), func(t *testing.T) {
				h := &stepHook{}
				o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, MaxAttempts: max, NoSharedCache: true}
				a, b := advEngines(t, srv, h, o)
				ctx := context.Background()
				keys := advKeys("fk", 50)
				out := make([]engine.Outcome, len(keys))
				if err := b.MarkBatch(ctx, keys, nil, out); err != nil || countNot(out, engine.New) > 0 {
					t.Fatalf("first mark: %v %v", err, out[:2])
				}
				var remark []engine.Outcome
				mark := func() {
					remark = make([]engine.Outcome, len(keys))
					if err := b.MarkBatch(ctx, keys, nil, remark); err != nil {
						t.Errorf("mark between the copies: %v", err)
					}
				}
				step := mode
				if mode == "twice-mark" {
					step = "twice"
					h.between = mark
				}
				h.push("pass", "pass", step) // the read and the forgotten-set record pass; the forget script is sent twice
				info := make([]engine.KeyInfo, len(keys))
				err := a.ForgetBatch(ctx, keys, info)
				if mode == "twice-mark" {
					if !errors.Is(err, engine.ErrInFlight) {
						t.Fatalf("forget with a mark between its copies: %v, want ErrInFlight (%v)", err, h.log())
					}
					if remark == nil || countNot(remark, engine.New) > 0 {
						t.Fatalf("the mark between the copies: %v (pipelines %v)", remark, h.log())
					}
					if err := b.MarkBatch(ctx, keys, nil, out); err != nil || countNot(out, engine.Duplicate) > 0 {
						t.Fatalf("the mark made between the Forget's copies, after it: %v %v, want Duplicate", err, out[:2])
					}
					return
				}
				if err != nil {
					t.Fatalf("forget: %v (%v)", err, h.log())
				}
				for i := range info {
					if info[i].Outcome != engine.Duplicate {
						t.Fatalf("Forget of %s answered %v, want Duplicate (it removed a commit) (pipelines %v)", keys[i], info[i].Outcome, h.log())
					}
				}
				switch mode {
				case "twice":
					if err := b.MarkBatch(ctx, keys, nil, out); err != nil || countNot(out, engine.New) > 0 {
						t.Fatalf("after the Forget: %v %v, want New", err, out[:2])
					}
				case "late-first":
					mark()
					if remark == nil || countNot(remark, engine.New) > 0 {
						t.Fatalf("the mark after the forget: %v (pipelines %v)", remark, h.log())
					}
					if n := h.deliver(); n != 1 {
						t.Fatalf("%d held, want 1 (%v)", n, h.log())
					}
					if err := b.MarkBatch(ctx, keys, nil, out); err != nil {
						t.Fatal(err)
					}
					if n := countNot(out, engine.Duplicate); n > 0 {
						t.Fatalf("%d of %d keys marked (acknowledged New) after the Forget returned are New again after its late first copy (pipelines %v)", n, len(keys), h.log())
					}
				}
			})
		}
	}
}
