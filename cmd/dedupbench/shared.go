package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/bench"
)

// sharedFlags binds the servers of the shared tiers (-redis, -postgres)
// and -keep.
type sharedFlags struct {
	redis, postgres string
	keep            bool
}

// sharedHelp is what -tiers redis and -tiers postgres measure, for the
// flags' help.
const sharedHelp = "; redis and postgres run memory + that shared tier on -redis or -postgres, over a key prefix or table of the run's own, deleted afterwards (-keep: kept). " +
	"A shared tier expires keys by the server's clock, so its run keeps the stream's -span within -window: every key committed is still held at the end, " +
	"and the server's bytes (Redis: growth of INFO used_memory on every master; PostgreSQL: pg_table_size + pg_indexes_size) are per held key"

// sharedPlanHelp is what a plan for a shared tier sizes, for -tiers' help.
const sharedPlanHelp = "; redis and postgres plan memory + that shared tier, calibrated against -redis or -postgres (a key prefix or table of the calibration's own, deleted afterwards): " +
	"the server's bytes per key and keys/s are measured there, on a stream that stays within the window as the server's clock expires keys; " +
	"Redis holds the window's keys, PostgreSQL the window's and one partition's (an expired row is swept at the next rotation)"

// bind binds the flags; postgres is -postgres's default, which compare's
// baselines use.
func (s *sharedFlags) bind(fs *flag.FlagSet, postgres string, baselines bool) {
	use := "the Redis of -tiers redis: host:port, or several comma-separated for a Cluster (its memory is read as the growth of used_memory: what others write meanwhile counts too)"
	pgUse := "the PostgreSQL of -tiers postgres: a URL (postgres://user:password@host:5432/db)"
	if baselines {
		use += "; also the SET NX EX baselines (empty: skip them)"
		pgUse += "; also the unique-index baselines (empty: skip them)"
	}
	fs.StringVar(&s.redis, "redis", "127.0.0.1:6379", use)
	fs.StringVar(&s.postgres, "postgres", postgres, pgUse)
	fs.BoolVar(&s.keep, "keep", false, "keep the keys (Redis prefix) or table (PostgreSQL) a run on a shared tier wrote, instead of deleting them")
}

// redisClient returns a client of addrs: a Client for one address, a
// ClusterClient for several (comma-separated).
func redisClient(addrs string, poolSize int) goredis.UniversalClient {
	var list []string
	for _, a := range strings.Split(addrs, ",") {
		if a = strings.TrimSpace(a); a != "" {
			list = append(list, a)
		}
	}
	if len(list) > 1 {
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: list, PoolSize: poolSize})
	}
	return goredis.NewClient(&goredis.Options{Addr: strings.Join(list, ""), PoolSize: poolSize})
}

// connect returns the server of the shared tier named (bench.SharedRedis
// or bench.SharedPostgres; "" is none) and a func closing its client, or
// an error when the flags name no server or it does not answer.
func (s *sharedFlags) connect(ctx context.Context, name string) (bench.SharedServer, func(), error) {
	none := func() {}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	switch name {
	case "":
		return bench.SharedServer{}, none, nil
	case bench.SharedRedis:
		if strings.Trim(s.redis, ", ") == "" {
			return bench.SharedServer{}, none, errors.New("-tiers redis needs -redis host:port (several, comma-separated, for a Cluster)")
		}
		c := redisClient(s.redis, 0)
		if err := c.Ping(ctx).Err(); err != nil {
			c.Close()
			return bench.SharedServer{}, none, fmt.Errorf("-tiers redis: no Redis at %s: %w", s.redis, err)
		}
		return bench.SharedServer{Redis: c, Keep: s.keep}, func() { c.Close() }, nil
	case bench.SharedPostgres:
		if s.postgres == "" {
			return bench.SharedServer{}, none, errors.New("-tiers postgres needs -postgres URL (postgres://user:password@host:5432/db)")
		}
		p, err := pgxpool.New(ctx, s.postgres)
		if err == nil {
			if err = p.Ping(ctx); err != nil {
				p.Close()
			}
		}
		if err != nil {
			return bench.SharedServer{}, none, fmt.Errorf("-tiers postgres: no PostgreSQL at %s: %w", redacted(s.postgres), err)
		}
		return bench.SharedServer{Postgres: p, Keep: s.keep}, p.Close, nil
	}
	return bench.SharedServer{}, none, fmt.Errorf("%w: shared tier %q", bench.ErrConfig, name)
}

// redacted is a PostgreSQL URL without its password, for messages.
func redacted(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil {
		return "-postgres"
	}
	return u.Redacted()
}
