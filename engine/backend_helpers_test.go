package engine_test

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/embedded"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// The shared tiers, for the engine's tests that run a configuration on
// each (the tiers' own engine tests live beside them, in
// tier/redis/enginetest and tier/postgres/enginetest).
var (
	redisBackend = enginetest.RedisBackend
	pgBackend    = enginetest.PGBackend
	pgTable      = enginetest.PGTable
)

func openRedis(t *testing.T, c goredis.UniversalClient, prefix string, o engine.Options) *engine.Engine {
	t.Helper()
	return enginetest.OpenRedis(t, c, prefix, o)
}

func postgresPool(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }

// setNoSync makes o's embedded store skip fsync; nothing when o names
// none (memory-only, a shared tier).
func setNoSync(o *engine.Options, on bool) {
	if _, ok := o.Backend.(*embedded.Backend); !ok {
		return
	}
	b := backendOf(o)
	b.NoSync = on
	o.Backend = &b
}

// dirOf and fsOf return o's embedded store's directory and filesystem.
func dirOf(o engine.Options) string { return backendOf(&o).Dir }
func fsOf(o engine.Options) vfs.FS  { return backendOf(&o).FS }

var importExport = enginetest.ImportExport

var setDir = enginetest.SetDir

var setFS = enginetest.SetFS
var backendOf = enginetest.BackendOf
