package engine_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// fakeClock is an injected clock that tests move by hand.
type fakeClock = enginetest.Clock

func newClock() *fakeClock { return enginetest.NewClock() }

var quiet = enginetest.Quiet

const day = 24 * time.Hour

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start for a crash or multi-process test) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"crash":   enginetest.CrashChild, // TestMatrixKilledChildReopen
		"redis":   redisChild,            // TestRedisProcessesRace, TestPostgresProcessesRace
		"nilctx":  nilContextChild,       // TestCommitNilContext
		"durable": durableChild,          // TestDurableClaimsSurviveSIGKILL
	})
}

// open opens an engine of o, failing t if it cannot (enginetest.Open).
// waitArchived waits until no closed partition waits for the archive.
func waitArchived(t testing.TB, e *engine.Engine) { t.Helper(); enginetest.WaitArchived(t, e) }

func ptr[T any](v T) *T { return enginetest.Ptr(v) }

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

// outageLoad is four workers claiming and committing fresh keys through e
// (16 a batch, a second's deadline each) until stopped, while a test takes
// the shared tier away: what they had acknowledged, how many calls failed
// ErrUnavailable, how many fresh keys were not New, and any other error.
type outageLoad struct {
	stop        chan struct{}
	wg          sync.WaitGroup
	mu          sync.Mutex
	acked       [][]byte
	unexpected  []error
	unavailable atomic.Int64
	wrong       atomic.Int64
}

func startOutageLoad(e *engine.Engine) *outageLoad {
	l := &outageLoad{stop: make(chan struct{})}
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
						l.mu.Lock()
						l.acked = append(l.acked, keys...)
						l.mu.Unlock()
					}
				}
				cancel()
				switch {
				case err == nil:
				case errors.Is(err, engine.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
					// The outage, or the call's second ran out while Redis
					// was down before its commit was written (the queue
					// then writes nothing and returns the caller's error).
					l.unavailable.Add(1)
					time.Sleep(5 * time.Millisecond)
				default:
					l.mu.Lock()
					l.unexpected = append(l.unexpected, fmt.Errorf("worker %d: %w", w, err))
					l.mu.Unlock()
					return
				}
			}
		}()
	}
	return l
}

// finish stops the workers and reports unexpected errors and wrong answers.
func (l *outageLoad) finish(t *testing.T) {
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

// checkDoneOrder fails unless every worker's dones (got[w], the indices
// of its commits in the order their dones ran) ran in its enqueue order.
func checkDoneOrder(t *testing.T, got [][]int) {
	t.Helper()
	for w, seq := range got {
		for i, v := range seq {
			if v != i {
				t.Fatalf("worker %d: done %d ran in place %d", w, v, i)
			}
		}
	}
}

// crashFS is a crashable in-memory filesystem that copies where Pebble
// would link (enginetest.CrashFS).
type crashFS = enginetest.CrashFS

func newCrashFS() crashFS { return enginetest.NewCrashFS() }

var claimEach = enginetest.ClaimEach
