package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/embedded"
)

// baselines runs, beside the engine's MarkBatch row, the engine consumed
// one message at a time (CommitAsync from one goroutine, Do from 16) and
// the dedup tables users replace, per message and in batches: Redis SET NX
// EX (one per message from 1 and 16 clients, and pipelined batches of 256
// from 4) and a PostgreSQL unique index (one INSERT per message from 1 and
// 16 connections, and sorted batches of 256 from 1 and 4). A server that
// does not answer gives a skipped row, not an error. The engine's rows run
// the configuration of rc, on a shared tier of their own when rc has one.
func baselines(ctx context.Context, rc bench.RunConfig, redisAddr, dsn string, budget time.Duration, say func(string, ...any)) []bench.CompareRow {
	wc := rc.Workload
	var rows []bench.CompareRow
	skip := func(name string, batch int, why string) {
		say("%s: skipped: %s", name, why)
		group := bench.GroupBatch
		if batch == 1 {
			group = bench.GroupPerMessage
		}
		rows = append(rows, bench.CompareRow{Name: name, Group: group, Batch: batch, Skipped: why})
	}
	add := func(name string, b bench.Baseline, batch, workers int) {
		defer b.Close()
		say("%s...", name)
		row, err := bench.RunBaseline(ctx, name, b, wc, batch, workers, budget)
		if err != nil {
			skip(name, batch, err.Error())
			return
		}
		rows = append(rows, row)
	}
	for _, async := range []bool{true, false} {
		name, workers := "engine "+rc.TiersName()+" Claim + CommitAsync", 1
		if !async {
			name, workers = "engine "+rc.TiersName()+" Do", 16
		}
		b, err := openEngineBaseline(ctx, rc, async)
		if err != nil {
			skip(name, 1, err.Error())
			continue
		}
		add(name, b, 1, workers)
	}
	if eb, ok := rc.Engine.Backend.(*embedded.Backend); rc.Engine.Tiers == engine.Default && rc.Shared.Tier() == "" && ok {
		// The store's own write path, in the engine's batches from as many
		// goroutines: what MarkBatch adds above the writes it makes.
		workers, batch := rc.Workers, rc.Batch
		if workers <= 0 {
			workers = 4 * runtime.GOMAXPROCS(0)
		}
		if batch <= 0 {
			batch = 256
		}
		for _, read := range []bool{false, true} {
			name := "pebble alone, synced batches"
			if read {
				name = "pebble alone, Get + synced batches"
			}
			p, err := bench.OpenPebbleBaseline(bench.PebbleBaselineOptions{Read: read, NoSync: eb.NoSync, CacheSize: int64(eb.CacheSize)})
			if err != nil {
				skip(name, batch, err.Error())
				continue
			}
			add(name, p, batch, workers)
		}
	}
	if redisAddr != "" {
		c := redisClient(redisAddr, 16)
		for _, r := range []struct {
			name         string
			batch, conns int
			pipelined    bool
		}{
			{"redis SET NX EX per message", 1, 1, false},
			{"redis SET NX EX per message", 1, 16, false},
			{"redis SET NX EX pipelined", 256, 4, true},
		} {
			err := c.Ping(ctx).Err()
			var keys *bench.SharedTier
			if err == nil {
				// A prefix of its own, deleted after the row.
				keys, err = bench.NewSharedTier(ctx, bench.SharedServer{Redis: c})
			}
			if err != nil {
				skip(r.name, r.batch, "no Redis at "+redisAddr+": "+err.Error())
				continue
			}
			add(r.name, redisSetNX{C: c, Prefix: keys.Name(), Window: time.Hour, Pipelined: r.pipelined, keys: keys}, r.batch, r.conns)
		}
		c.Close()
	}
	if dsn != "" {
		for _, pg := range []struct {
			name         string
			conns, batch int
			batched      bool
		}{
			{"postgres INSERT ON CONFLICT per message", 1, 1, false},
			{"postgres INSERT ON CONFLICT per message", 16, 1, false},
			{"postgres INSERT ON CONFLICT, sorted unnest", 1, 256, true},
			{"postgres INSERT ON CONFLICT, sorted unnest", 4, 256, true},
		} {
			p, err := newPostgres(ctx, dsn, pg.conns, pg.batched)
			if err != nil {
				skip(pg.name, pg.batch, "no PostgreSQL at "+dsn+": "+err.Error())
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
	C         goredis.UniversalClient
	Prefix    string
	Window    time.Duration
	Pipelined bool // a batch in one pipeline
	// keys, when set, are the keys under Prefix, which Close deletes.
	keys *bench.SharedTier
}

// Mark implements bench.Baseline.
func (r redisSetNX) Mark(ctx context.Context, keys [][]byte, fresh []bool) error {
	if r.Pipelined {
		cmds := make([]*goredis.BoolCmd, len(keys))
		if _, err := r.C.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, k := range keys {
				cmds[i] = p.SetNX(ctx, r.Prefix+string(k), 1, r.Window)
			}
			return nil
		}); err != nil {
			return err
		}
		for i, c := range cmds {
			fresh[i] = c.Val()
		}
		return nil
	}
	for i, k := range keys {
		ok, err := r.C.SetNX(ctx, r.Prefix+string(k), 1, r.Window).Result()
		if err != nil {
			return err
		}
		fresh[i] = ok
	}
	return nil
}

// Close implements bench.Baseline: it deletes the keys the baseline set.
func (r redisSetNX) Close() {
	if r.keys != nil {
		_ = r.keys.Delete(context.Background())
	}
}

// postgresTable is a unique-index dedup table: INSERT ... ON CONFLICT DO NOTHING,
// one row per statement (Batched false) or a batch per statement, its IDs
// sorted as a careful user does (unsorted concurrent batches deadlock).
type postgresTable struct {
	Batched bool
	table   string
	dsn     string
	pool    chan *pgx.Conn
}

// newPostgres connects conns connections to dsn and creates a fresh table.
func newPostgres(ctx context.Context, dsn string, conns int, batched bool) (*postgresTable, error) {
	p := &postgresTable{Batched: batched, table: fmt.Sprintf("dedupbench_%d", time.Now().UnixNano()), dsn: dsn, pool: make(chan *pgx.Conn, conns)}
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

// Close drops the table and closes the connections. A connection whose
// statement the time budget interrupted is closed by pgx: the table is
// dropped on the first that still works, or on a new one.
func (p *postgresTable) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dropped := false
	drop := func(c *pgx.Conn) {
		if !dropped && !c.IsClosed() {
			_, err := c.Exec(ctx, "DROP TABLE IF EXISTS "+p.table)
			dropped = err == nil
		}
	}
	for {
		select {
		case c := <-p.pool:
			drop(c)
			c.Close(ctx)
			continue
		default:
		}
		break
	}
	if !dropped {
		if c, err := pgx.Connect(ctx, p.dsn); err == nil {
			drop(c)
			c.Close(ctx)
		}
	}
}

// engineBaseline is the engine consumed one message at a time: Claim and
// CommitAsync (done counted at Flush), or Do, with a no-op handler.
type engineBaseline struct {
	e      *engine.Engine
	dir    string
	shared *bench.SharedTier // the engine's own keys on rc's shared tier
	async  bool
	failed atomic.Pointer[error]
}

// openEngineBaseline opens an engine of rc's configuration: in a
// temporary directory, or over a prefix or table of its own on rc's shared
// tier.
func openEngineBaseline(ctx context.Context, rc bench.RunConfig, async bool) (*engineBaseline, error) {
	b := &engineBaseline{async: async}
	o := rc.Engine
	o.Clock = nil // the system clock: these rows run in real time
	if rc.Shared.Tier() != "" {
		st, err := bench.NewSharedTier(ctx, rc.Shared)
		if err != nil {
			return nil, err
		}
		b.shared, o.Backend = st, st.Backend()
	} else if eb, ok := o.Backend.(*embedded.Backend); o.Tiers == engine.Default && (o.Backend == nil || ok && eb.Dir == "") {
		dir, err := os.MkdirTemp("", "dedupbench-")
		if err != nil {
			return nil, err
		}
		var be embedded.Backend
		if ok {
			be = *eb
		}
		be.Dir, b.dir = dir, dir
		o.Backend = &be
	}
	e, err := engine.Open(&o)
	if err != nil {
		b.Close()
		return nil, err
	}
	b.e = e
	return b, nil
}

// Mark implements bench.Baseline.
func (b *engineBaseline) Mark(ctx context.Context, keys [][]byte, fresh []bool) error {
	for i, k := range keys {
		if !b.async {
			// The run's budget stops new messages, not one being handled.
			o, err := b.e.Do(context.WithoutCancel(ctx), k, func(context.Context) error { return nil })
			if err != nil {
				return err
			}
			fresh[i] = o == engine.New
			continue
		}
		k = bytes.Clone(k) // the caller reuses its buffers; a claim's key must outlive done
		c, err := b.e.Claim(ctx, k)
		if err != nil {
			return err
		}
		fresh[i] = c.Outcome == engine.New
		if fresh[i] {
			// The run's time budget stops new messages, not the commits
			// already handed over: they are written and counted.
			b.e.CommitAsync(context.WithoutCancel(ctx), c, func(err error) {
				if err != nil {
					b.failed.CompareAndSwap(nil, &err)
				}
			})
		}
	}
	return nil
}

// Flush implements bench.Flusher: every commit is durable and its done ran.
func (b *engineBaseline) Flush(ctx context.Context) error {
	if err := b.e.Flush(ctx); err != nil {
		return err
	}
	if err := b.failed.Load(); err != nil {
		return *err
	}
	return nil
}

// Close implements bench.Baseline.
func (b *engineBaseline) Close() {
	if b.e != nil {
		_ = b.e.Close()
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
	if b.shared != nil {
		_ = b.shared.Delete(context.Background())
	}
}
