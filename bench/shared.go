package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/redis"
)

// SharedPostgres is PlanInput.Shared for the PostgreSQL tier.
const SharedPostgres = "postgres"

// SharedServer is the server a run or a calibration on a shared tier
// writes to: set Redis or Postgres, not both. The caller owns the client
// or pool and closes it after the run.
//
// Every run gets keys no other run sees (a fresh Redis prefix or a fresh
// PostgreSQL table, see SharedTier) and deletes them afterwards unless Keep
// is set. Redis's memory is measured as the growth of INFO memory
// used_memory, so the figure is right only on a server nobody else writes
// to during the run.
type SharedServer struct {
	// Redis is the Redis tier's client: a *goredis.Client, or a
	// *goredis.ClusterClient (memory is then read on every master).
	Redis goredis.UniversalClient
	// Postgres is the PostgreSQL tier's pool.
	Postgres *pgxpool.Pool
	// Keep leaves the run's keys (its prefix) or its table in the server.
	Keep bool
}

// Tier returns SharedRedis, SharedPostgres, or "" when no server is set.
func (s SharedServer) Tier() string {
	switch {
	case s.Redis != nil && !tier.Nil(s.Redis):
		return SharedRedis
	case s.Postgres != nil:
		return SharedPostgres
	}
	return ""
}

// CheckShared refuses a run of rc on the shared tier named (SharedRedis
// or SharedPostgres) in a configuration that cannot be measured honestly
// (see RunConfig.Shared): Engine.Tiers other than Default, a Dir, Backend
// or Archive beside it, or a stream longer than the window. Errors match
// ErrConfig.
func CheckShared(name string, rc RunConfig) error {
	o := rc.Engine
	switch {
	case name != SharedRedis && name != SharedPostgres:
		return fmt.Errorf("%w: shared tier %q (want %s or %s)", ErrConfig, name, SharedRedis, SharedPostgres)
	case o.Tiers != engine.Default:
		return fmt.Errorf("%w: the %s tier stands behind memory: Tiers %v is not a shared configuration", ErrConfig, name, o.Tiers)
	case o.Backend != nil:
		return fmt.Errorf("%w: Engine.Backend %s beside the %s tier: set one", ErrConfig, o.Backend.Name(), name)
	case o.Archive != nil:
		return fmt.Errorf("%w: an archive is measured with the embedded store: a run's simulated time seals no partition of the %s tier, which expires keys by the server's clock", ErrConfig, name)
	}
	span := rc.Workload.Span
	if span == 0 {
		span = 24 * time.Hour // WorkloadConfig's default
	}
	if w := o.WithDefaults().Window; span > w {
		return fmt.Errorf("%w: the %s tier expires keys by the server's clock, not the stream's simulated one: a stream over %v, longer than the window %v, would leave keys in the server that a real one would have expired (keep the span within the window)",
			ErrConfig, name, span, w)
	}
	return nil
}

// TiersName is the name of rc's configuration, as Result.Tiers reports
// it: memory+ the shared tier's name with RunConfig.Shared, otherwise the
// engine options'.
func (rc *RunConfig) TiersName() string {
	if t := rc.Shared.Tier(); t != "" {
		return "memory+" + t
	}
	return rc.Engine.Name()
}

// SharedTier is one run's own instance of a shared tier: a Redis prefix or
// a PostgreSQL table no other run uses, its backend for the engine, and
// what it holds. NewSharedTier makes one; Measure reads what its keys
// take on the server; Delete removes them.
type SharedTier struct {
	server SharedServer
	// name is the prefix (Redis) or the table (PostgreSQL).
	name string
	// before is INFO memory used_memory of each Redis master, by address,
	// read when the tier was made.
	before map[string]int64
}

// SharedResult is what a run on a shared tier left in its server.
type SharedResult struct {
	// Tier is SharedRedis or SharedPostgres; Name the run's Redis key
	// prefix or PostgreSQL table, left in the server when Kept.
	Tier, Name string
	Kept       bool
	// Servers is the number of Redis masters measured (1 for PostgreSQL).
	Servers int
	// Keys is the number of dedup keys (rows) the run left: its committed
	// keys, none yet expired (the layout record is not counted).
	Keys int64
	// Bytes is what they take: for Redis the growth of INFO memory
	// used_memory over the run, summed over every master; for PostgreSQL
	// pg_total_relation_size of the tier's table after the run, the sum of
	// TableBytes (pg_table_size: heap, TOAST, free-space and visibility
	// maps) and IndexBytes (pg_indexes_size: the primary key).
	Bytes                  int64
	TableBytes, IndexBytes int64
	// BytesPerKey is Bytes over Keys.
	BytesPerKey float64
}

// NewSharedTier makes a fresh instance of s's tier: a Redis prefix of the
// default prefix's length (10 bytes: "d", 8 random letters and digits,
// ":"), so that the bytes per key are a default deployment's, or a
// PostgreSQL table named dedupbench_ after the time and 6 random bytes.
// For Redis it reads used_memory on every master first: the baseline
// Measure subtracts.
func NewSharedTier(ctx context.Context, s SharedServer) (*SharedTier, error) {
	t := &SharedTier{server: s}
	switch s.Tier() {
	case SharedRedis:
		// No glob characters: Delete finds the keys by SCAN MATCH prefix*.
		const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
		var b [8]byte
		_, _ = rand.Read(b[:])
		for i := range b {
			b[i] = digits[int(b[i])%len(digits)]
		}
		t.name = "d" + string(b[:]) + ":"
		used, err := t.usedMemory(ctx)
		if err != nil {
			return nil, err
		}
		t.before = used
	case SharedPostgres:
		var b [6]byte
		_, _ = rand.Read(b[:])
		t.name = "dedupbench_" + strconv.FormatInt(time.Now().UnixNano(), 36) + "_" + hex.EncodeToString(b[:])
		// A pgx connection keeps the context of its last statement until
		// its next one, and an engine's calls carry the engine in theirs:
		// an engine closed by an earlier run stays on the heap through the
		// pool's idle connections. A statement on each lets it go, so that
		// the heap the run reads before opening its engine holds none.
		for _, c := range s.Postgres.AcquireAllIdle(ctx) {
			_, err := c.Exec(ctx, "SELECT 1")
			c.Release()
			if err != nil {
				return nil, fmt.Errorf("bench: PostgreSQL: %w", err)
			}
		}
	default:
		return nil, fmt.Errorf("%w: no shared server", ErrConfig)
	}
	return t, nil
}

// Name returns the instance's Redis key prefix or PostgreSQL table.
func (t *SharedTier) Name() string { return t.name }

// Backend returns the engine backend over the instance
// (engine.Options.Backend).
func (t *SharedTier) Backend() tier.Backend {
	if t.server.Tier() == SharedRedis {
		return redis.NewBackend(t.server.Redis, redis.Config{Prefix: t.name})
	}
	return postgres.NewBackend(t.server.Postgres, postgres.Config{Table: t.name})
}

// eachRedis runs fn on every master of a Cluster, or on the client.
func (t *SharedTier) eachRedis(ctx context.Context, fn func(ctx context.Context, c goredis.Cmdable, addr string) error) error {
	if cc, ok := t.server.Redis.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return fn(ctx, c, c.Options().Addr) })
	}
	return fn(ctx, t.server.Redis, "")
}

// usedMemory reads INFO memory used_memory of every master.
func (t *SharedTier) usedMemory(ctx context.Context) (map[string]int64, error) {
	var mu sync.Mutex
	used := map[string]int64{}
	err := t.eachRedis(ctx, func(ctx context.Context, c goredis.Cmdable, addr string) error {
		info, err := c.Info(ctx, "memory").Result()
		if err != nil {
			return fmt.Errorf("bench: redis INFO memory: %w", err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return fmt.Errorf("bench: redis INFO memory: used_memory %q: %w", v, err)
				}
				mu.Lock()
				used[addr] = n
				mu.Unlock()
				return nil
			}
		}
		return errors.New("bench: redis INFO memory has no used_memory")
	})
	return used, err
}

// scanRedis calls fn with each batch of the instance's keys on every
// master (SCAN MATCH prefix*), the layout record included.
func (t *SharedTier) scanRedis(ctx context.Context, fn func(ctx context.Context, c goredis.Cmdable, keys []string) error) error {
	return t.eachRedis(ctx, func(ctx context.Context, c goredis.Cmdable, _ string) error {
		var cursor uint64
		for {
			keys, next, err := c.Scan(ctx, cursor, t.name+"*", 5000).Result()
			if err != nil {
				return fmt.Errorf("bench: redis SCAN: %w", err)
			}
			if len(keys) > 0 {
				if err := fn(ctx, c, keys); err != nil {
					return err
				}
			}
			if cursor = next; cursor == 0 {
				return nil
			}
		}
	})
}

// Measure reads what the instance's keys take on the server now (see
// SharedResult).
func (t *SharedTier) Measure(ctx context.Context) (SharedResult, error) {
	res := SharedResult{Tier: t.server.Tier(), Name: t.name, Kept: t.server.Keep, Servers: 1}
	switch res.Tier {
	case SharedRedis:
		used, err := t.usedMemory(ctx)
		if err != nil {
			return res, err
		}
		res.Servers = len(used)
		for addr, n := range used {
			res.Bytes += n - t.before[addr]
		}
		var mu sync.Mutex
		layout := t.name + "\x00"
		if err := t.scanRedis(ctx, func(_ context.Context, _ goredis.Cmdable, keys []string) error {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range keys {
				if k != layout {
					res.Keys++
				}
			}
			return nil
		}); err != nil {
			return res, err
		}
	case SharedPostgres:
		q := `SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass), (SELECT count(*) FROM ` + pgx.Identifier{t.name}.Sanitize() + `)`
		if err := t.server.Postgres.QueryRow(ctx, q, t.name).Scan(&res.TableBytes, &res.IndexBytes, &res.Keys); err != nil {
			return res, fmt.Errorf("bench: the size of table %s: %w", t.name, err)
		}
		res.Bytes = res.TableBytes + res.IndexBytes
	}
	if res.Keys > 0 {
		res.BytesPerKey = float64(res.Bytes) / float64(res.Keys)
	}
	return res, nil
}

// Delete removes the instance's keys (UNLINK of every key under the
// prefix, on every master) or its table, unless the server is marked Keep.
func (t *SharedTier) Delete(ctx context.Context) error {
	if t.server.Keep {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	switch t.server.Tier() {
	case SharedRedis:
		_, cluster := t.server.Redis.(*goredis.ClusterClient)
		return t.scanRedis(ctx, func(ctx context.Context, c goredis.Cmdable, keys []string) error {
			var err error
			if cluster {
				// One key a command: a Cluster node refuses keys of
				// several slots in one.
				_, err = c.Pipelined(ctx, func(p goredis.Pipeliner) error {
					for _, k := range keys {
						p.Unlink(ctx, k)
					}
					return nil
				})
			} else {
				err = c.Unlink(ctx, keys...).Err()
			}
			if err != nil {
				return fmt.Errorf("bench: deleting the keys of prefix %s: %w", t.name, err)
			}
			return nil
		})
	case SharedPostgres:
		if _, err := t.server.Postgres.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{t.name}.Sanitize()); err != nil {
			return fmt.Errorf("bench: dropping table %s: %w", t.name, err)
		}
	}
	return nil
}
