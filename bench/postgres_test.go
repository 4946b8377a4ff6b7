package bench_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// BenchmarkPostgres compares, on the loopback PostgreSQL, the engine's
// batch marks through the PostgreSQL tier (memory + PostgreSQL: a claim
// statement and a commit statement per batch, fenced by owner tokens)
// with the raw batched dedup table it stands in front of (one sorted
// INSERT … ON CONFLICT DO NOTHING per batch, no claims, no fencing).
//
//	go test -run '^$' -bench Postgres -benchtime 200000x -cpu 2 ./bench/
func BenchmarkPostgres(b *testing.B) {
	p := pgtest.Pool(b)
	for _, op := range []string{"claim", "mark"} {
		b.Run("tier=postgres/op="+op+"/batch=256", func(b *testing.B) {
			table := fmt.Sprintf("bench_%d", time.Now().UnixNano())
			b.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
			e, err := engine.Open(&engine.Options{Tiers: engine.Postgres, Postgres: p, PostgresTable: table, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			defer e.Close()
			runMark(b, redisOp{e, op}, 256)
		})
	}
	b.Run("tier=baseline-insert-on-conflict/batch=256", func(b *testing.B) {
		table := fmt.Sprintf("raw_%d", time.Now().UnixNano())
		if _, err := p.Exec(context.Background(), "CREATE TABLE "+table+" (id bytea PRIMARY KEY)"); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
		runMark(b, rawInsert{p, "INSERT INTO " + table + " (id) SELECT unnest($1::bytea[]) ORDER BY 1 ON CONFLICT DO NOTHING RETURNING id"}, 256)
	})
}

// rawInsert is the batched dedup table: the keys it inserted are new.
type rawInsert struct {
	p *pgxpool.Pool
	q string
}

func (r rawInsert) mark(keys [][]byte, out []engine.Outcome) error {
	sorted := slices.Clone(keys)
	slices.SortFunc(sorted, func(a, b []byte) int { return slices.Compare(a, b) })
	sorted = slices.CompactFunc(sorted, func(a, b []byte) bool { return string(a) == string(b) })
	rows, err := r.p.Query(context.Background(), r.q, sorted)
	if err != nil {
		return err
	}
	inserted := map[string]bool{}
	for rows.Next() {
		var id []byte
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		inserted[string(id)] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for i, k := range keys {
		out[i] = engine.Duplicate
		if inserted[string(k)] {
			out[i] = engine.New
			delete(inserted, string(k))
		}
	}
	return nil
}

func (r rawInsert) close() {}
