package enginetest_test

import (
	"testing"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// The helpers these tests share with the engine's (internal/enginetest).
type fakeClock = enginetest.Clock

var (
	quiet       = enginetest.Quiet
	newClock    = enginetest.NewClock
	agePostgres = enginetest.AgePostgres
	pgTable     = enginetest.PGTable
	pgRows      = enginetest.PGRows
	claimEach   = enginetest.ClaimEach
)

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start for a multi-process test) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		enginetest.ProcessesChildName: enginetest.ProcessesChild, // TestPostgresProcessesRace
	})
}
