package engine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Do runs fn once for key in the default namespace; see Namespace.Do.
func (e *Engine) Do(ctx context.Context, key []byte, fn func(context.Context) error) (Outcome, error) {
	return e.def.Do(ctx, key, fn)
}

// DoResult runs fn once for key in the default namespace and stores its
// result; see Namespace.DoResult.
func (e *Engine) DoResult(ctx context.Context, key []byte, fn func(context.Context) ([]byte, error)) (Outcome, []byte, error) {
	return e.def.DoResult(ctx, key, fn)
}

// giveBackMargin bounds how long giving claims back (the Release after a
// failed handler, or of a batch that did not commit) may outlive the
// caller's deadline: the give-back must run even when the caller's context
// has ended, but never hang on a server that stopped answering.
const giveBackMargin = 250 * time.Millisecond

// giveBackContext is ctx without its cancellation, bounded by its deadline
// (or now, if that has passed) plus giveBackMargin.
func giveBackContext(ctx context.Context) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ctx)
	d, ok := ctx.Deadline()
	if !ok {
		return base, func() {}
	}
	if now := time.Now(); d.Before(now) {
		d = now
	}
	return context.WithDeadline(base, d.Add(giveBackMargin))
}

// Do runs fn for key exactly once inside the window: it claims the key,
// runs fn if the claim is New, then commits (fn returned nil) or releases
// (fn failed or panicked, so a redelivery can run it). While fn runs, its
// claim's lease is kept (Keep), however long fn takes; a claim lost anyway
// (the tier let it go, another worker took the key) cancels fn's context,
// and Do returns ErrLeaseLost, committing nothing. It returns the claim's
// outcome and fn's error or the engine's. Ack the message when the error is
// nil and the outcome is New or Duplicate; leave InFlight for redelivery;
// dead-letter Conflict and Poison.
func (n *Namespace) Do(ctx context.Context, key []byte, fn func(context.Context) error) (Outcome, error) {
	o, _, err := n.do(ctx, key, fn, nil)
	return o, err
}

// DoResult is Do for a handler with a result to give every duplicate: fn
// runs once inside the window, its result (at most Options.MaxResultSize
// bytes) is committed with the key, and a later call for the key returns
// the stored result with Duplicate (or Conflict) instead of running fn, as
// an API answers a retried request with its original response. On New it
// returns fn's result. A result too long is ErrResultTooLarge, and the
// claim is released, as for a failed fn.
func (n *Namespace) DoResult(ctx context.Context, key []byte, fn func(context.Context) ([]byte, error)) (Outcome, []byte, error) {
	return n.do(ctx, key, nil, fn)
}

// Tracer is told of each Do and DoResult: a span per call, for a tracing
// system. The engine imports none; integrations/oteldedup adapts an
// OpenTelemetry TracerProvider.
type Tracer interface {
	// Start is called as Do or DoResult (op) begins in the namespace
	// called namespace ("" is the default one); the key is not given, since
	// it may be personal data. The context it returns is the one the
	// handler runs in, so the handler's own spans nest under the call's.
	// end is called exactly once, as the call returns, with its outcome
	// (zero when the call failed before a claim answered), whether the
	// handler ran, and the error the call returns; when the handler
	// panicked, with New and an error saying so, before the panic goes on
	// to the caller.
	Start(ctx context.Context, op, namespace string) (_ context.Context, end func(o Outcome, ran bool, err error))
}

// errHandlerPanicked is what a Tracer's end is told when the handler
// panicked: the panic itself goes on to the caller.
var errHandlerPanicked = errors.New("tierdedup: the handler panicked")

// do is Do (fn) or DoResult (rfn), told to the Tracer if there is one.
func (n *Namespace) do(ctx context.Context, key []byte, fn func(context.Context) error, rfn func(context.Context) ([]byte, error)) (o Outcome, result []byte, err error) {
	t := n.e.opts.Tracer
	if t == nil {
		return n.run(ctx, key, fn, rfn)
	}
	op := "Do"
	if rfn != nil {
		op = "DoResult"
	}
	var end func(Outcome, bool, error)
	ran, panicked := false, true
	ctx, end = t.Start(ctx, op, n.name)
	defer func() {
		if panicked {
			// The handler ran, its claim New, and panicked (the claim was
			// given back on the way out); or the engine did, before.
			var po Outcome
			if ran {
				po = New
			}
			end(po, ran, errHandlerPanicked)
			return
		}
		end(o, ran, err)
	}()
	if fn != nil {
		inner := fn
		fn = func(ctx context.Context) error { ran = true; return inner(ctx) }
	} else {
		inner := rfn
		rfn = func(ctx context.Context) ([]byte, error) { ran = true; return inner(ctx) }
	}
	o, result, err = n.run(ctx, key, fn, rfn)
	panicked = false
	return o, result, err
}

// run claims key, runs fn or rfn if New, and commits or releases.
func (n *Namespace) run(ctx context.Context, key []byte, fn func(context.Context) error, rfn func(context.Context) ([]byte, error)) (o Outcome, result []byte, err error) {
	if rfn != nil {
		if err := n.e.serve(NeedResults, "DoResult"); err != nil {
			return 0, nil, err // before claiming: fn must not run for a result nothing can keep
		}
	}
	claimed, err := n.Claim(ctx, key)
	if err != nil || claimed.Outcome != New {
		return claimed.Outcome, claimed.Result, err
	}
	// A copy the session holds (it escapes): a duplicate allocates
	// nothing for it.
	c := claimed
	committing := false
	err = n.e.Run(ctx, &c, SessionOptions{}, func(hctx context.Context) (err error) {
		if rfn != nil {
			c.Result, err = rfn(hctx)
			if err == nil {
				// c.Result alone: the heartbeat writes c's lease meanwhile.
				err = n.e.checkResult(0, c.Result, false)
			}
			return err
		}
		return fn(hctx)
	}, func(ctx context.Context, c Claim) error {
		committing = true
		return n.e.Commit(ctx, c)
	})
	if !committing {
		return New, nil, err // not run to its end: no result to give
	}
	return New, c.Result, err
}

// checkResults refuses a commit call before anything is written when a New
// claim's Result is too long, or the tiers cannot store one.
func (e *Engine) checkResults(claims []Claim) error {
	for i := range claims {
		c := &claims[i]
		if c.Outcome != New {
			continue
		}
		if err := e.checkResult(i, c.Result, c.advance); err != nil {
			return err
		}
	}
	return nil
}

// checkResult is checkResults for the New claim i of a call, by the
// fields it reads.
func (e *Engine) checkResult(i int, result []byte, advance bool) error {
	if len(result) == 0 {
		return nil
	}
	if advance {
		return fmt.Errorf("%w: claim %d: an Advance claim stores its version, not a Result", ErrOptions, i)
	}
	if len(result) > e.maxResult {
		return fmt.Errorf("%w: claim %d: %d bytes, max %d (Options.MaxResultSize)", ErrResultTooLarge, i, len(result), e.maxResult)
	}
	return e.serve(NeedResults, "a commit with a Result")
}
