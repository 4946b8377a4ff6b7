package enginetest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestRedisWindowIsRecorded: two processes share one Redis and prefix, A
// with a one-hour window, B (a misconfigured or newly rolled-out
// deployment) with one second. B's Open must be refused with ErrLayout (the
// prefix records its window), or else a key B marked must still be a
// Duplicate to A: a shorter window on one process must never expire keys
// another promises to keep.
func TestRedisWindowIsRecorded(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	a := openRedis(t, c, "win:", engine.Options{Window: time.Hour, Lease: 100 * time.Millisecond})
	defer a.Close()
	b, err := engine.Open(&engine.Options{Backend: redisBackend(c, "win:"), Window: time.Second, Lease: 100 * time.Millisecond, Logger: quiet})
	if err != nil {
		if !errors.Is(err, engine.ErrLayout) {
			t.Fatalf("second deployment with another window: %v, want ErrLayout", err)
		}
		return
	}
	defer b.Close()
	if o, err := b.MarkIfAbsent(ctx, []byte("order-1")); err != nil || o != engine.New {
		t.Fatal(o, err)
	}
	time.Sleep(1500 * time.Millisecond)
	if o, err := a.MarkIfAbsent(ctx, []byte("order-1")); err != nil || o != engine.Duplicate {
		t.Fatalf("A (Window 1h) 1.5 s after B marked the key: %v, %v; want Duplicate (or B refused at Open)", o, err)
	}
}

// TestRedisMarkBatchPartialCommit: MarkBatch claims two keys; before its
// commit, k2's Redis lease ends and another process takes k2 (forced with
// PEXPIRE, as TestRedisFencing does). k1's commit lands, k2's is refused:
// MarkBatch must answer k1 New and k2 InFlight rather than fail a batch it
// partly committed, so k1's message is processed once and k2's redelivered.
func TestRedisMarkBatchPartialCommit(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	clock := &hookClock{Clock: newClock()}
	// With MaxAttempts a Redis mark is a claim and a commit (without, one
	// step, with no gap for the lease to end in).
	a := openRedis(t, c, "mb:", engine.Options{Clock: clock, MaxAttempts: 3})
	b := openRedis(t, c, "mb:", engine.Options{MaxAttempts: 3})
	defer a.Close()
	defer b.Close()
	k1, k2 := []byte("k1"), []byte("k2")
	clock.Arm(2, func() { // the commit's clock reading, after the claim's
		if n, _ := c.PExpire(ctx, "mb:\x00\x00k2", time.Millisecond).Result(); !n {
			t.Error("no Redis key for k2")
		}
		time.Sleep(20 * time.Millisecond)
		if cb, err := b.Claim(ctx, k2); err != nil || cb.Outcome != engine.New {
			t.Errorf("other process claiming k2 after its lease: %v, %v", cb.Outcome, err)
		}
	})
	out := make([]engine.Outcome, 2)
	mbErr := a.MarkBatch(ctx, [][]byte{k1, k2}, nil, out)
	err := mbErr
	if !clock.Fired() {
		t.Fatal("hook did not fire")
	}
	if err == nil {
		t.Logf("MarkBatch = %v (per-key outcomes)", out)
		return
	}
	t.Logf("MarkBatch returned %v, out %v", err, out)
	// The caller got an error: it did not process k1 and does not ack it.
	// The redelivery, to any process, must be New.
	fresh := openRedis(t, c, "mb:", engine.Options{})
	defer fresh.Close()
	if o, err := fresh.MarkIfAbsent(ctx, k1); err != nil || o != engine.New {
		t.Fatalf("k1 after MarkBatch failed with %q: %v, %v; want New (the failed call must not have marked it)", errString(mbErr), o, err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestRedisGiveBackKeepsDeadline: Do's handler fails while Redis is
// paused; giving the claim back must still return by the caller's deadline
// plus a small margin (the package's invariant 8), whatever the client's own timeouts.
func TestRedisGiveBackKeepsDeadline(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t) // default options
	e := openRedis(t, c, "do:", engine.Options{})
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var resume *time.Timer
	start := time.Now()
	_, err := e.Do(ctx, []byte("order-1"), func(context.Context) error {
		srv.Pause()
		resume = time.AfterFunc(2500*time.Millisecond, srv.Resume) // bound the test
		return errors.New("handler failed")
	})
	took := time.Since(start)
	if resume != nil && resume.Stop() {
		srv.Resume()
	}
	t.Logf("Do = %v after %v", err, took)
	if took > 500*time.Millisecond {
		t.Fatalf("Do with a 100 ms deadline returned after %v (Redis paused during the handler)", took)
	}
}

// TestRedisMarkLostCommitReply: MarkIfAbsent's claim succeeds, then Redis
// pauses; the commit fails by the caller's deadline (ErrUnavailable) but
// waits in Redis's socket and is applied when it resumes. The caller saw an
// error and did not process the message, so its retry must be New, never a
// Duplicate of its own unreported mark (the package's invariant 8).
func TestRedisMarkLostCommitReply(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := &hookClock{Clock: newClock()}
	e := openRedis(t, c, "lostc:", engine.Options{Clock: clock, Lease: time.Hour})
	defer e.Close()
	key := []byte("order-1")
	loseMarkReply(t, e, clock, srv, key, 400*time.Millisecond, 1)
	o, err := e.MarkIfAbsent(context.Background(), key)
	if err != nil || o != engine.New {
		t.Fatalf("retry of a MarkIfAbsent that failed with ErrUnavailable: %v, %v; want New (its own lost commit)", o, err)
	}
}
