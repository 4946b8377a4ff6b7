package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
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
			add(name, redisSetNX{C: c, Prefix: "dedupbench:" + time.Now().Format("150405.000") + ":", Window: time.Hour}, 1, 16)
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
			p, err := newPostgres(ctx, dsn, pg.conns, pg.batched)
			if err != nil {
				skip(pg.name, "no PostgreSQL at "+dsn+": "+err.Error())
				continue
			}
			add(pg.name, p, pg.batch, pg.conns)
		}
	}
	return rows
}

// redisSetNX is the common recipe: SET key 1 NX EX window per message, one
// round trip each.
type redisSetNX struct {
	C      *goredis.Client
	Prefix string
	Window time.Duration
}

// Mark implements bench.Baseline.
func (r redisSetNX) Mark(ctx context.Context, keys [][]byte, fresh []bool) error {
	for i, k := range keys {
		ok, err := r.C.SetNX(ctx, r.Prefix+string(k), 1, r.Window).Result()
		if err != nil {
			return err
		}
		fresh[i] = ok
	}
	return nil
}

// Close implements bench.Baseline.
func (r redisSetNX) Close() {}

// postgresTable is a unique-index dedup table: INSERT ... ON CONFLICT DO NOTHING,
// one row per statement (Batched false) or a batch per statement, its IDs
// sorted as a careful user does (unsorted concurrent batches deadlock).
type postgresTable struct {
	Batched bool
	table   string
	pool    chan *pgx.Conn
}

// newPostgres connects conns connections to dsn and creates a fresh table.
func newPostgres(ctx context.Context, dsn string, conns int, batched bool) (*postgresTable, error) {
	p := &postgresTable{Batched: batched, table: fmt.Sprintf("dedupbench_%d", time.Now().UnixNano()), pool: make(chan *pgx.Conn, conns)}
	for i := range conns {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			p.Close()
			return nil, err
		}
		if i == 0 {
			if _, err := c.Exec(ctx, "CREATE TABLE "+p.table+" (message_id text PRIMARY KEY)"); err != nil {
				c.Close(ctx)
				p.Close()
				return nil, err
			}
		}
		p.pool <- c
	}
	return p, nil
}

// Mark implements bench.Baseline.
func (p *postgresTable) Mark(ctx context.Context, keys [][]byte, fresh []bool) error {
	c := <-p.pool
	defer func() { p.pool <- c }()
	if !p.Batched {
		for i, k := range keys {
			tag, err := c.Exec(ctx, "INSERT INTO "+p.table+" VALUES ($1) ON CONFLICT DO NOTHING", string(k))
			if err != nil {
				return err
			}
			fresh[i] = tag.RowsAffected() == 1
		}
		return nil
	}
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = string(k)
	}
	slices.Sort(ids)
	rows, err := c.Query(ctx, "INSERT INTO "+p.table+" SELECT unnest($1::text[]) ON CONFLICT DO NOTHING RETURNING message_id", ids)
	if err != nil {
		return err
	}
	inserted := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		inserted[id] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, k := range keys {
		fresh[i] = inserted[string(k)]
		delete(inserted, string(k)) // a repeat within the batch is not new
	}
	return nil
}

// Close drops the table and closes the connections.
func (p *postgresTable) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := true
	for {
		select {
		case c := <-p.pool:
			if first {
				_, _ = c.Exec(ctx, "DROP TABLE IF EXISTS "+p.table)
				first = false
			}
			c.Close(ctx)
		default:
			return
		}
	}
}
