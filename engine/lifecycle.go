package engine

import (
	"context"
	"fmt"
)

// A call holds the engine open from its start to its end: Close waits
// for every call in progress (it takes e.life's write lock). A call made
// of several steps (MarkBatch's claim, commit and give-back; a token's
// read and mark) holds it once for all of them (hold), so Close cannot
// fall between two steps and strand what the first one took: the steps
// run with the context hold returns, and enter finds the engine already
// held for them instead of waiting behind Close.
type heldKey struct{}

// hold enters a call of several steps. Its steps run with the returned
// context; done ends the call.
func (e *Engine) hold(ctx context.Context) (held context.Context, done func(), err error) {
	locked, err := e.admit(ctx)
	if err != nil {
		return nil, nil, err
	}
	if !locked {
		return ctx, func() {}, nil // inside a held call already
	}
	return context.WithValue(ctx, heldKey{}, e), e.life.RUnlock, nil
}

// admit enters a call unless the engine is closed, and reports whether it
// took the lifecycle lock (false inside a held call), for leave.
func (e *Engine) admit(ctx context.Context) (locked bool, err error) {
	if ctx == nil {
		return false, fmt.Errorf("%w: a nil context.Context (pass context.Background())", ErrOptions)
	}
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if h, _ := ctx.Value(heldKey{}).(*Engine); h == e {
		return false, nil
	}
	e.life.RLock()
	if e.life.closed {
		e.life.RUnlock()
		return false, ErrClosed
	}
	return true, nil
}

// leave ends a call admit entered.
func (e *Engine) leave(locked bool) {
	if locked {
		e.life.RUnlock()
	}
}

// enter starts a call that may answer New or write: it fails once the
// engine is closed or the store has failed.
func (e *Engine) enter(ctx context.Context) (locked bool, err error) {
	if locked, err = e.admit(ctx); err != nil {
		return false, err
	}
	if e.latch != nil {
		if err := e.latch.Broken(); err != nil {
			e.leave(locked)
			e.stats.errors.Add(1) // refused by a failed tier: a failed call
			return false, fmt.Errorf("%w: %w", ErrStorage, err)
		}
	}
	return locked, nil
}

// call is a call begun by start: its write-gate slot and whether it took
// the lifecycle lock.
type call struct {
	slot   int
	locked bool
}

// start enters a call that may answer New or write, and reads the engine's
// time; on success the caller must finish it.
func (e *Engine) start(ctx context.Context) (now int64, c call, err error) {
	if c.locked, err = e.enter(ctx); err != nil {
		return 0, call{}, err
	}
	if e.local != nil {
		c.slot = e.local.Enter() // before the time is read: see embedded.Store.Enter
	}
	if now, err = e.now(); err != nil {
		e.finish(c)
		return 0, call{}, err
	}
	return now, c, nil
}

// finish ends a call begun by start.
func (e *Engine) finish(c call) {
	if e.local != nil {
		e.local.Exit(c.slot)
	}
	e.leave(c.locked)
}

// unlessClosed runs fn unless the engine is closed.
func (e *Engine) unlessClosed(fn func() error) error {
	e.life.RLock()
	defer e.life.RUnlock()
	if e.life.closed {
		return ErrClosed
	}
	return fn()
}
