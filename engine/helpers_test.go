package engine_test

import (
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
		"crash":      enginetest.CrashChild,                                  // TestMatrixKilledChildReopen
		"nilctx":     nilContextChild,                                        // TestCommitNilContext
		"durable":    durableChild,                                           // TestDurableClaimsSurviveSIGKILL
		"slidecrash": func(spec string) int { return slideCrashChild(spec) }, // TestSlidingRefreshSurvivesKill
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
