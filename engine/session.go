package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// SessionOptions say how Run keeps and settles a claim.
type SessionOptions struct {
	// Heartbeat says how the claim's lease is kept while the handler runs
	// (Keep).
	Heartbeat HeartbeatOptions
	// Uncanceled leaves the handler's context alone when the claim is
	// lost: the handler finishes (an HTTP response already on its way),
	// and Run still commits nothing. By default the handler's context is
	// canceled at once, so it stops working for a key another worker may
	// hold.
	Uncanceled bool
	// NoAttempt: a handler that failed or panicked gives its claim back
	// without counting an attempt (UnclaimBatch), for a failure that is
	// not the message's own (an HTTP handler answering a status that is
	// not stored). By default the give-back counts one (Release), so
	// Options.MaxAttempts ends a message that keeps failing. A claim lost
	// while its handler ran is always given back counting one: the
	// handler ran, and what it did is unknown to the next.
	NoAttempt bool
	// GiveBackTimeout bounds the give-back, which runs without the
	// caller's cancellation (it must run when the caller went away). Zero:
	// until the caller's deadline, if any, and a quarter second more.
	GiveBackTimeout time.Duration
	// GiveBackFailed, if set, is told of a give-back that failed (the claim
	// then ends with its lease, and the key answers InFlight until then).
	GiveBackFailed func(error)
}

// Run is a New claim's session, the one that Do and the HTTP, Watermill
// and NATS integrations share: it keeps c's lease while handle runs
// (Keep, with o.Heartbeat), then settles the claim:
//
//   - handle returned nil and the claim was kept: Run calls commit with
//     the claim (the caller's commit: Commit, CommitAsync, CommitBatchAsync
//     with the handler's writes) and returns its error. A commit that fails
//     is never followed by a give-back: it may have landed.
//   - the claim was lost while handle ran (another worker may hold the key
//     now): nothing is committed; the claim is given back counting an
//     attempt (Release, whatever o.NoAttempt), which, fenced by its token,
//     frees only this process's memory of it; Run returns an error
//     matching ErrLeaseLost, joined with handle's.
//   - handle returned an error: the claim is given back (o.NoAttempt: with
//     no attempt counted) and Run returns handle's error, joined with the
//     give-back's if that failed.
//   - handle panicked (or called runtime.Goexit): the heartbeat stops, the
//     claim is given back, and the panic goes on to the caller with its own
//     stack; commit is not called.
//
// c must be New; it belongs to Run until Run returns (handle may set its
// Result, which commit then receives; the heartbeat writes its lease
// meanwhile, so handle must not read the whole claim). handle runs in a
// context canceled when the claim is lost (unless o.Uncanceled) or when
// ctx ends. A claim that is not New, or is another engine's, is refused
// with ErrNotClaimed, and options a heartbeat cannot keep (a lease not
// shorter than the window, a negative duration) with ErrOptions: nothing
// runs.
func (e *Engine) Run(ctx context.Context, c *Claim, o SessionOptions, handle func(context.Context) error, commit func(context.Context, Claim) error) (err error) {
	if c == nil || c.Outcome != New {
		out := "no claim"
		if c != nil {
			out = c.Outcome.String()
		}
		return fmt.Errorf("%w: Run needs a New claim (%s)", ErrNotClaimed, out)
	}
	if c.ns == nil || c.ns.e != e {
		return fmt.Errorf("%w: Run of another engine's claim", ErrNotClaimed)
	}
	if handle == nil || commit == nil {
		return fmt.Errorf("%w: Run needs a handler and a commit", ErrOptions)
	}
	if hl := o.Heartbeat.Lease; hl < 0 || int64(hl) >= e.window || o.Heartbeat.Every < 0 || o.GiveBackTimeout < 0 {
		// Caught here, not by every beat's Extend while the claim lapses.
		return fmt.Errorf("%w: SessionOptions: heartbeat lease %v (positive, shorter than the window %v), every %v, give-back timeout %v: none may be negative",
			ErrOptions, hl, time.Duration(e.window), o.Heartbeat.Every, o.GiveBackTimeout)
	}
	hb, hctx := e.Keep(ctx, c, o.Heartbeat)
	if o.Uncanceled {
		hctx = ctx
	}
	settled := false
	defer func() {
		if settled {
			return
		}
		// handle panicked or exited its goroutine: give the claim back
		// on the way out; the panic goes on.
		e.giveBack(ctx, *c, lostCounts(hb.Stop(), o))
	}()
	herr := handle(hctx)
	settled = true
	if lost := hb.Stop(); lost != nil {
		e.giveBack(ctx, *c, lostCounts(lost, o)) // fenced: frees only this process's memory
		return errors.Join(herr, lost)
	}
	if herr != nil {
		if gerr := e.giveBack(ctx, *c, o); gerr != nil {
			return errors.Join(herr, fmt.Errorf("giving the claim back: %w", gerr))
		}
		return herr
	}
	return commit(ctx, *c)
}

// lostCounts is o for the give-back of a claim whose heartbeat ended with
// lost: a lost claim's give-back counts an attempt, whatever o.NoAttempt.
func lostCounts(lost error, o SessionOptions) SessionOptions {
	if lost != nil {
		o.NoAttempt = false
	}
	return o
}

// giveBack gives c back for Run, in a context without ctx's cancellation,
// and tells o.GiveBackFailed of a failure.
func (e *Engine) giveBack(ctx context.Context, c Claim, o SessionOptions) error {
	var gctx context.Context
	var cancel context.CancelFunc
	if o.GiveBackTimeout > 0 {
		gctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), o.GiveBackTimeout)
	} else {
		gctx, cancel = giveBackContext(ctx)
	}
	defer cancel()
	var err error
	if o.NoAttempt {
		err = e.UnclaimBatch(gctx, []Claim{c}, nil)
	} else {
		err = e.Release(gctx, c)
	}
	if err != nil && o.GiveBackFailed != nil {
		o.GiveBackFailed(err)
	}
	return err
}
