package main

import (
	"context"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/bench"
)

// baselines runs the dedup tables users replace on the same workload; a
// server that does not answer gives a skipped row, not an error.
func baselines(ctx context.Context, wc bench.WorkloadConfig, redisAddr, dsn string, budget time.Duration, say func(string, ...any)) []bench.CompareRow {
	var rows []bench.CompareRow
	skip := func(name, why string) {
		say("%s: skipped: %s", name, why)
		rows = append(rows, bench.CompareRow{Name: name, Skipped: why})
	}
	add := func(name string, b bench.Baseline, batch, workers int) {
		defer b.Close()
		say("%s...", name)
		row, err := bench.RunBaseline(ctx, name, b, wc, batch, workers, budget)
		if err != nil {
			skip(name, err.Error())
			return
		}
		rows = append(rows, row)
	}
	if redisAddr != "" {
		name := "redis SET NX EX per message, 16 clients"
		c := goredis.NewClient(&goredis.Options{Addr: redisAddr, PoolSize: 16})
		if err := c.Ping(ctx).Err(); err != nil {
			skip(name, "no Redis at "+redisAddr+": "+err.Error())
		} else {
			add(name, bench.RedisSetNX{C: c, Prefix: "dedupbench:" + time.Now().Format("150405.000") + ":", Window: time.Hour}, 1, 16)
		}
		c.Close()
	}
	if dsn != "" {
		for _, pg := range []struct {
			name         string
			conns, batch int
			batched      bool
		}{
			{"postgres INSERT ON CONFLICT per message, 1 connection", 1, 1, false},
			{"postgres INSERT ON CONFLICT per message, 16 connections", 16, 1, false},
			{"postgres batch of 256 (sorted unnest), 1 connection", 1, 256, true},
			{"postgres batch of 256 (sorted unnest), 4 connections", 4, 256, true},
		} {
			p, err := bench.NewPostgres(ctx, dsn, pg.conns, pg.batched)
			if err != nil {
				skip(pg.name, "no PostgreSQL at "+dsn+": "+err.Error())
				continue
			}
			add(pg.name, p, pg.batch, pg.conns)
		}
	}
	return rows
}
