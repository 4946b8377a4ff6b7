package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// TestRedisCommittedKeyIsNotPoison: with MaxAttempts 1, a commit whose
// reply is lost (ErrUnavailable) but which Redis applied: after the lease,
// the next claim must be the Duplicate Redis holds, never Poison from a
// count kept in this process (Redis alone counts attempts).
func TestRedisCommittedKeyIsNotPoison(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := newClock()
	prefix := fmt.Sprintf("r2a-%d:", time.Now().UnixNano())
	e := openRedis(t, c, prefix, engine.Options{Clock: clock, MaxAttempts: 1})
	defer e.Close()
	key := []byte("order-1")
	cl, err := e.Claim(context.Background(), key)
	if err != nil || cl.Outcome != engine.New {
		t.Fatal(cl.Outcome, err)
	}
	srv.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	cerr := e.Commit(ctx, cl)
	cancel()
	srv.Resume()
	if !errors.Is(cerr, engine.ErrUnavailable) {
		t.Fatalf("commit against a paused Redis = %v, want ErrUnavailable: the lost reply was not exercised", cerr)
	}
	rk := prefix + "\x00\x00" + string(key)
	for deadline := time.Now().Add(5 * time.Second); ; {
		if v, _ := c.Get(context.Background(), rk).Result(); len(v) > 0 && v[0] == 'D' {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the commit never reached Redis")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// The commit went through the engine's queue, which may still be
	// reading Redis's reply; until it has, the key is this process's
	// commit in progress (InFlight). The redelivery comes once it settled,
	// and after the lease.
	if err := e.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	clock.Add(engine.DefaultLease + time.Second)
	got, err := e.Claim(context.Background(), key)
	if err != nil || got.Outcome != engine.Duplicate {
		t.Fatalf("claim of a key Redis holds committed: %v, %v; want Duplicate", got.Outcome, err)
	}
}

// TestRedisLostMarkRetryIsNew: with MaxAttempts 1, a MarkIfAbsent whose
// commit reply is lost: the engine gives the claim back without counting an
// attempt (its own call failed, not a handler), so the retry is New, not
// Poison.
func TestRedisLostMarkRetryIsNew(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := &hookClock{Clock: newClock()}
	prefix := fmt.Sprintf("r2b-%d:", time.Now().UnixNano())
	e := openRedis(t, c, prefix, engine.Options{Clock: clock, Lease: time.Hour, MaxAttempts: 1})
	defer e.Close()
	key := []byte("order-1")
	loseMarkReply(t, e, clock, srv, key, 600*time.Millisecond, 2)
	o, err := e.MarkIfAbsent(context.Background(), key)
	if err != nil || o != engine.New {
		t.Fatalf("retry of a MarkIfAbsent that failed with ErrUnavailable (MaxAttempts 1): %v, %v; want New", o, err)
	}
}

// TestRedisPoisonLastsAsLongAsRedisCount: a key's attempt count lives as
// long as Redis keeps it (the window) and no longer: after it expired and
// another process committed the key, this process must answer Duplicate,
// not Poison from a count of its own.
func TestRedisPoisonLastsAsLongAsRedisCount(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	prefix := fmt.Sprintf("r2c-%d:", time.Now().UnixNano())
	o := engine.Options{Window: 2 * time.Second, Partition: 10 * time.Second, Lease: 500 * time.Millisecond, MaxAttempts: 1}
	a, b := openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	defer a.Close()
	defer b.Close()
	ctx := context.Background()
	key := []byte("order-1")
	boom := errors.New("handler failed")
	if out, err := a.Do(ctx, key, func(context.Context) error { return boom }); out != engine.New || !errors.Is(err, boom) {
		t.Fatal(out, err)
	}
	time.Sleep(2300 * time.Millisecond) // past Window: Redis has forgotten the count
	if out, err := b.Do(ctx, key, func(context.Context) error { return nil }); out != engine.New || err != nil {
		t.Fatalf("other process after the window: %v, %v", out, err)
	}
	if out, err := a.Claim(ctx, key); err != nil || out.Outcome != engine.Duplicate {
		t.Fatalf("key committed by another process: %v, %v; want Duplicate", out.Outcome, err)
	}
}

// TestRedisLostMarkOtherProcess: a mark whose commit reply was lost is
// given back, undoing the commit Redis applied, so the broker's redelivery
// to another consumer process is New: someone processes the message.
func TestRedisLostMarkOtherProcess(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	clock := &hookClock{Clock: newClock()}
	prefix := fmt.Sprintf("r2d-%d:", time.Now().UnixNano())
	a := openRedis(t, c, prefix, engine.Options{Clock: clock, Lease: time.Hour})
	defer a.Close()
	b := openRedis(t, c, prefix, engine.Options{})
	defer b.Close()
	key := []byte("order-1")
	loseMarkReply(t, a, clock, srv, key, 400*time.Millisecond, 1)
	o, err := b.MarkIfAbsent(context.Background(), key)
	if err != nil || o != engine.New {
		t.Fatalf("redelivery to another process of a mark that failed with ErrUnavailable: %v, %v; want New (nobody processed it)", o, err)
	}
}

// TestRedisMaxAttemptsChangeKeepsKeysUsable: after a prefix moves from
// MaxAttempts 3 to 0 (every process stopped, the layout key deleted), a key
// left holding an attempt count must still be claimable: the plain claim
// hands such values to the counting script.
func TestRedisMaxAttemptsChangeKeepsKeysUsable(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	prefix := fmt.Sprintf("r2e-%d:", time.Now().UnixNano())
	a := openRedis(t, c, prefix, engine.Options{MaxAttempts: 3})
	boom := errors.New("handler failed")
	if out, err := a.Do(ctx, []byte("order-1"), func(context.Context) error { return boom }); out != engine.New || !errors.Is(err, boom) {
		t.Fatal(out, err)
	}
	_ = a.Close()
	if err := c.Del(ctx, prefix+"\x00").Err(); err != nil { // the documented procedure
		t.Fatal(err)
	}
	b := openRedis(t, c, prefix, engine.Options{}) // MaxAttempts 0 now
	defer b.Close()
	cl, err := b.Claim(ctx, []byte("order-1"))
	if err != nil || cl.Outcome != engine.New {
		t.Fatalf("claim after MaxAttempts 3 -> 0 (layout key deleted as documented): %v, %v; want New", cl.Outcome, err)
	}
}
