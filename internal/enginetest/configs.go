package enginetest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/redis/redistest"
)

// Config is one of the engine's configurations: its tiers, what it
// promises, and how a test reaches fresh storage of its own. Configs is
// the one list of them; every engine test that runs "each
// configuration" picks from it (Pick) and adds only how it drives them.
type Config struct {
	Name  string
	Tiers engine.Tiers
	// Shared: claims and commits live in a shared tier (Redis,
	// PostgreSQL) that other engines see.
	Shared bool
	// Durable: a clean reopen keeps what was committed.
	Durable bool
	// Exact: never answers Duplicate for a key first seen (Bloom-only
	// may: a false positive).
	Exact bool
	// New returns fresh storage of this configuration for one test; name
	// is unique to it (a key prefix, a table, a directory).
	New func(t testing.TB, name string) *Storage
}

// Embedded reports the embedded store (memory + Bloom + Pebble).
func (c Config) Embedded() bool { return c.Tiers == engine.Default && !c.Shared }

// Storage is one configuration's storage in one test.
type Storage struct {
	// Redis is the server a Redis configuration runs on (to pause or
	// stop it), else nil.
	Redis *redistest.Server
	// Age makes a shared tier's own clock follow a jump of the test's
	// (it expires leases and windows on its own clock); nil for the
	// local configurations.
	Age   func(context.Context, time.Duration) error
	apply func(o engine.Options, w Wrap) engine.Options
}

// Wrap is what a test puts between an engine and its storage; the zero
// Wrap puts nothing.
type Wrap struct {
	// FS is the embedded store's filesystem (its directory is then "db"
	// on it).
	FS vfs.FS
	// Redis are the Redis client's options (its address is the
	// server's); Hook, when set, sees every command.
	Redis     *goredis.Options
	RedisHook goredis.Hook
	// DB wraps the PostgreSQL pool.
	DB func(*pgxpool.Pool) postgres.DB
}

// StorageOf is storage a test builds itself (a tier on other servers):
// apply points options at it, age ages it (nil: a local one).
func StorageOf(apply func(engine.Options, Wrap) engine.Options, age func(context.Context, time.Duration) error) *Storage {
	return &Storage{apply: apply, Age: age}
}

// Options returns o pointed at this storage: every call, the same storage,
// so a second engine (another process of a shared tier, a reopen of a
// local one) finds what the first left. The embedded store's other
// settings in o (NoSync, DurableClaims, ...) are kept; options the
// configuration refuses are left for Open to refuse.
func (s *Storage) Options(o engine.Options) engine.Options { return s.apply(o, Wrap{}) }

// Wrapped is Options with w between the engine and the storage.
func (s *Storage) Wrapped(o engine.Options, w Wrap) engine.Options { return s.apply(o, w) }

// Configs is the one list of the engine's configurations.
var Configs = []Config{
	{Name: "memory", Tiers: engine.MemoryOnly, Exact: true, New: newMemory},
	{Name: "bloom", Tiers: engine.BloomOnly, New: newBloom(false)},
	{Name: "bloom-dir", Tiers: engine.BloomOnly, Durable: true, New: newBloom(true)},
	{Name: "default", Tiers: engine.Default, Durable: true, Exact: true, New: newEmbedded},
	{Name: "redis", Tiers: engine.Default, Shared: true, Durable: true, Exact: true, New: newRedis},
	{Name: "redis-cluster", Tiers: engine.Default, Shared: true, Durable: true, Exact: true, New: newRedisCluster},
	{Name: "postgres", Tiers: engine.Default, Shared: true, Durable: true, Exact: true, New: newPostgres},
}

// Pick returns the configurations named, in the list's order; none named:
// all of them. A name not in the list panics (a typo in a test).
func Pick(names ...string) []Config {
	if len(names) == 0 {
		return Configs
	}
	var out []Config
	for _, c := range Configs {
		for _, n := range names {
			if c.Name == n {
				out = append(out, c)
			}
		}
	}
	for _, n := range names {
		if !hasConfig(out, n) {
			panic(fmt.Sprintf("enginetest: no configuration %q", n))
		}
	}
	return out
}

// Named returns the configuration called name (see Pick).
func Named(name string) Config { return Pick(name)[0] }

func hasConfig(cs []Config, name string) bool {
	for _, c := range cs {
		if c.Name == name {
			return true
		}
	}
	return false
}

// onDir is o's embedded store (its settings kept) in dir, or in "db" on
// w.FS.
func onDir(o engine.Options, dir string, w Wrap) engine.Options {
	b := BackendOf(&o)
	b.Dir = dir
	if w.FS != nil {
		b.Dir, b.FS = "db", w.FS
	}
	o.Backend = &b
	return o
}

func newMemory(testing.TB, string) *Storage {
	return &Storage{apply: func(o engine.Options, _ Wrap) engine.Options {
		o.Tiers, o.Backend = engine.MemoryOnly, nil
		return o
	}}
}

func newBloom(dir bool) func(t testing.TB, name string) *Storage {
	return func(t testing.TB, _ string) *Storage {
		path := ""
		if dir {
			path = filepath.Join(t.TempDir(), "bloom")
		}
		return &Storage{apply: func(o engine.Options, w Wrap) engine.Options {
			if dir {
				o = onDir(o, path, w)
			} else {
				b := BackendOf(&o)
				b.Dir, b.FS = "", nil
				o.Backend = &b
			}
			o.Tiers = engine.BloomOnly
			if o.ExpectedKeys == 0 {
				o.ExpectedKeys = 10000
			}
			return o
		}}
	}
}

func newEmbedded(t testing.TB, _ string) *Storage {
	dir := filepath.Join(t.TempDir(), "db")
	return &Storage{apply: func(o engine.Options, w Wrap) engine.Options {
		o = onDir(o, dir, w)
		o.Tiers = engine.Default
		if o.ExpectedKeys == 0 {
			o.ExpectedKeys = 1000
		}
		return o
	}}
}

// safeName makes name usable as a key prefix or a table name: lower-case
// letters, digits and underscores, at most 24 (PostgreSQL cuts names at
// 63 bytes; PGTable adds the time).
func safeName(name string) string {
	b := []byte(strings.ToLower(name))
	for i, c := range b {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	if len(b) > 24 {
		b = b[:24]
	}
	if len(b) == 0 || b[0] >= '0' && b[0] <= '9' {
		b = append([]byte("t_"), b...)
	}
	return string(b)
}

// redisClient is a go-redis client a Redis configuration's engine uses,
// and AddHook to put a test's hook on it.
type redisClient interface {
	goredis.UniversalClient
	AddHook(goredis.Hook)
}

// onRedis is Redis storage under a prefix of its own: client gives each
// engine its own client (as processes have) with w's options; srv is the
// single server, nil for a cluster.
func onRedis(t testing.TB, name string, srv *redistest.Server, client func(w *goredis.Options) redisClient) *Storage {
	prefix := fmt.Sprintf("%s-%d:", safeName(name), time.Now().UnixNano())
	age := client(nil)
	return &Storage{
		Redis: srv,
		Age:   func(ctx context.Context, d time.Duration) error { return AgeRedis(ctx, age, prefix, d) },
		apply: func(o engine.Options, w Wrap) engine.Options {
			c := client(w.Redis)
			if w.RedisHook != nil {
				c.AddHook(w.RedisHook)
			}
			o.Tiers, o.Backend = engine.Default, RedisBackend(c, prefix)
			return o
		},
	}
}

func newRedis(t testing.TB, name string) *Storage {
	srv := redistest.Start(t)
	return onRedis(t, name, srv, func(o *goredis.Options) redisClient { return srv.ClientWith(t, o) })
}

func newRedisCluster(t testing.TB, name string) *Storage {
	cl := redistest.StartCluster(t)
	return onRedis(t, name, nil, func(o *goredis.Options) redisClient {
		var co goredis.ClusterOptions
		if o != nil {
			co.PoolSize, co.MaxRetries, co.ReadTimeout = o.PoolSize, o.MaxRetries, o.ReadTimeout
		}
		return cl.ClientWith(t, &co)
	})
}

func newPostgres(t testing.TB, name string) *Storage {
	pool := pgtest.Pool(t)
	table := PGTable(t, pool, safeName(name))
	return &Storage{
		Age: func(ctx context.Context, d time.Duration) error { return AgePostgres(ctx, pool, table, d) },
		apply: func(o engine.Options, w Wrap) engine.Options {
			var db postgres.DB = pool
			if w.DB != nil {
				db = w.DB(pool)
			}
			o.Tiers, o.Backend = engine.Default, PGBackend(db, table)
			return o
		},
	}
}
