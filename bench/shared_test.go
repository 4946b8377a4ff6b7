package bench

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/pebble"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// TestCheckSharedRefuses: a run on a shared tier refuses, before it
// touches any server, what it cannot measure honestly: a stream longer
// than the window (the default span, a day, against a shorter window
// too), an archive, another configuration of tiers, a directory or a
// backend beside it, and a server that is both Redis and PostgreSQL. Every
// refusal matches ErrConfig.
func TestCheckSharedRefuses(t *testing.T) {
	ok := RunConfig{Workload: WorkloadConfig{Keys: 1000, Span: time.Hour}, Engine: engine.Options{Window: time.Hour}}
	if err := CheckShared(SharedRedis, ok); err != nil {
		t.Fatalf("a stream of one window: %v", err)
	}
	for name, rc := range map[string]RunConfig{
		"span past the window": {Workload: WorkloadConfig{Keys: 1000, Span: 2 * time.Hour}, Engine: engine.Options{Window: time.Hour}},
		"default span":         {Workload: WorkloadConfig{Keys: 1000}, Engine: engine.Options{Window: time.Hour}},
		"archive": {Workload: WorkloadConfig{Keys: 1000, Span: time.Hour},
			Engine: engine.Options{Window: time.Hour, Archive: pebble.ArchiveDir{Dir: t.TempDir()}}},
		"memory only": {Workload: WorkloadConfig{Keys: 1000, Span: time.Hour}, Engine: engine.Options{Window: time.Hour, Tiers: engine.MemoryOnly}},
		"dir":         {Workload: WorkloadConfig{Keys: 1000, Span: time.Hour}, Engine: engine.Options{Window: time.Hour, Backend: embedded.Dir(t.TempDir())}},
		"backend": {Workload: WorkloadConfig{Keys: 1000, Span: time.Hour},
			Engine: engine.Options{Window: time.Hour, Backend: redis.NewBackend(goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}), redis.Config{})}},
	} {
		if err := CheckShared(SharedPostgres, rc); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := CheckShared("memcached", ok); !errors.Is(err, ErrConfig) {
		t.Errorf("an unknown tier: %v", err)
	}
	// Run refuses before connecting: the clients here reach nothing.
	unreachable := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer unreachable.Close()
	long := ok
	long.Shared, long.Workload.Span = SharedServer{Redis: unreachable}, 2*time.Hour
	if _, err := Run(context.Background(), long); !errors.Is(err, ErrConfig) {
		t.Errorf("Run past the window: %v", err)
	}
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none") // connects lazily
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	both := ok
	both.Shared = SharedServer{Redis: unreachable, Postgres: pool}
	if _, err := Run(context.Background(), both); !errors.Is(err, ErrConfig) {
		t.Errorf("Run on Redis and PostgreSQL at once: %v", err)
	}
}
