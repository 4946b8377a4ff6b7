package bench_test

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/bench"
	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// BenchmarkPostgres compares, on the loopback PostgreSQL, the engine's
// batch marks through the PostgreSQL tier (memory + PostgreSQL: a claim
// statement and a commit statement per batch, fenced by owner tokens)
// with the raw batched dedup table it stands in front of (one sorted
// INSERT … ON CONFLICT DO NOTHING per batch, no claims, no fencing).
//
//	go test -run '^$' -bench Postgres -benchtime 600000x -cpu 2 ./bench/
func BenchmarkPostgres(b *testing.B) {
	p := pgtest.Pool(b)
	for _, op := range []string{"claim", "mark"} {
		b.Run("tier=postgres/op="+op+"/batch=256", func(b *testing.B) {
			e := openPostgres(b, p)
			defer e.Close()
			runMark(b, redisOp{e, op}, 256)
		})
	}
	b.Run("tier=baseline-insert-on-conflict/batch=256", func(b *testing.B) {
		runMark(b, newRawInsert(b, p), 256)
	})
	// The ratio of the two, measured so that the machine's load moves both
	// alike: the keys are cut into rounds, and each round is marked by the
	// engine and by the raw table in turn (which goes first alternates),
	// each over its own growing table. It reports both rates over all
	// rounds and the median and lowest per-round ratio.
	b.Run("tier=postgres-vs-baseline/op=mark/batch=256", func(b *testing.B) {
		const rounds = 8
		e := openPostgres(b, p)
		defer e.Close()
		raw := newRawInsert(b, p)
		stream := keys(b, b.N)
		var tEngine, tRaw time.Duration
		ratios := make([]float64, 0, rounds)
		b.ResetTimer()
		for r := range rounds {
			part := stream[r*b.N/rounds : (r+1)*b.N/rounds]
			if len(part) == 0 {
				continue
			}
			var de, dr time.Duration
			if r%2 == 0 {
				de, dr = timeMarks(b, redisOp{e, "mark"}, part, 256), timeMarks(b, raw, part, 256)
			} else {
				dr, de = timeMarks(b, raw, part, 256), timeMarks(b, redisOp{e, "mark"}, part, 256)
			}
			tEngine, tRaw = tEngine+de, tRaw+dr
			ratios = append(ratios, dr.Seconds()/de.Seconds())
		}
		b.StopTimer()
		slices.Sort(ratios)
		b.ReportMetric(float64(b.N)/tEngine.Seconds(), "engine-keys/s")
		b.ReportMetric(float64(b.N)/tRaw.Seconds(), "raw-keys/s")
		b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
		b.ReportMetric(ratios[0], "lowest-ratio")
	})
}

// openPostgres opens an engine on the PostgreSQL tier over its own table,
// dropped when the benchmark ends.
func openPostgres(b *testing.B, p *pgxpool.Pool) *engine.Engine {
	table := fmt.Sprintf("bench_%d", time.Now().UnixNano())
	b.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	e, err := engine.Open(&engine.Options{Backend: postgres.NewBackend(p, postgres.Config{Table: table}), Logger: quietEngine})
	if err != nil {
		b.Fatal(err)
	}
	return e
}

// newRawInsert makes the raw dedup table, dropped when the benchmark ends.
func newRawInsert(b *testing.B, p *pgxpool.Pool) rawInsert {
	table := fmt.Sprintf("raw_%d", time.Now().UnixNano())
	if _, err := p.Exec(context.Background(), "CREATE TABLE "+table+" (id bytea PRIMARY KEY)"); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	return rawInsert{p, "INSERT INTO " + table + " (id) SELECT unnest($1::bytea[]) ORDER BY 1 ON CONFLICT DO NOTHING RETURNING id"}
}

// timeMarks marks keys in batches from parallelism goroutines per CPU, as
// runMark does, and returns how long it took.
func timeMarks(b *testing.B, d deduper, keys [][]byte, batch int) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range parallelism * runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			out := make([]engine.Outcome, batch)
			for {
				i := int(next.Add(int64(batch))) - batch
				if i >= len(keys) {
					return
				}
				part := keys[i:min(i+batch, len(keys))]
				if err := d.mark(part, out[:len(part)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
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

// TestPostgresBytesPerKey measures the PostgreSQL tier's table and index
// per committed row (pg_table_size + pg_indexes_size after marking
// 100,000 36-byte UUIDs through the engine, in batches of 256 from 8
// goroutines, as random as a consumer's) and checks the planner's
// PostgresFixedBytes + key size against it, within 15 %: the figure
// `dedupbench plan` uses without a calibration.
func TestPostgresBytesPerKey(t *testing.T) {
	p := pgtest.Pool(t)
	ctx := context.Background()
	table := fmt.Sprintf("bytes_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	e, err := engine.Open(&engine.Options{Backend: postgres.NewBackend(p, postgres.Config{Table: table}), Logger: quietEngine})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	const n, keySize = 100_000, 36
	st, err := bench.NewStream(bench.WorkloadConfig{Keys: n, Shape: bench.UUIDv4, Span: time.Hour, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			var keys [][]byte
			var kinds []bench.Kind
			out := make([]engine.Outcome, 256)
			for {
				mu.Lock()
				keys, kinds = st.Batch(keys, kinds, 256)
				mu.Unlock()
				if len(keys) == 0 {
					return
				}
				if err := e.MarkBatch(ctx, keys, nil, out[:len(keys)]); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var tableBytes, indexBytes, rows int64
	if err := p.QueryRow(ctx, "SELECT pg_table_size($1::regclass), pg_indexes_size($1::regclass), (SELECT count(*) FROM "+table+")", table).
		Scan(&tableBytes, &indexBytes, &rows); err != nil {
		t.Fatal(err)
	}
	perKey := float64(tableBytes+indexBytes) / float64(rows)
	planned := float64(bench.PostgresFixedBytes + keySize)
	t.Logf("PostgreSQL per committed %d-byte key: %.1f B measured (table %.1f, index %.1f; %d rows), %.0f B planned",
		keySize, perKey, float64(tableBytes)/float64(rows), float64(indexBytes)/float64(rows), rows, planned)
	if r := perKey / planned; r < 0.85 || r > 1.15 {
		t.Fatalf("measured %.1f B per row, planner %.0f B (ratio %.2f)", perKey, planned, r)
	}
}
