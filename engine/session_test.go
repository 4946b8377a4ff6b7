package engine_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// runEngine is a memory-only engine; with maxAttempts 1 whether a
// give-back counted an attempt shows in the next claim (Poison, or New
// again).
func runEngine(t *testing.T, clock *fakeClock, maxAttempts int) *engine.Engine {
	t.Helper()
	o := engine.Options{Tiers: engine.MemoryOnly, MaxAttempts: maxAttempts, Lease: 200 * time.Millisecond, Logger: quiet}
	if clock != nil {
		o.Clock = clock
	}
	e := open(t, o)
	t.Cleanup(func() { _ = e.Close() })
	return e
}

func sessionClaim(t *testing.T, e *engine.Engine, key string) engine.Claim {
	t.Helper()
	c, err := e.Claim(context.Background(), []byte(key))
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("claim %s: %v, %v", key, c.Outcome, err)
	}
	return c
}

func nextOutcome(t *testing.T, e *engine.Engine, key string) engine.Outcome {
	t.Helper()
	c, err := e.Claim(context.Background(), []byte(key))
	if err != nil {
		t.Fatalf("claim %s again: %v", key, err)
	}
	if c.Outcome == engine.New {
		_ = e.Release(context.Background(), c)
	}
	return c.Outcome
}

// TestRunSettles: each way a handler ends settles its claim one way:
// returned nil → the caller's commit, once, with the claim; an error → a
// give-back counting an attempt (NoAttempt: counting none); a panic or
// runtime.Goexit → the same give-back, the panic going on with its value;
// and commit is called only for a handler that returned nil.
func TestRunSettles(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("handler failed")
	for _, tc := range []struct {
		name      string
		noAttempt bool
		end       func() error // what the handler does
		want      error        // errors.Is of Run's error
		panics    bool
		next      engine.Outcome // the key's next claim
	}{
		{name: "ok", end: func() error { return nil }, next: engine.Duplicate},
		{name: "error", end: func() error { return boom }, want: boom, next: engine.Poison},
		{name: "error-no-attempt", noAttempt: true, end: func() error { return boom }, want: boom, next: engine.New},
		{name: "panic", end: func() error { panic(boom) }, panics: true, next: engine.Poison},
		{name: "panic-no-attempt", noAttempt: true, end: func() error { panic(boom) }, panics: true, next: engine.New},
		{name: "goexit", end: func() error { runtime.Goexit(); return nil }, panics: true, next: engine.Poison},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := runEngine(t, nil, 1)
			c := sessionClaim(t, e, tc.name)
			commits := 0
			var err error
			var recovered any
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // a goroutine of its own: runtime.Goexit ends it
				defer wg.Done()
				defer func() { recovered = recover() }()
				err = e.Run(ctx, &c, engine.SessionOptions{NoAttempt: tc.noAttempt}, func(context.Context) error {
					return tc.end()
				}, func(ctx context.Context, c engine.Claim) error {
					commits++
					if c.Outcome != engine.New {
						t.Errorf("commit given a %v claim", c.Outcome)
					}
					return e.Commit(ctx, c)
				})
			}()
			wg.Wait()
			if tc.panics {
				if tc.name == "panic" || tc.name == "panic-no-attempt" {
					if recovered != boom {
						t.Fatalf("the panic that went on: %v, want the handler's", recovered)
					}
				}
			} else {
				if recovered != nil {
					t.Fatalf("Run panicked: %v", recovered)
				}
				if tc.want == nil && err != nil || tc.want != nil && !errors.Is(err, tc.want) {
					t.Fatalf("Run: %v, want %v", err, tc.want)
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.name == "ok"]; commits != want {
				t.Fatalf("commit called %d times, want %d", commits, want)
			}
			if o := nextOutcome(t, e, tc.name); o != tc.next {
				t.Fatalf("the key's next claim: %v, want %v", o, tc.next)
			}
		})
	}
}

// TestRunLost: a claim lost while its handler runs (the lease ended by
// the engine's clock and another worker took the key) cancels the
// handler's context (unless Uncanceled), commits nothing, returns
// ErrLeaseLost, and its give-back leaves the other worker's claim alone.
func TestRunLost(t *testing.T) {
	for _, uncanceled := range []bool{false, true} {
		t.Run(map[bool]string{false: "canceled", true: "uncanceled"}[uncanceled], func(t *testing.T) {
			ctx := context.Background()
			clock := enginetest.NewClock()
			e := runEngine(t, clock, 0)
			c := sessionClaim(t, e, "k")
			taken := make(chan engine.Claim, 1)
			commits := 0
			err := e.Run(ctx, &c, engine.SessionOptions{Uncanceled: uncanceled, NoAttempt: true}, func(hctx context.Context) error {
				clock.Add(time.Second) // the lease ends
				o, err := e.Claim(ctx, []byte("k"))
				if err != nil || o.Outcome != engine.New {
					t.Errorf("another worker's claim: %v, %v", o.Outcome, err)
				}
				taken <- o
				select {
				case <-hctx.Done():
					if uncanceled {
						t.Error("the handler's context was canceled with Uncanceled")
					}
				case <-time.After(300 * time.Millisecond):
					if !uncanceled {
						t.Error("the handler's context was not canceled when the claim was lost")
					}
				}
				return nil
			}, func(context.Context, engine.Claim) error { commits++; return nil })
			if !errors.Is(err, engine.ErrLeaseLost) || commits != 0 {
				t.Fatalf("Run: %v, %d commits; want ErrLeaseLost and none", err, commits)
			}
			other := <-taken
			if o := nextOutcome(t, e, "k"); o != engine.InFlight {
				t.Fatalf("after the lost session's give-back: %v, want InFlight (the other worker's claim)", o)
			}
			if err := e.Commit(ctx, other); err != nil {
				t.Fatalf("the other worker's commit: %v", err)
			}
		})
	}
}

// TestRunGiveBackFailed: a give-back that fails (the engine closed under
// the handler) is told to GiveBackFailed and joined to the handler's
// error.
func TestRunGiveBackFailed(t *testing.T) {
	e := runEngine(t, nil, 1)
	c := sessionClaim(t, e, "k")
	boom := errors.New("handler failed")
	var told error
	err := e.Run(context.Background(), &c, engine.SessionOptions{GiveBackFailed: func(err error) { told = err }},
		func(context.Context) error { _ = e.Close(); return boom },
		func(context.Context, engine.Claim) error { t.Error("commit called"); return nil })
	if !errors.Is(err, boom) || !errors.Is(err, engine.ErrClosed) || !errors.Is(told, engine.ErrClosed) {
		t.Fatalf("Run: %v; told %v; want the handler's error and ErrClosed", err, told)
	}
}

// TestRunRefuses: Run of a claim that is not New or is another engine's,
// without a handler or a commit, or with options a heartbeat cannot keep,
// runs nothing.
func TestRunRefuses(t *testing.T) {
	e := runEngine(t, nil, 1)
	ctx := context.Background()
	c := sessionClaim(t, e, "k")
	if err := e.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	dup, _ := e.Claim(ctx, []byte("k"))
	ran := false
	handle := func(context.Context) error { ran = true; return nil }
	commit := func(context.Context, engine.Claim) error { ran = true; return nil }
	if err := e.Run(ctx, &dup, engine.SessionOptions{}, handle, commit); !errors.Is(err, engine.ErrNotClaimed) {
		t.Fatalf("Run of a Duplicate: %v", err)
	}
	if err := e.Run(ctx, nil, engine.SessionOptions{}, handle, commit); !errors.Is(err, engine.ErrNotClaimed) {
		t.Fatalf("Run of nil: %v", err)
	}
	fresh := sessionClaim(t, e, "k2")
	if err := e.Run(ctx, &fresh, engine.SessionOptions{}, nil, commit); !errors.Is(err, engine.ErrOptions) {
		t.Fatalf("Run without a handler: %v", err)
	}
	for _, o := range []engine.SessionOptions{
		{Heartbeat: engine.HeartbeatOptions{Lease: engine.DefaultWindow}},
		{Heartbeat: engine.HeartbeatOptions{Lease: -time.Second}},
		{Heartbeat: engine.HeartbeatOptions{Every: -time.Second}},
		{GiveBackTimeout: -time.Second},
	} {
		if err := e.Run(ctx, &fresh, o, handle, commit); !errors.Is(err, engine.ErrOptions) {
			t.Fatalf("Run with %+v: %v, want ErrOptions", o, err)
		}
	}
	other := runEngine(t, nil, 1)
	if err := other.Run(ctx, &fresh, engine.SessionOptions{}, handle, commit); !errors.Is(err, engine.ErrNotClaimed) {
		t.Fatalf("Run of another engine's claim: %v, want ErrNotClaimed", err)
	}
	if ran {
		t.Fatal("something ran")
	}
}

// TestDoResultOutlivesHeartbeats: a DoResult handler running several
// heartbeats long commits its result; under -race its claim is read by
// nothing but the heartbeat while the handler runs (the result check reads
// the result alone: a check of the whole claim raced the heartbeat's
// write of its lease). The lease is long enough that a beat delayed by a
// loaded machine (half the lease, 300 ms) still comes before it ends: a
// 20 ms lease lost its claim to a 10 ms scheduling stall under -race.
func TestDoResultOutlivesHeartbeats(t *testing.T) {
	o := engine.Options{Lease: 600 * time.Millisecond, Logger: quiet}
	enginetest.SetDir(&o, t.TempDir())
	e := open(t, o)
	t.Cleanup(func() { _ = e.Close() })
	for i := range 3 {
		out, res, err := e.DoResult(context.Background(), []byte{byte('a' + i)}, func(context.Context) ([]byte, error) {
			time.Sleep(800 * time.Millisecond) // outlives its lease: beats at 300 and 600 ms keep it
			return []byte("r"), nil
		})
		if err != nil || out != engine.New || string(res) != "r" {
			t.Fatalf("DoResult: %v %q %v", out, res, err)
		}
	}
}
