package enginetest_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// The helpers these tests share with the engine's (internal/enginetest).
type (
	fakeClock  = enginetest.Clock
	stepClock  = enginetest.StepClock
	fixedClock = enginetest.FixedClock
	crashFS    = enginetest.CrashFS
)

var (
	quiet      = enginetest.Quiet
	newClock   = enginetest.NewClock
	newCrashFS = enginetest.NewCrashFS
)

const day = 24 * time.Hour

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

func waitArchived(t testing.TB, e *engine.Engine) {
	t.Helper()
	enginetest.WaitArchived(t, e)
}

func postgresPool(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }

func ptr[T any](v T) *T { return enginetest.Ptr(v) }

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start for a kill test) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"archive": archiveChild, // TestKillWhileArchiving
	})
}
