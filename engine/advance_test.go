package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestAdvance: an entity's version moves only forward: a higher version is
// New (owned: Commit stores it), the same one Duplicate, a lower one
// Stale; a released or expired New keeps the version it would have
// replaced; a held entity is InFlight; the state survives a restart and is
// shared with another process; entities are apart from the caller's claims
// of the same bytes; version 0 and the configurations that cannot compare
// versions are refused.
func TestAdvance(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{Lease: 500 * time.Millisecond, MaxAttempts: 3, NoSharedCache: cfg.shared})
			defer e.Close()
			order := []byte("order-42")
			adv := func(e *engine.Engine, v uint64, want engine.Outcome, stored uint64) engine.Claim {
				t.Helper()
				// The script's expectation for a free entity is the
				// reference model's.
				if want != engine.InFlight && want != enginetest.AdvanceOutcome(stored, v) {
					t.Fatalf("script: Advance(%d) over version %d expects %v; the model says %v", v, stored, want, enginetest.AdvanceOutcome(stored, v))
				}
				c, err := e.Advance(ctx, order, v)
				if err != nil || c.Outcome != want || c.Version != stored {
					t.Fatalf("Advance(%d) = %v (stored %d), %v; want %v (stored %d)", v, c.Outcome, c.Version, err, want, stored)
				}
				return c
			}
			commit := func(e *engine.Engine, c engine.Claim) {
				t.Helper()
				if err := e.Commit(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			commit(e, adv(e, 2, engine.New, 0))
			adv(e, 2, engine.Duplicate, 2)
			adv(e, 1, engine.Stale, 2)
			c3 := adv(e, 3, engine.New, 2)
			adv(e, 5, engine.InFlight, 0) // held by c3
			if err := e.Release(ctx, c3); err != nil {
				t.Fatal(err)
			}
			adv(e, 1, engine.Stale, 2) // the release kept version 2
			c4 := adv(e, 4, engine.New, 2)
			time.Sleep(600 * time.Millisecond) // c4's lease ends uncommitted
			adv(e, 1, engine.Stale, 2)
			if err := e.Commit(ctx, c4); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("commit after the lease: %v", err)
			}
			commit(e, adv(e, 7, engine.New, 2))
			// The caller's own claims of the same bytes are another key.
			if o, err := e.MarkIfAbsent(ctx, order); err != nil || o != engine.New {
				t.Fatalf("a claim of the entity's bytes: %v, %v", o, err)
			}

			b := other()
			adv(b, 7, engine.Duplicate, 7)
			adv(b, 6, engine.Stale, 7)
			withResult := adv(b, 9, engine.New, 7)
			withResult.Result = []byte("shipped")
			if err := b.Commit(ctx, withResult); !errors.Is(err, engine.ErrOptions) {
				t.Fatalf("an Advance claim with a Result: %v, want ErrOptions", err)
			}
			withResult.Result = nil
			commit(b, withResult)
			if cfg.name == "redis" {
				adv(e, 8, engine.Stale, 9) // the first process sees the second's
			}
			s := b.Stats()
			if s.Calls.Stale == 0 {
				t.Fatalf("Stats.Calls.Stale = 0")
			}
			ns := mustNamespace(t, b, "invoices")
			if c, err := ns.Advance(ctx, order, 1); err != nil || c.Outcome != engine.New {
				t.Fatalf("another namespace's entity: %v, %v", c.Outcome, err)
			}
			if _, err := b.Advance(ctx, order, 0); !errors.Is(err, engine.ErrVersion) {
				t.Fatalf("version 0: %v", err)
			}
		})
	}
	for _, tiers := range []engine.Tiers{engine.MemoryOnly, engine.BloomOnly} {
		o := engine.Options{Tiers: tiers, ExpectedKeys: 1000}
		if tiers == engine.BloomOnly {
			o.Backend = &embedded.Backend{}
		}
		e := open(t, o)
		if _, err := e.Advance(ctx, []byte("x"), 1); !errors.Is(err, engine.ErrOptions) {
			t.Errorf("%v: %v, want ErrOptions", tiers, err)
		}
		e.Close()
	}
}

// TestAdvanceOrderStateMachine: an order's status events (created 1,
// paid 2, packed 3, shipped 4, delivered 5) arrive redelivered and out of
// order, to four workers in two processes sharing the state, and each
// worker applies what Advance grants. Every status is applied at most
// once, the applied ones rise strictly, and the final state is the highest
// version any worker saw committed: no event moved the machine back.
func TestAdvanceOrderStateMachine(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{NoSharedCache: cfg.shared})
			defer e.Close()
			engines := []*engine.Engine{e, e}
			if cfg.name == "redis" {
				b := other()
				engines = []*engine.Engine{e, e, b, b}
			}
			const orders = 40
			var mu sync.Mutex
			applied := map[int][]uint64{} // order → versions applied, in order
			var wg sync.WaitGroup
			for w, x := range engines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(w), 9))
					for range 400 {
						o, v := rng.IntN(orders), uint64(1+rng.IntN(5))
						c, err := x.Advance(ctx, []byte(fmt.Sprint("order-", o)), v)
						if err != nil {
							t.Error(err)
							return
						}
						if c.Outcome != engine.New {
							continue
						}
						mu.Lock()
						applied[o] = append(applied[o], v)
						mu.Unlock()
						if err := x.Commit(ctx, c); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			for o, vs := range applied {
				for i := 1; i < len(vs); i++ {
					if vs[i] <= vs[i-1] {
						t.Fatalf("order %d applied %v: not rising", o, vs)
					}
				}
				c, err := e.Advance(ctx, []byte(fmt.Sprint("order-", o)), 5)
				if err != nil {
					t.Fatal(err)
				}
				if last := vs[len(vs)-1]; c.Version != last && !(c.Outcome == engine.New && c.Version == last) {
					t.Fatalf("order %d: stored %d, last applied %d", o, c.Version, last)
				}
				if c.Outcome == engine.New {
					_ = e.Release(ctx, c)
				}
			}
			if len(applied) < orders/2 {
				t.Fatalf("only %d orders moved", len(applied))
			}
		})
	}
}

// TestAdvanceRedisLeaseEnded: a Redis advance claim that its process
// abandons (lease ended, no commit, no release) leaves the version it
// would have replaced: another process's lower version is still Stale.
func TestAdvanceRedisLeaseEnded(t *testing.T) {
	ctx := context.Background()
	c := redistest.Start(t).Client(t)
	prefix := fmt.Sprintf("adv-%d:", time.Now().UnixNano())
	// A lease long enough that the check "while held" comes inside it on
	// a loaded machine.
	o := engine.Options{Lease: time.Second}
	a, b := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	defer a.Close()
	defer b.Close()
	first, _ := a.Advance(ctx, []byte("e"), 5)
	if err := a.Commit(ctx, first); err != nil {
		t.Fatal(err)
	}
	if cl, _ := a.Advance(ctx, []byte("e"), 6); cl.Outcome != engine.New {
		t.Fatal(cl.Outcome)
	}
	claimed := time.Now() // the claim's TTL started before this
	// a "crashes": its claim of 6 is never settled.
	if cl, _ := b.Advance(ctx, []byte("e"), 4); cl.Outcome != engine.InFlight {
		t.Fatalf("while held: %v", cl.Outcome)
	}
	time.Sleep(time.Until(claimed.Add(1100 * time.Millisecond)))
	if cl, _ := b.Advance(ctx, []byte("e"), 4); cl.Outcome != engine.Stale || cl.Version != 5 {
		t.Fatalf("after the abandoned claim: %v (stored %d), want Stale at 5", cl.Outcome, cl.Version)
	}
	if cl, _ := b.Advance(ctx, []byte("e"), 6); cl.Outcome != engine.New || cl.Version != 5 {
		t.Fatalf("6 after the abandoned claim: %v (stored %d)", cl.Outcome, cl.Version)
	}
}
