package enginetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
)

// OutageLoad is four workers claiming and committing fresh keys through e
// (16 a batch, a second's deadline each) until stopped, while a test takes
// the shared tier away: what they had acknowledged, how many calls failed
// ErrUnavailable, how many fresh keys were not New, and any other error.
type OutageLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup
	// Mu guards Acked: the fresh keys whose commit returned nil.
	Mu    sync.Mutex
	Acked [][]byte
	// Unavailable counts the calls that failed ErrUnavailable or by their
	// deadline.
	Unavailable atomic.Int64
	unexpected  []error
	wrong       atomic.Int64
}

// StartOutageLoad starts the workers of an OutageLoad on e.
func StartOutageLoad(e *engine.Engine) *OutageLoad {
	l := &OutageLoad{stop: make(chan struct{})}
	for w := range 4 {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				keys := make([][]byte, 16)
				for j := range keys {
					keys[j] = fmt.Appendf(nil, "w%d-%d-%d", w, i, j)
				}
				claims := make([]engine.Claim, len(keys))
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := e.ClaimBatch(ctx, keys, nil, claims)
				if err == nil {
					for _, c := range claims {
						if c.Outcome != engine.New {
							l.wrong.Add(1)
						}
					}
					if err = e.CommitBatch(ctx, claims, nil); err == nil {
						l.Mu.Lock()
						l.Acked = append(l.Acked, keys...)
						l.Mu.Unlock()
					}
				}
				cancel()
				switch {
				case err == nil:
				case errors.Is(err, engine.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
					// The outage, or the call's second ran out while Redis
					// was down before its commit was written (the queue
					// then writes nothing and returns the caller's error).
					l.Unavailable.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					l.Mu.Lock()
					l.unexpected = append(l.unexpected, fmt.Errorf("worker %d: %w", w, err))
					l.Mu.Unlock()
					return
				}
			}
		}()
	}
	return l
}

// Finish stops the workers and reports unexpected errors and wrong answers.
func (l *OutageLoad) Finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	l.wg.Wait()
	for _, err := range l.unexpected {
		t.Error(err)
	}
	if n := l.wrong.Load(); n != 0 {
		t.Errorf("%d fresh keys were not New", n)
	}
}
