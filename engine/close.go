package engine

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"github.com/tierdedup/tierdedup/tier/bloom"
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
	e.stop()
	e.workers.Wait()
	var errs []error
	healthy := e.store == nil || e.store.Broken() == nil
	if e.sealWake != nil && healthy {
		// No call is in flight: seal what closed since the sealer's last
		// pass (a crash then needs to rebuild only the open partition).
		e.seal(context.Background())
	}
	hw := e.highWater.Load()
	meta := bloom.SnapshotMeta{Kind: bloom.SnapshotState, Secret: e.secret, HighWater: hw}
	if e.store != nil && healthy {
		// Persist the high-water clock, so time does not run back across a
		// clean restart, then seal the state the snapshot describes: no
		// write follows.
		err := e.store.Drop(e.parts.Oldest(e.current.Load()), hw)
		if err == nil {
			meta = bloom.SnapshotMeta{Kind: bloom.SnapshotCache, StoreID: e.store.Layout().ID, HighWater: hw}
			meta.Epoch, err = e.store.SealSnapshot()
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", ErrStorage, err))
			healthy = false
		}
	}
	if e.snapshots != nil && e.warm.Load() && healthy {
		if err := e.snapshots.save(e.bloom, meta); err != nil {
			errs = append(errs, fmt.Errorf("tierdedup: saving bloom snapshot: %w", err))
		}
	}
	if e.dirLock != nil {
		_ = e.dirLock.Close()
	}
	closed := true
	if e.exact != nil {
		if err := e.exact.Close(); err != nil {
			errs = append(errs, e.tierError(err))
			closed = false // the store may still hold its directory
		}
	}
	if closed {
		e.releaseDir()
	}
	return errors.Join(errs...)
}

// rebuildGate, when set by tests, holds rebuilds back until it is closed.
var rebuildGate atomic.Pointer[chan struct{}]
