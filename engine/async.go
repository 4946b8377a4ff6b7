package engine

import (
	"bytes"
	"context"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"
)

// CommitAsync commits a New claim like Commit, but returns at once: done
// runs with Commit's error once the commit is durable as configured (or has
// failed). The dones of one goroutine's commits run in the order it called
// CommitAsync, each after its commit is durable, on one goroutine shared by
// the engine: keep done short (ack the message, record an offset). It may
// call Commit or Do; not Flush or Close, which wait for it. The claim's Key
// bytes must stay unchanged until done runs. A done that panics on the
// engine's goroutine is recovered and logged, and counted in
// Stats.Calls.DonePanics; the other dones still run, in order. (A done run
// before CommitAsync returns panics on the caller's goroutine.)
//
// When Options.CommitQueue asynchronous calls are pending (written or not,
// until their done has run), CommitAsync waits for room, or until ctx ends
// (done then gets ctx's error, in order); room is made as dones run, so a
// CommitAsync made from a done needs a ctx that ends. A commit whose
// ctx has ended when its turn comes is not written. Without an exact tier
// (memory- or bloom-only) there is nothing to wait for: the commit is made
// and done runs before CommitAsync returns.
func (e *Engine) CommitAsync(ctx context.Context, c Claim, done func(error)) {
	claims := []Claim{c}
	if c.Outcome != New {
		e.commitAsync(ctx, nil, nil, done, fmt.Errorf("%w: outcome %v", ErrNotClaimed, c.Outcome))
		return
	}
	e.commitAsync(ctx, claims, nil, done, nil)
}

// CommitBatchAsync is CommitBatchWith (writes may be nil) that returns at
// once, as CommitAsync does; done gets CommitBatchWith's error. claims is
// copied; the claims' Key bytes and the writes' bytes must stay unchanged
// until done runs.
func (e *Engine) CommitBatchAsync(ctx context.Context, claims []Claim, writes []Write, done func(error)) {
	if len(writes) > 0 {
		if err := e.serve(NeedWrites, "CommitBatchAsync with writes"); err != nil {
			e.commitAsync(ctx, nil, nil, done, err)
			return
		}
	}
	e.commitAsync(ctx, append([]Claim(nil), claims...), writes, done, nil)
}

func (e *Engine) commitAsync(ctx context.Context, claims []Claim, writes []Write, done func(error), failed error) {
	if done == nil {
		done = func(error) {}
	}
	if failed == nil {
		failed = e.checkResults(claims)
	}
	for i := range claims {
		// The caller may reuse its result's buffer once this returns: the
		// queue writes a copy (claims is already the queue's own).
		if r := claims[i].Result; len(r) > 0 {
			claims[i].Result = bytes.Clone(r)
		}
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if e.queue == nil {
		if failed == nil {
			failed = e.commit(ctx, claims, nil, writes)
		}
		done(failed)
		return
	}
	q := e.queue
	p := &pending{ctx: ctx, claims: claims, writes: writes, done: done, err: failed}
	if err := q.reserve(ctx, p); err != nil && p.err == nil {
		p.err = err // no room before ctx ended: its done says so, in order
	}
	if p.err == nil {
		if err := q.push(p); err == nil {
			return
		}
		p.err = ErrClosed
	}
	if !q.refuse(p) {
		// The queue has ended: every earlier done has run.
		if p.slot {
			<-q.slots
		}
		done(p.err)
	}
}

// Flush returns once every commit enqueued before it is durable (or
// failed) and its done has run: before a partition is revoked, or at
// shutdown. It returns ctx's error if ctx ends first. Close flushes. Do not
// call it from a done.
func (e *Engine) Flush(ctx context.Context) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if e.queue == nil {
		return ctx.Err()
	}
	p := &pending{ctx: ctx, flush: make(chan struct{})}
	if err := e.queue.push(p); err != nil {
		return err
	}
	select {
	case <-p.flush:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// queued commits claims through the queue and waits for the result, or
// until ctx ends: the commit may then still be written (its outcome is
// unknown, as with a reply lost on the way back).
func (e *Engine) queued(ctx context.Context, claims []Claim, errs []error, writes []Write) error {
	if errs != nil && len(errs) != len(claims) {
		return fmt.Errorf("%w: %d claims, %d errors", ErrBatch, len(claims), len(errs))
	}
	if ctx == nil {
		ctx = context.Background()
	}
	clear(errs)
	if len(writes) == 0 && !anyNew(claims) {
		return nil
	}
	// The caller waits: the queue keeps its own copies, so that a caller
	// that stops waiting may reuse its slices.
	p := &pending{ctx: ctx, claims: append([]Claim(nil), claims...), writes: append([]Write(nil), writes...), wait: make(chan error, 1)}
	if errs != nil {
		p.errs = make([]error, len(errs))
	}
	if err := e.queue.push(p); err != nil {
		return err
	}
	select {
	case err := <-p.wait:
		copy(errs, p.errs)
		return err
	case <-ctx.Done():
		err := fmt.Errorf("stopped waiting for a queued commit, which may still be written: %w", ctx.Err())
		if e.where == tier.ClaimsInStore {
			// As a reply lost on the way back from a shared tier.
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return fmt.Errorf("tierdedup: %w", err)
	}
}

func anyNew(claims []Claim) bool {
	for i := range claims {
		if claims[i].Outcome == New {
			return true
		}
	}
	return false
}
