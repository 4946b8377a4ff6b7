package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestExtend: the owner of a live claim extends its lease, and the key
// stays held past the first lease end; an ended or taken-over claim cannot
// be extended; bad arguments are refused.
func TestExtend(t *testing.T) {
	ctx := context.Background()
	for _, tiers := range []engine.Tiers{engine.MemoryOnly, engine.Default} {
		t.Run(tiers.String(), func(t *testing.T) {
			clock := newClock()
			o := engine.Options{Tiers: tiers, Clock: clock, Lease: 10 * time.Second}
			if tiers == engine.Default {
				setDir(&o, t.TempDir())
			}
			e := open(t, o)
			defer e.Close()
			c, err := e.Claim(ctx, []byte("k"))
			if err != nil || c.Outcome != engine.New {
				t.Fatal(c.Outcome, err)
			}
			first := c.LeaseUntil
			clock.Add(8 * time.Second)
			if err := e.Extend(ctx, &c, 20*time.Second); err != nil {
				t.Fatal(err)
			}
			if want := first - int64(10*time.Second) + int64(28*time.Second); c.LeaseUntil != want {
				t.Fatalf("LeaseUntil %d, want %d", c.LeaseUntil, want)
			}
			clock.Add(15 * time.Second) // 23s after the claim: past its first lease
			if other, _ := e.Claim(ctx, []byte("k")); other.Outcome != engine.InFlight {
				t.Fatalf("a claim inside the extended lease = %v, want InFlight", other.Outcome)
			}
			if err := e.Commit(ctx, c); err != nil {
				t.Fatalf("commit inside the extended lease: %v", err)
			}
			if err := e.Extend(ctx, &c, time.Second); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("extend of a committed claim: %v, want ErrLeaseLost", err)
			}

			old, _ := e.Claim(ctx, []byte("k2"))
			clock.Add(11 * time.Second)
			if err := e.Extend(ctx, &old, time.Minute); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("extend after the lease ended: %v, want ErrLeaseLost", err)
			}
			taker, _ := e.Claim(ctx, []byte("k2"))
			if taker.Outcome != engine.New {
				t.Fatalf("takeover = %v", taker.Outcome)
			}
			if err := e.Extend(ctx, &old, time.Minute); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("extend by the previous owner: %v, want ErrLeaseLost", err)
			}
			for _, d := range []time.Duration{0, -time.Second, engine.DefaultWindow} {
				if err := e.Extend(ctx, &taker, d); !errors.Is(err, engine.ErrOptions) {
					t.Errorf("extend by %v: %v, want ErrOptions", d, err)
				}
			}
			dup, _ := e.Claim(ctx, []byte("k"))
			if err := e.Extend(ctx, &dup, time.Second); !errors.Is(err, engine.ErrNotClaimed) {
				t.Fatalf("extend of a Duplicate: %v, want ErrNotClaimed", err)
			}
			other := open(t, engine.Options{Tiers: engine.MemoryOnly, Clock: clock})
			defer other.Close()
			if err := other.Extend(ctx, &taker, time.Second); !errors.Is(err, engine.ErrLeaseLost) {
				t.Fatalf("extend through another engine: %v, want ErrLeaseLost", err)
			}
		})
	}
}

// TestExtendRedis: an extension is made in Redis too, fenced by the owner
// token: another process finds the key held past the first lease, and a
// claim taken over there cannot be extended. Both claim forms (SET NX, and
// the script that counts attempts).
func TestExtendRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	for _, attempts := range []int{0, 3} {
		prefix := "extend-" + time.Now().Format("150405.000000") + ":"
		o := engine.Options{Lease: 500 * time.Millisecond, MaxAttempts: attempts}
		a, b := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
		ca, err := a.Claim(ctx, []byte("k"))
		if err != nil || ca.Outcome != engine.New {
			t.Fatal(ca.Outcome, err)
		}
		if err := a.Extend(ctx, &ca, 10*time.Second); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond) // past the first lease, on Redis's clock
		if cb, err := b.Claim(ctx, []byte("k")); err != nil || cb.Outcome != engine.InFlight {
			t.Fatalf("attempts %d: another process past the first lease: %v %v, want InFlight", attempts, cb.Outcome, err)
		}
		// The lease ends in Redis (forced): b takes over, a is fenced out.
		key := prefix + "\x00\x00k"
		if ok, _ := c.PExpire(ctx, key, time.Millisecond).Result(); !ok {
			t.Fatalf("no Redis key %q", key)
		}
		for c.Exists(ctx, key).Val() == 1 {
			time.Sleep(time.Millisecond)
		}
		cb, err := b.Claim(ctx, []byte("k"))
		if err != nil || cb.Outcome != engine.New {
			t.Fatalf("takeover: %v %v", cb.Outcome, err)
		}
		if err := a.Extend(ctx, &ca, 10*time.Second); !errors.Is(err, engine.ErrLeaseLost) {
			t.Fatalf("attempts %d: extend by the fenced process: %v, want ErrLeaseLost", attempts, err)
		}
		if err := b.Commit(ctx, cb); err != nil {
			t.Fatal(err)
		}
		a.Close()
		b.Close()
	}
}

// TestExtendPostgres: as TestExtendRedis, the table's clock aged instead
// of waited for.
func TestExtendPostgres(t *testing.T) {
	ctx := context.Background()
	pool := postgresPool(t)
	table := "extend_" + time.Now().Format("150405000000")
	t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table) })
	o := engine.Options{Backend: pgBackend(pool, table), Lease: time.Minute}
	a, b := open(t, o), open(t, o)
	defer a.Close()
	defer b.Close()
	ca, err := a.Claim(ctx, []byte("k"))
	if err != nil || ca.Outcome != engine.New {
		t.Fatal(ca.Outcome, err)
	}
	if err := a.Extend(ctx, &ca, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := agePostgres(ctx, pool, table, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if cb, err := b.Claim(ctx, []byte("k")); err != nil || cb.Outcome != engine.InFlight {
		t.Fatalf("another process past the first lease: %v %v, want InFlight", cb.Outcome, err)
	}
	if err := agePostgres(ctx, pool, table, 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	cb, err := b.Claim(ctx, []byte("k"))
	if err != nil || cb.Outcome != engine.New {
		t.Fatalf("takeover after the extended lease: %v %v", cb.Outcome, err)
	}
	if err := a.Extend(ctx, &ca, time.Minute); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("extend by the fenced process: %v, want ErrLeaseLost", err)
	}
}
