package engine

import (
	"context"
	"errors"
	"sync"
	"time"
)

// HeartbeatOptions say how a Heartbeat keeps a claim (Engine.Keep).
type HeartbeatOptions struct {
	// Lease is each extension: the claim's lease ends Lease after the
	// beat (Extend's d). Zero: Options.Lease.
	Lease time.Duration
	// Every is the longest time between two beats (a broker's
	// acknowledgement deadline, halved). Zero: none. A beat always comes
	// before half of the lease left has passed, so the claim never ends
	// between two beats while the tier answers.
	Every time.Duration
	// Beat, if set, is called before each extension: a broker's
	// in-progress signal.
	Beat func()
	// Extended, if set, is told of each extension that succeeded, and
	// Failed of each that failed with another error than ErrLeaseLost
	// (the tier briefly unreachable): the lease keeps its end, and the
	// next beat tries again a quarter of the interval later.
	Extended func()
	Failed   func(error)
}

// Heartbeat keeps a New claim's lease alive while its handler runs; Run,
// the claim session of Do and of the integrations (HTTP, Watermill, NATS),
// keeps its claim with one. Stop ends it.
type Heartbeat struct {
	quit   chan struct{}
	done   chan struct{} // closed when run returns
	first  *time.Timer   // starts run: no goroutine for a handler done before its first beat
	cancel context.CancelFunc
	once   sync.Once
	lost   bool
}

// Keep starts a heartbeat for c, which must be New: every half of the
// lease left (or Every, if sooner) it extends the claim by o.Lease. It
// returns the heartbeat and ctx, canceled once the claim is lost
// (ErrLeaseLost: another worker may hold the key; the handler should
// stop, and must not commit). Extensions run in ctx's values without its
// cancellation, each bounded by the lease left: a handler whose caller
// went away keeps its claim until it returns. c belongs to the heartbeat
// (it updates c.LeaseUntil) until Stop returns.
func (e *Engine) Keep(ctx context.Context, c *Claim, o HeartbeatOptions) (*Heartbeat, context.Context) {
	if o.Lease <= 0 {
		o.Lease = time.Duration(e.lease)
	}
	hctx, cancel := context.WithCancel(ctx)
	h := &Heartbeat{quit: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	bctx := context.WithoutCancel(ctx)
	h.first = time.AfterFunc(e.interval(c, o.Every), func() { h.run(bctx, e, c, o) })
	return h, hctx
}

// Stop ends the heartbeat and returns ErrLeaseLost if the claim was lost
// meanwhile; then c is the caller's again. It may be called more than
// once.
func (h *Heartbeat) Stop() error {
	h.once.Do(func() {
		close(h.quit)
		if !h.first.Stop() {
			<-h.done // the first beat fired: run owns c until it returns
		}
		h.cancel()
	})
	if h.lost {
		return ErrLeaseLost
	}
	return nil
}

// left is how much of c's lease is left, by the engine's clock.
func (e *Engine) left(c *Claim) time.Duration {
	now, _ := e.nowNoRotate()
	return time.Duration(c.LeaseUntil - now)
}

// interval is how long until the next beat: half of c's lease left, at
// most every (0: no bound), at least a millisecond.
func (e *Engine) interval(c *Claim, every time.Duration) time.Duration {
	d := e.left(c) / 2
	if every > 0 && every < d {
		d = every
	}
	return max(d, time.Millisecond)
}

// run beats now, then every interval until quit.
func (h *Heartbeat) run(ctx context.Context, e *Engine, c *Claim, o HeartbeatOptions) {
	defer close(h.done)
	var wait time.Duration // the first beat is due: the timer that started run fired
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-h.quit:
				t.Stop()
				return
			case <-t.C:
			}
		}
		select {
		case <-h.quit:
			return
		default:
		}
		if o.Beat != nil {
			o.Beat()
		}
		ectx, cancel := context.WithTimeout(ctx, max(e.left(c), 10*time.Millisecond))
		err := e.Extend(ectx, c, o.Lease)
		cancel()
		switch {
		case errors.Is(err, ErrLeaseLost):
			h.lost = true
			h.cancel()
			<-h.quit
			return
		case errors.Is(err, ErrOptions), errors.Is(err, ErrNotClaimed), errors.Is(err, ErrClosed):
			// No later beat can do better: the claim keeps its lease.
			if o.Failed != nil {
				o.Failed(err)
			}
			<-h.quit
			return
		case err != nil:
			if o.Failed != nil {
				o.Failed(err)
			}
			// The lease keeps its end: again in a while, not in a loop.
			wait = max(e.interval(c, o.Every)/4, time.Millisecond)
		default:
			if o.Extended != nil {
				o.Extended()
			}
			wait = e.interval(c, o.Every)
		}
	}
}
