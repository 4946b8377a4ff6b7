package engine_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestLookupForget: Lookup tells what a claim would answer without
// claiming (absent, held, committed with its result, poisoned); Forget
// removes a commit or an attempt count so the next claim is New, leaves a
// held key alone (ErrInFlight, the claim still commits), and its effect
// is durable and seen by the next engine on the same state (a restart, or
// another process of a shared tier).
func TestLookupForget(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs() {
		t.Run(cfg.name, func(t *testing.T) {
			e, other, _ := cfg.open(t, engine.Options{MaxAttempts: 2, Lease: time.Minute, NoSharedCache: cfg.shared})
			defer e.Close()
			look := func(e *engine.Engine, key string, want engine.Outcome) engine.KeyInfo {
				t.Helper()
				info, err := e.Lookup(ctx, []byte(key))
				if err != nil || info.Outcome != want {
					t.Fatalf("Lookup(%s) = %v, %v; want %v", key, info.Outcome, err, want)
				}
				return info
			}
			look(e, "absent", engine.New)
			if c, _ := e.Claim(ctx, []byte("absent")); c.Outcome != engine.New {
				t.Fatalf("a claim after a lookup: %v (a lookup claimed the key)", c.Outcome)
			} else {
				look(e, "absent", engine.InFlight)
				if info, err := e.Forget(ctx, []byte("absent")); !errors.Is(err, engine.ErrInFlight) || info.Outcome != engine.InFlight {
					t.Fatalf("Forget of a held key: %v, %v; want ErrInFlight", info.Outcome, err)
				}
				c.Result = []byte("created #1")
				if err := e.Commit(ctx, c); err != nil {
					t.Fatalf("the claim after a refused Forget: %v", err)
				}
			}
			info := look(e, "absent", engine.Duplicate)
			if string(info.Result) != "created #1" || info.CommittedAt == 0 {
				t.Fatalf("Lookup of a commit with a result: %q at %d", info.Result, info.CommittedAt)
			}
			for range 2 { // MaxAttempts: 2
				c, _ := e.Claim(ctx, []byte("poison"))
				if err := e.Release(ctx, c); err != nil {
					t.Fatal(err)
				}
			}
			if info := look(e, "poison", engine.Poison); info.Attempts != 2 {
				t.Fatalf("poisoned key: %d attempts", info.Attempts)
			}
			for _, k := range []string{"forgotten", "kept"} {
				if o, err := e.MarkIfAbsent(ctx, []byte(k)); err != nil || o != engine.New {
					t.Fatal(o, err)
				}
			}

			// Another engine on the same state sees every commit, then
			// forgets two keys and un-poisons one.
			b := other()
			look(b, "kept", engine.Duplicate)
			look(b, "poison", engine.Poison)
			if info := look(b, "absent", engine.Duplicate); string(info.Result) != "created #1" {
				t.Fatalf("another engine's lookup: result %q", info.Result)
			}
			keys := [][]byte{[]byte("forgotten"), []byte("absent"), []byte("poison"), []byte("never")}
			out := make([]engine.KeyInfo, len(keys))
			if err := b.ForgetBatch(ctx, keys, out); err != nil {
				t.Fatal(err)
			}
			want := []engine.Outcome{engine.Duplicate, engine.Duplicate, engine.Poison, engine.New}
			for i := range out {
				if out[i].Outcome != want[i] {
					t.Fatalf("Forget(%s) found %v, want %v", keys[i], out[i].Outcome, want[i])
				}
			}
			if !bytes.Equal(out[1].Result, []byte("created #1")) {
				t.Fatalf("Forget returned result %q", out[1].Result)
			}
			if s := b.Stats(); s.Calls.Forgets != 3 || s.Calls.Lookups == 0 {
				t.Fatalf("Stats: %d keys forgotten, want 3; %d lookups", s.Calls.Forgets, s.Calls.Lookups)
			}
			// The forgetting engine and the first one (a shared tier: no
			// cached copy) answer New; the kept key stays a duplicate.
			for _, x := range []*engine.Engine{b, e} {
				if x == e && cfg.name == "default" {
					continue // closed by the restart
				}
				if info := look(x, "poison", engine.New); info.Attempts != 0 {
					t.Fatalf("a forgotten poison key keeps %d attempts", info.Attempts)
				}
				look(x, "forgotten", engine.New)
				look(x, "kept", engine.Duplicate)
			}
			if cfg.name == "default" {
				b = other() // the removal is durable
				look(b, "forgotten", engine.New)
				look(b, "kept", engine.Duplicate)
			}
			if c, _ := b.Claim(ctx, []byte("forgotten")); c.Outcome != engine.New {
				t.Fatalf("claim of a forgotten key: %v", c.Outcome)
			}
		})
	}
}

// TestForgetRace: a committed key is forgotten while workers claim it: at
// most one claim is New per round; after the round the key is committed if
// one was (it committed), and forgotten otherwise.
func TestForgetRace(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("memory", "default") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{NoSharedCache: cfg.shared})
			defer e.Close()
			for round := range 200 {
				key := []byte(fmt.Sprint("k", round))
				if _, err := e.MarkIfAbsent(ctx, key); err != nil {
					t.Fatal(err)
				}
				var news atomic.Int32
				var wg sync.WaitGroup
				for range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c, err := e.Claim(ctx, key)
						if err != nil {
							t.Error(err)
							return
						}
						if c.Outcome == engine.New {
							news.Add(1)
							if err := e.Commit(ctx, c); err != nil {
								t.Error(err)
							}
						}
					}()
				}
				if _, err := e.Forget(ctx, key); err != nil && !errors.Is(err, engine.ErrInFlight) {
					t.Fatal(err)
				}
				wg.Wait()
				if n := news.Load(); n > 1 {
					t.Fatalf("round %d: %d claims were New", round, n)
				}
				info, err := e.Lookup(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				// A New claim committed the key again; with none, Forget
				// removed it (every claim saw it committed or seized).
				want := engine.New
				if news.Load() == 1 {
					want = engine.Duplicate
				}
				if info.Outcome != want {
					t.Fatalf("round %d: after %d New claims the key is %v, want %v", round, news.Load(), info.Outcome, want)
				}
			}
		})
	}
}

// TestLookupForgetRefusals: bloom-only cannot look up or forget; a shared
// tier that caches commits cannot forget; batches must match.
func TestLookupForgetRefusals(t *testing.T) {
	ctx := context.Background()
	bl := open(t, engine.Options{Backend: &embedded.Backend{}, Tiers: engine.BloomOnly, ExpectedKeys: 1000})
	defer bl.Close()
	if _, err := bl.Lookup(ctx, []byte("k")); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("bloom-only Lookup: %v", err)
	}
	if _, err := bl.Forget(ctx, []byte("k")); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("bloom-only Forget: %v", err)
	}
	c := redistest.Start(t).Client(t)
	r := openRedis(t, c, "", engine.Options{})
	defer r.Close()
	if _, err := r.Forget(ctx, []byte("k")); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("Forget on Redis with a commit cache: %v", err)
	}
	if _, err := r.Lookup(ctx, nil); !errors.Is(err, engine.ErrEmptyKey) {
		t.Fatalf("Lookup of an empty key: %v", err)
	}
	if err := r.LookupBatch(ctx, [][]byte{[]byte("a")}, nil); !errors.Is(err, engine.ErrBatch) {
		t.Fatalf("mismatched batch: %v", err)
	}
	if o := (engine.Options{Tiers: engine.MemoryOnly, NoSharedCache: true}); !errors.Is(o.Validate(), engine.ErrOptions) {
		t.Fatal("NoSharedCache accepted without a shared tier")
	}
}

// TestForgetBatchRepeatedKey: a forget batch that repeats a key answers
// every occurrence as the first (no false ErrInFlight from the claim the
// first occurrence made), and the key is forgotten.
func TestForgetBatchRepeatedKey(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range configs("memory", "default", "redis") {
		t.Run(cfg.name, func(t *testing.T) {
			e, _, _ := cfg.open(t, engine.Options{NoSharedCache: cfg.shared})
			defer e.Close()
			k := []byte("k")
			if o, err := e.MarkIfAbsent(ctx, k); err != nil || o != engine.New {
				t.Fatal(o, err)
			}
			out := make([]engine.KeyInfo, 3)
			if err := e.ForgetBatch(ctx, [][]byte{k, []byte("other"), k}, out); err != nil || out[0].Outcome != engine.Duplicate || out[2].Outcome != engine.Duplicate || out[1].Outcome != engine.New {
				t.Fatalf("ForgetBatch([k other k]) = %v %v %v, %v", out[0].Outcome, out[1].Outcome, out[2].Outcome, err)
			}
			if s := e.Stats(); s.Calls.Forgets != 1 {
				t.Fatalf("%d keys counted forgotten, want 1", s.Calls.Forgets)
			}
			if c, err := e.Claim(ctx, k); err != nil || c.Outcome != engine.New {
				t.Fatalf("after forget: %v %v", c.Outcome, err)
			}
		})
	}
}

// TestNoSharedCacheIsRecorded: every process sharing a Redis prefix or a
// PostgreSQL table must agree on NoSharedCache, or a process that caches
// its commits would answer Duplicate for a key another one forgot: the
// layout records it and refuses a process that differs.
func TestNoSharedCacheIsRecorded(t *testing.T) {
	c := redistest.Start(t).Client(t)
	pool := postgresPool(t)
	table := "uncached_" + time.Now().Format("150405000000")
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	for _, o := range []engine.Options{
		{Backend: redisBackend(c, fmt.Sprintf("uncached-%d:", time.Now().UnixNano()))},
		{Backend: pgBackend(pool, table)},
	} {
		o.NoSharedCache = true
		a := open(t, o)
		o.NoSharedCache = false
		if b, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
			if b != nil {
				b.Close()
			}
			t.Fatalf("%v: a caching process on a prefix recorded uncached: %v, want ErrLayout", o.Name(), err)
		}
		a.Close()
	}
}
