package postgres

import (
	"context"
	"sync"
	"time"
)

// sweeper runs at most one sweep at a time in the background, one more if
// asked during a sweep, and stops at Close.
type sweeper struct {
	blocks int64 // blocks per statement
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	state  struct {
		running, again, stopped bool
		at                      time.Time
		deleted                 int64
		err                     error
	}
}

func (w *sweeper) init(blocks int64) {
	w.blocks = blocks
	w.ctx, w.cancel = context.WithCancel(context.Background())
}

// start runs sweep in the background, or once more after the running one.
func (w *sweeper) start(sweep func(context.Context) (int64, error)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.state.stopped {
		return
	}
	if w.state.running {
		w.state.again = true
		return
	}
	w.state.running = true
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			n, err := sweep(w.ctx)
			w.mu.Lock()
			w.state.at, w.state.deleted, w.state.err = time.Now(), n, err
			if !w.state.again || w.state.stopped {
				w.state.running = false
				w.mu.Unlock()
				return
			}
			w.state.again = false
			w.mu.Unlock()
		}
	}()
}

func (w *sweeper) last() (time.Time, int64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.state.at, w.state.deleted, w.state.err
}

// stop cancels a running sweep and waits for it; no sweep starts after.
func (w *sweeper) stop() {
	w.mu.Lock()
	w.state.stopped = true
	w.mu.Unlock()
	w.cancel()
	w.wg.Wait()
}
