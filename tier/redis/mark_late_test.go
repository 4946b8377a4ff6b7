package redis_test

import (
	"context"
	"errors"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
)

// TestMarkLateSETAfterRelease: a's mark of a key b holds is settled
// (its SET's reply lost, the settling script finds b's claim: InFlight);
// its SET reaches the server only after b released the key. The key must
// not end committed by a's SET: a was told InFlight, so the message's
// redelivery (to a or to c) must be New, not Duplicate (the message would
// be acted on by nobody).
func TestMarkLateSETAfterRelease(t *testing.T) {
	for _, to := range []string{"c", "a"} {
		t.Run("redelivered-to-"+to, func(t *testing.T) {
			srv, h, es := settleServer(t, 3)
			a, b, c := es[0], es[1], es[2]
			ctx := context.Background()
			key := []byte("late-" + to)
			cl := settledWhileHeld(t, h, a, b, key)
			if err := b.Release(ctx, cl); err != nil {
				t.Fatalf("b's release: %v", err)
			}
			if lateSETs(t, srv.Client(t), h) {
				t.Errorf("a's late SET committed the key b released")
			}
			e := c
			if to == "a" {
				e = a
			}
			if o, err := e.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
				t.Errorf("redelivery to %s after the late SET: %v %v, want New (nobody was told New)", to, o, err)
			}
		})
	}
}

// TestMarkLateSETAfterExpiry: as TestMarkLateSETAfterRelease, but b's
// claim ends by its TTL (b died; here the key is deleted, as the TTL
// would), which leaves no fence: the late SET commits the key with a's
// token. a's own engine remembers the settled mark, so the redelivery to
// a adopts that commit (New). (Redelivered to another process it is
// Duplicate: docs/reliability.md, the mark row.)
func TestMarkLateSETAfterExpiry(t *testing.T) {
	srv, h, es := settleServer(t, 2)
	a, b := es[0], es[1]
	ctx := context.Background()
	key := []byte("late-expiry")
	settledWhileHeld(t, h, a, b, key)
	rc := srv.Client(t)
	expireKey(t, rc, "late-expiry")
	if !lateSETs(t, rc, h) {
		t.Fatal("a's late SET did not land on the free key")
	}
	if o, err := a.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
		t.Errorf("redelivery to a after the late SET: %v %v, want New (a adopts its own commit)", o, err)
	}
	if o, err := a.MarkIfAbsent(ctx, key); err != nil || o != engine.Duplicate {
		t.Errorf("a's next mark: %v %v, want Duplicate", o, err)
	}
}

// TestMarkLateSETAfterInFlightRedelivery: a's mark is settled while b holds
// the key (InFlight, Unsettled: a remembers its token); the message is
// redelivered to a while b still holds the key (InFlight again: the
// memory is taken); b's claim then ends by its TTL and a's late SET
// commits the key. The next redelivery to a must be New (a adopts its own
// commit, as TestMarkLateSETAfterExpiry promises); nobody was told New.
func TestMarkLateSETAfterInFlightRedelivery(t *testing.T) {
	srv, h, es := settleServer(t, 2)
	a, b := es[0], es[1]
	ctx := context.Background()
	key := []byte("late-consumed")
	settledWhileHeld(t, h, a, b, key)
	if o, err := a.MarkIfAbsent(ctx, key); err != nil || o != engine.InFlight {
		t.Fatalf("a's second delivery while b holds the key: %v %v, want InFlight", o, err)
	}
	rc := srv.Client(t)
	expireKey(t, rc, "late-consumed")
	if !lateSETs(t, rc, h) {
		t.Fatal("a's late SET did not land on the free key")
	}
	if o, err := a.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
		t.Errorf("third delivery to a after the late SET: %v %v, want New (nobody was told New)", o, err)
	}
}

// TestMarkLateSETAfterCommitAndForget: a's mark settles while b holds the
// key; b commits (told New); a Forget; then a's late SET arrives (the
// Forget's fence refuses it); a's redelivery is New (forgotten), and
// then b's mark is Duplicate.
func TestMarkLateSETAfterCommitAndForget(t *testing.T) {
	srv, h, es := settleServer(t, 3)
	a, b, c := es[0], es[1], es[2]
	ctx := context.Background()
	key := []byte("uc-forget")
	cl := settledWhileHeld(t, h, a, b, key)
	if err := b.Commit(ctx, cl); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Forget(ctx, key); err != nil {
		t.Fatal(err)
	}
	landed := lateSETs(t, srv.Client(t), h)
	o, err := a.MarkIfAbsent(ctx, key)
	if err != nil || o != engine.New {
		t.Errorf("a's redelivery after the Forget: %v %v (late SET landed %v), want New", o, err, landed)
	}
	if o, err := b.MarkIfAbsent(ctx, key); err != nil || o != engine.Duplicate {
		t.Errorf("b after a's New: %v %v, want Duplicate", o, err)
	}
}

// settledWhileHeld has b claim key, then a mark it with its SET held
// back by h (its reply lost): the settling script finds b's claim, and
// a's mark answers InFlight. It returns b's claim.
func settledWhileHeld(t *testing.T, h *afterSetHook, a, b *engine.Engine, key []byte) engine.Claim {
	t.Helper()
	ctx := context.Background()
	cl, err := b.Claim(ctx, key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("b's claim: %v %v", cl.Outcome, err)
	}
	h.hold = true
	h.arm(func() {})
	if o, err := a.MarkIfAbsent(ctx, key); err != nil || o != engine.InFlight {
		t.Fatalf("a's mark while b holds the key: %v %v, want InFlight", o, err)
	}
	return cl
}

// expireKey deletes the one server key whose name holds name, as its
// TTL would.
func expireKey(t *testing.T, rc *goredis.Client, name string) {
	t.Helper()
	ctx := context.Background()
	if n, err := rc.Keys(ctx, "*"+name+"*").Result(); err != nil || len(n) != 1 {
		t.Fatalf("keys: %v %v", n, err)
	} else if err := rc.Del(ctx, n[0]).Err(); err != nil {
		t.Fatal(err)
	}
}

// lateSETs sends the commands h held, as their late messages, and
// reports whether any set its key.
func lateSETs(t *testing.T, rc *goredis.Client, h *afterSetHook) (landed bool) {
	t.Helper()
	h.mu.Lock()
	held := h.held
	h.held = nil
	h.mu.Unlock()
	if len(held) == 0 {
		t.Fatal("no SET was held")
	}
	for _, args := range held {
		err := rc.Do(context.Background(), args...).Err()
		switch {
		case errors.Is(err, goredis.Nil):
			landed = true // NX GET answers nil where it set a free key
		case err != nil:
			t.Fatalf("late %v: %v", args[0], err)
		}
	}
	t.Logf("late SETs landed: %v", landed)
	return landed
}
