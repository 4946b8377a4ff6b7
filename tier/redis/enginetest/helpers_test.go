package enginetest_test

import (
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// The helpers these tests share with the engine's (internal/enginetest).
type (
	fakeClock    = enginetest.Clock
	hookClock    = enginetest.HookClock
	forgetResult = enginetest.ForgetResult
)

var (
	quiet         = enginetest.Quiet
	newClock      = enginetest.NewClock
	forgetAsync   = enginetest.ForgetAsync
	loseMarkReply = enginetest.LoseMarkReply
	redisBackend  = enginetest.RedisBackend
	pgBackend     = enginetest.PGBackend
	ageRedis      = enginetest.AgeRedis
)

func open(t testing.TB, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.Open(t, o)
}

func openRedis(t *testing.T, c goredis.UniversalClient, prefix string, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.OpenRedis(t, c, prefix, o)
}

func postgresPool(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }

func ptr[T any](v T) *T { return enginetest.Ptr(v) }

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start for a kill test) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"redis-archive":               redisArchiveChild,         // TestKillWhileArchivingRedis
		enginetest.ProcessesChildName: enginetest.ProcessesChild, // TestRedisProcessesRace
	})
}
