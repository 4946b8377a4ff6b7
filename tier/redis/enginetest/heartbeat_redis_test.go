package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// The claim heartbeat (Engine.Keep, under Do) against a Redis server that
// stalls (SIGSTOP) while the handler runs, with another process retrying
// the key all along. What a late, duplicated or reordered copy of a beat
// can do: an Extend is fenced by the claim's owner token and never
// shortens a lease, so a beat delayed past a takeover or a commit finds
// another token (or none) and changes nothing; Stop waits for the beat in
// flight, so no beat of this process runs after its own commit.

// heartbeatPair opens two engines (two processes) on one prefix of srv,
// with a one-second lease.
func heartbeatPair(t *testing.T, srv *redistest.Server) (a, b *engine.Engine) {
	t.Helper()
	c := srv.ClientWith(t, &goredis.Options{ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	prefix := fmt.Sprintf("hb-%d:", time.Now().UnixNano())
	o := engine.Options{Window: time.Minute, Partition: 10 * time.Second, Lease: time.Second}
	a, b = openRedis(t, c, prefix, o), openRedis(t, c, prefix, o)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// retryClaims has b claim key every 50 ms until stop, with a short
// deadline, and returns the claims it got New (committing none).
func retryClaims(b *engine.Engine, key []byte, stop <-chan struct{}) <-chan []engine.Claim {
	out := make(chan []engine.Claim, 1)
	go func() {
		var got []engine.Claim
		for {
			select {
			case <-stop:
				out <- got
				return
			case <-time.After(50 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			c, err := b.Claim(ctx, key)
			cancel()
			if err == nil && c.Outcome == engine.New {
				got = append(got, c)
			}
		}
	}()
	return out
}

// TestDoHeartbeatSurvivesRedisStall: the server stalls for 400 ms (less
// than what is left of the lease at any beat) three times while a handler
// runs three leases long; the other process never gets the key, and Do
// commits.
func TestDoHeartbeatSurvivesRedisStall(t *testing.T) {
	srv := redistest.Start(t)
	a, b := heartbeatPair(t, srv)
	key := []byte("stalled-beat")
	stop := make(chan struct{})
	others := retryClaims(b, key, stop)
	o, err := a.Do(context.Background(), key, func(ctx context.Context) error {
		for range 3 {
			time.Sleep(600 * time.Millisecond)
			srv.Pause()
			time.Sleep(400 * time.Millisecond)
			srv.Resume()
		}
		return ctx.Err()
	})
	close(stop)
	if got := <-others; len(got) > 0 {
		t.Fatalf("the other process got the key New %d times while the handler ran", len(got))
	}
	if o != engine.New || err != nil {
		t.Fatalf("Do: %v, %v", o, err)
	}
	if o, err := b.MarkIfAbsent(context.Background(), key); o != engine.Duplicate || err != nil {
		t.Fatalf("after Do, the other process: %v, %v", o, err)
	}
}

// TestDoHeartbeatLostToRedisStall: the server stalls for 2.5 s, past the
// lease, while the handler runs; once it answers again the other process
// takes the key over and commits its own result. The handler's context
// ends, Do returns ErrLeaseLost, and nothing of the first process lands:
// the key holds the other process's result.
func TestDoHeartbeatLostToRedisStall(t *testing.T) {
	srv := redistest.Start(t)
	a, b := heartbeatPair(t, srv)
	ctx := context.Background()
	key := []byte("lost-beat")
	var once sync.Once
	tookOver := make(chan error, 1)
	def, _ := a.Namespace("")
	o, result, err := def.DoResult(ctx, key, func(hctx context.Context) ([]byte, error) {
		srv.Pause()
		time.Sleep(2500 * time.Millisecond)
		srv.Resume()
		// The other process retries until the server let the key go.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			c, err := b.Claim(ctx, key)
			if err == nil && c.Outcome == engine.New {
				c.Result = []byte("second")
				once.Do(func() { tookOver <- b.Commit(ctx, c) })
				break
			}
		}
		select {
		case <-hctx.Done():
			return []byte("first"), nil // the handler stops; Do must not store this
		case <-time.After(5 * time.Second):
			return nil, errors.New("the handler's context did not end after the takeover")
		}
	})
	select {
	case err := <-tookOver:
		if err != nil {
			t.Fatalf("the other process's commit: %v", err)
		}
	default:
		t.Fatal("the other process never got the key")
	}
	if o != engine.New || !errors.Is(err, engine.ErrLeaseLost) || result != nil {
		t.Fatalf("Do of a lost claim: %v, %q, %v; want New, nil, ErrLeaseLost", o, result, err)
	}
	for _, e := range []*engine.Engine{a, b} {
		in, err := e.Lookup(ctx, key)
		if err != nil || in.Outcome != engine.Duplicate || string(in.Result) != "second" {
			t.Fatalf("the key after the takeover: %+v, %v; want the other process's result", in, err)
		}
	}
}
