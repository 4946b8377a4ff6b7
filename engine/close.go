package engine

import (
	"errors"
	"fmt"
)

// Close flushes the commit queue, waits for the calls in progress, stops
// background work, saves the Bloom filters (so the next Open is warm) and
// closes the store. It is idempotent; calls after it return ErrClosed.
//
// A call Close interrupts completes or gives back what it took in every
// tier before Close returns: a MarkBatch, IssueToken or ConsumeToken is
// waited for from its first step to its last. A claim the caller holds
// (Claim returned New, or a Do whose handler still runs) is the caller's:
// Close does not wait for it, and its Commit or Release then returns
// ErrClosed. In the embedded store such a claim is void at the next Open;
// in a shared tier it holds its key until its lease ends, as a crashed
// worker's claim does. Commit or Release every claim before Close.
func (e *Engine) Close() error {
	if e.queue != nil {
		// Every commit enqueued before Close is written and its done run.
		e.queue.close()
	}
	e.life.Lock()
	if e.life.closed {
		e.life.Unlock()
		return nil
	}
	e.life.closed = true
	e.life.Unlock()
	var archErr error
	if e.arch != nil {
		// Before the store it reads: its loop stops between partitions.
		if err := e.arch.Close(); err != nil {
			archErr = fmt.Errorf("%w: archive: %w", ErrStorage, err)
		}
	}
	if e.local != nil {
		// It stops the rebuild and the sealer, saves the filters (so the
		// next Open is warm) and closes the Pebble store.
		return errors.Join(archErr, e.local.Close(e.highWater.Load()))
	}
	if e.exact != nil {
		if err := e.exact.Close(); err != nil {
			return e.tierError(err)
		}
	}
	return nil
}
