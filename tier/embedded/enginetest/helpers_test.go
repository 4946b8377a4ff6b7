package enginetest_test

import (
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

// The helpers these tests share with the engine's (internal/enginetest).
type (
	fakeClock = enginetest.Clock
	crashFS   = enginetest.CrashFS
)

var (
	quiet      = enginetest.Quiet
	newClock   = enginetest.NewClock
	newCrashFS = enginetest.NewCrashFS

	claimEach    = enginetest.ClaimEach
	importExport = enginetest.ImportExport
	readFile     = enginetest.ReadFile
	writeFile    = enginetest.WriteFile
	setDir       = enginetest.SetDir
	setFS        = enginetest.SetFS
	waitFor      = enginetest.WaitFor
	waitWarm     = enginetest.WaitWarm
)

const day = 24 * time.Hour

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

func ptr[T any](v T) *T { return enginetest.Ptr(v) }

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start for a crash or kill test) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"crash": enginetest.CrashChild, // TestCrashRecovery
		"fault": faultChild,            // TestStorageFaultChild
		"stall": stallChild,            // TestKillDuringCheckpointAndMove
	})
}
