package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// attackPG opens a (through a holdDB), b and c on one table.
func attackPG(t *testing.T, max int, bLease time.Duration) (*holdDB, *engine.Engine, *engine.Engine, *engine.Engine) {
	p := pool(t)
	table := fmt.Sprintf("fence_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	d := &holdDB{DB: p}
	o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, MaxAttempts: max, NoSharedCache: true, Logger: slog.New(slog.DiscardHandler)}
	open := func(db postgres.DB, lease time.Duration) *engine.Engine {
		oo := o
		oo.Lease = lease
		oo.Backend = postgres.NewBackend(db, postgres.Config{Table: table})
		e, err := engine.Open(&oo)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		return e
	}
	a := open(d, time.Minute)
	b := open(p, bLease)
	c := open(p, time.Minute)
	return d, a, b, c
}

func heldMark(t *testing.T, d *holdDB, a *engine.Engine, key []byte) {
	t.Helper()
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
	if o, err := a.MarkIfAbsent(context.Background(), key); err == nil || !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("a's mark, its statement held: %v %v, want ErrUnavailable", o, err)
	}
}

// TestUnmarkFenceLateMarkOverAttemptCount: MaxAttempts 3; b's handler
// failed once (a released row, attempts 1). a's mark statement is held,
// a's call fails and is given back; the fence statement leaves the
// released row (neither free nor expired nor a fence), so the late mark
// statement, when it runs, takes the row (a count below the limit). Nobody
// was told New: c's mark must be New.
func TestUnmarkFenceLateMarkOverAttemptCount(t *testing.T) {
	d, a, b, c := attackPG(t, 3, time.Minute)
	ctx := context.Background()
	key := []byte("counted")
	cl, err := b.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("b's claim: %v %v", cl.Outcome, err)
	}
	if err := b.Release(ctx, cl); err != nil {
		t.Fatal(err)
	}
	heldMark(t, d, a, key)
	d.deliver(t)
	if o, err := c.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
		t.Errorf("c's mark after a's late statement: %v %v, want New (nobody was told New)", o, err)
	}
}

// TestUnmarkFenceLateMarkOverEndedLease: b's claim's lease ended (b died),
// its row not expired; a's mark is held, failed and given back (the fence
// statement leaves b's row); the late statement takes the lease-ended
// claim. c's mark must be New.
func TestUnmarkFenceLateMarkOverEndedLease(t *testing.T) {
	d, a, b, c := attackPG(t, 0, 100*time.Millisecond)
	ctx := context.Background()
	key := []byte("ended")
	cl, err := b.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("b's claim: %v %v", cl.Outcome, err)
	}
	time.Sleep(200 * time.Millisecond)
	heldMark(t, d, a, key)
	d.deliver(t)
	if o, err := c.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
		t.Errorf("c's mark after a's late statement: %v %v, want New (nobody was told New)", o, err)
	}
}

// TestUnmarkFenceForgetOverFence: a's mark held, given back (a fence row);
// c forgets the key (the fence stays), then the late statement runs; c's
// mark is New, b's then Duplicate. With MaxAttempts too.
func TestUnmarkFenceForgetOverFence(t *testing.T) {
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			d, a, b, c := attackPG(t, max, time.Minute)
			ctx := context.Background()
			key := []byte("forget-fence")
			heldMark(t, d, a, key)
			if info, err := c.Forget(ctx, key); err != nil || info.Outcome != engine.New {
				t.Errorf("forget over the fence: %v %v", info.Outcome, err)
			}
			d.deliver(t)
			if info, err := b.Lookup(ctx, key); err != nil || info.Outcome != engine.New {
				t.Errorf("lookup: %v %v", info.Outcome, err)
			}
			if o, err := c.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
				t.Errorf("c's mark: %v %v, want New", o, err)
			}
			if o, err := b.MarkIfAbsent(ctx, key); err != nil || o != engine.Duplicate {
				t.Errorf("b's mark: %v %v, want Duplicate", o, err)
			}
		})
	}
}
