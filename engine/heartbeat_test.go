package engine_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// TestDoKeepsItsClaim: a handler running five leases long keeps its key:
// every claim of it meanwhile is InFlight, never a second New, and Do
// commits at the end. (Without the heartbeat the lease ends after 400 ms
// and another worker runs the key again. A beat comes every half lease:
// the lease is long enough that a loaded machine's scheduling stall under
// -race does not outlast half of it.)
func TestDoKeepsItsClaim(t *testing.T) {
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Lease: 400 * time.Millisecond, Window: time.Minute, Partition: 10 * time.Second, Logger: quiet})
	defer e.Close()
	ctx := context.Background()
	key := []byte("long-job")
	var seconds atomic.Int64
	stop := make(chan struct{})
	checked := make(chan error, 1)
	go func() {
		var err error
		defer func() { checked <- err }()
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			c, cerr := e.Claim(ctx, key)
			switch {
			case cerr != nil:
				err = cerr
				return
			case c.Outcome == engine.New:
				err = errors.New("a second worker got the key New while the first ran")
				_ = e.Release(ctx, c)
				return
			}
			seconds.Add(1)
		}
	}()
	o, err := e.Do(ctx, key, func(ctx context.Context) error {
		time.Sleep(2 * time.Second)
		return ctx.Err()
	})
	close(stop)
	if cerr := <-checked; cerr != nil {
		t.Fatal(cerr)
	}
	if o != engine.New || err != nil {
		t.Fatalf("Do: %v, %v", o, err)
	}
	if seconds.Load() < 10 {
		t.Fatalf("only %d claims were tried while the handler ran", seconds.Load())
	}
	if o, err := e.MarkIfAbsent(ctx, key); o != engine.Duplicate || err != nil {
		t.Fatalf("after Do: %v, %v", o, err)
	}
	if st := e.Stats(); st.Calls.LeaseLost != 0 {
		t.Fatalf("%d leases lost", st.Calls.LeaseLost)
	}
}

// TestHeartbeatLostCancelsAndCommitsNothing: a claim taken over while its
// handler runs (its lease ended by the clock, another worker claimed the
// key) cancels the handler's context at the next beat; Do then returns
// ErrLeaseLost and commits nothing over the other worker's claim, which
// commits.
func TestHeartbeatLostCancelsAndCommitsNothing(t *testing.T) {
	clock := enginetest.NewClock()
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Clock: clock, Lease: 200 * time.Millisecond, Window: time.Minute, Partition: 10 * time.Second, Logger: quiet})
	defer e.Close()
	ctx := context.Background()
	key := []byte("taken-over")
	var other engine.Claim
	o, err := e.Do(ctx, key, func(hctx context.Context) error {
		clock.Add(time.Second) // the lease ends
		var err error
		if other, err = e.Claim(ctx, key); err != nil || other.Outcome != engine.New {
			t.Errorf("the other worker's claim: %v, %v", other.Outcome, err)
		}
		select {
		case <-hctx.Done():
			return nil // the handler stops, as it should, and says it did its work
		case <-time.After(5 * time.Second):
			return errors.New("the handler's context was not canceled")
		}
	})
	if o != engine.New || !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("Do of a claim taken over: %v, %v; want New, ErrLeaseLost", o, err)
	}
	// Nothing was committed or given back over the other worker's claim.
	if err := e.Commit(ctx, other); err != nil {
		t.Fatalf("the other worker's commit: %v", err)
	}
	if o, err := e.MarkIfAbsent(ctx, key); o != engine.Duplicate || err != nil {
		t.Fatalf("after the other worker's commit: %v, %v", o, err)
	}
}

// TestHeartbeatStopBeforeFirstBeat: a heartbeat stopped before its first
// beat extends nothing and reports nothing lost; Stop may be called again.
func TestHeartbeatStopBeforeFirstBeat(t *testing.T) {
	e := open(t, engine.Options{Backend: embedded.Dir(t.TempDir()), Logger: quiet})
	defer e.Close()
	ctx := context.Background()
	c, err := e.Claim(ctx, []byte("quick"))
	if err != nil || c.Outcome != engine.New {
		t.Fatal(c.Outcome, err)
	}
	until := c.LeaseUntil
	var beats atomic.Int64
	hb, hctx := e.Keep(ctx, &c, engine.HeartbeatOptions{Beat: func() { beats.Add(1) }})
	if err := hb.Stop(); err != nil || hb.Stop() != nil {
		t.Fatalf("Stop: %v", err)
	}
	if beats.Load() != 0 || c.LeaseUntil != until {
		t.Fatalf("%d beats, lease moved from %d to %d", beats.Load(), until, c.LeaseUntil)
	}
	if hctx.Err() == nil {
		t.Fatal("the handler's context outlives Stop")
	}
	if err := e.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
}
