package rabbitmqtest_test

import (
	"testing"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
)

var (
	quiet        = enginetest.Quiet
	redisBackend = enginetest.RedisBackend
	raceEnabled  = enginetest.RaceEnabled
)

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start: a consumer the test kills) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"rabbit": rabbitChild, // TestRabbitMQRedelivery
	})
}
