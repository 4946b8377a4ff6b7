package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"
)

// CompareRow is one line of a side-by-side comparison.
type CompareRow struct {
	Name       string
	Keys       int64
	Elapsed    time.Duration
	KeysPerSec float64
	// Ratio is the engine's keys/s divided by this row's (zero for the
	// engine itself).
	Ratio float64
	// Skipped says why the row did not run (no server answered).
	Skipped string `json:",omitempty"`
}

// Baseline is a dedup table that users replace: it marks a batch of keys
// and reports, per key, whether it was new.
type Baseline interface {
	Mark(ctx context.Context, keys [][]byte, fresh []bool) error
	Close()
}

// RunBaseline pushes the workload through b from workers goroutines in
// batches of batch keys until the stream ends or budget elapses.
func RunBaseline(ctx context.Context, name string, b Baseline, wc WorkloadConfig, batch, workers int, budget time.Duration) (CompareRow, error) {
	stream, err := NewStream(wc)
	if err != nil {
		return CompareRow{}, err
	}
	var mu sync.Mutex
	var done atomic.Int64
	var firstErr error
	var once sync.Once
	ctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var keys [][]byte
			var kinds []Kind
			fresh := make([]bool, batch)
			for ctx.Err() == nil {
				mu.Lock()
				keys, kinds = stream.Batch(keys, kinds, batch)
				mu.Unlock()
				if len(keys) == 0 {
					return
				}
				if err := b.Mark(ctx, keys, fresh[:len(keys)]); err != nil {
					if ctx.Err() == nil {
						once.Do(func() { firstErr = err; cancel() })
					}
					return
				}
				done.Add(int64(len(keys)))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if firstErr != nil {
		return CompareRow{}, fmt.Errorf("%s: %w", name, firstErr)
	}
	return CompareRow{Name: name, Keys: done.Load(), Elapsed: el, KeysPerSec: float64(done.Load()) / el.Seconds()}, nil
}

// RedisSetNX is the common recipe: SET key 1 NX EX window per message, one
// round trip each.
type RedisSetNX struct {
	C      *goredis.Client
	Prefix string
	Window time.Duration
}

// Mark implements Baseline.
func (r RedisSetNX) Mark(ctx context.Context, keys [][]byte, fresh []bool) error {
	for i, k := range keys {
		ok, err := r.C.SetNX(ctx, r.Prefix+string(k), 1, r.Window).Result()
		if err != nil {
			return err
		}
		fresh[i] = ok
	}
	return nil
}

// Close implements Baseline.
func (r RedisSetNX) Close() {}

// Postgres is a unique-index dedup table: INSERT ... ON CONFLICT DO NOTHING,
// one row per statement (Batched false) or a batch per statement, its IDs
// sorted as a careful user does (unsorted concurrent batches deadlock).
type Postgres struct {
	Batched bool
	table   string
	pool    chan *pgx.Conn
}

// NewPostgres connects conns connections to dsn and creates a fresh table.
func NewPostgres(ctx context.Context, dsn string, conns int, batched bool) (*Postgres, error) {
	p := &Postgres{Batched: batched, table: fmt.Sprintf("dedupbench_%d", time.Now().UnixNano()), pool: make(chan *pgx.Conn, conns)}
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

// Mark implements Baseline.
func (p *Postgres) Mark(ctx context.Context, keys [][]byte, fresh []bool) error {
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
func (p *Postgres) Close() {
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

// Ratios fills each row's Ratio against the engine's keys/s.
func Ratios(engineKeysPerSec float64, rows []CompareRow) {
	for i := range rows {
		if rows[i].KeysPerSec > 0 && !strings.HasPrefix(rows[i].Name, "engine") {
			rows[i].Ratio = engineKeysPerSec / rows[i].KeysPerSec
		}
	}
}
