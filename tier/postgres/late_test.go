package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/backendtest"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// lateDB is a postgres.DB that, armed, lets skip statements pass, then
// runs the next one and loses its answer (a reply lost on the way back),
// then holds the one after it (the give-back of the failed call), failing
// it at once as a timeout would, until deliver runs it: a copy that
// reaches the server late.
type lateDB struct {
	postgres.DB
	mu      sync.Mutex
	armed   bool
	skip    int
	stage   int
	held    string
	args    []any
	applied bool
}

var errLost = errors.New("i/o timeout (reply lost)")

func (d *lateDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.mu.Lock()
	if !d.armed || d.stage == 2 {
		d.mu.Unlock()
		return d.DB.Query(ctx, sql, args...)
	}
	if d.skip > 0 {
		d.skip--
		d.mu.Unlock()
		return d.DB.Query(ctx, sql, args...)
	}
	stage := d.stage
	d.stage++
	if stage == 1 {
		d.held, d.args = sql, args
	}
	d.mu.Unlock()
	if stage == 0 {
		_, err := d.DB.Exec(ctx, sql, args...)
		d.applied = err == nil
	}
	return nil, errLost
}

func (d *lateDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.DB.Exec(ctx, sql, args...)
}

// deliver runs the held give-back now, and returns whether there was one.
func (d *lateDB) deliver(t *testing.T) bool {
	d.mu.Lock()
	sql, args := d.held, d.args
	d.held = ""
	d.mu.Unlock()
	if sql == "" {
		return false
	}
	if _, err := d.DB.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("the late give-back: %v", err)
	}
	return true
}

// TestLateGiveBackAfterRetry: a MarkBatch's statement is applied but its
// answer lost; the give-back the engine then sends arrives late; the
// consumer's retry of the batch is New (its own lost mark) and
// acknowledged; then the give-back runs. Every key the retry acknowledged
// must stay marked: a give-back names its own call's token, which no later
// call sends. With MaxAttempts too (the statements are the same).
func TestLateGiveBackAfterRetry(t *testing.T) {
	p := pool(t)
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			table := fmt.Sprintf("late_%d", time.Now().UnixNano())
			t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
			d := &lateDB{DB: p}
			o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, MaxAttempts: max, Logger: slog.New(slog.DiscardHandler)}
			o.Backend = postgres.NewBackend(d, postgres.Config{Table: table})
			a, err := engine.Open(&o)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			o.Backend = postgres.NewBackend(p, postgres.Config{Table: table})
			b, err := engine.Open(&o)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			backendtest.LateGiveBack(t, a, b, pgLate{d, t})
		})
	}
}

// pgLate is lateDB as backendtest.Late.
type pgLate struct {
	d *lateDB
	t *testing.T
}

func (l pgLate) Arm() {
	l.d.mu.Lock()
	l.d.armed = true
	l.d.mu.Unlock()
}
func (l pgLate) Applied() bool { return l.d.applied }
func (l pgLate) Deliver() bool { return l.d.deliver(l.t) }

// sizeDB is a postgres.DB that records the largest statement it ran, as
// the bytes of its byte-array arguments.
type sizeDB struct {
	postgres.DB
	mu      sync.Mutex
	largest int
}

func (d *sizeDB) note(args []any) {
	n := 0
	for _, a := range args {
		if col, ok := a.([][]byte); ok {
			for _, b := range col {
				n += len(b)
			}
		}
	}
	d.mu.Lock()
	d.largest = max(d.largest, n)
	d.mu.Unlock()
}

func (d *sizeDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.note(args)
	return d.DB.Query(ctx, sql, args...)
}

func (d *sizeDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	d.note(args)
	return d.DB.Exec(ctx, sql, args...)
}

// TestLargeResultsCommit: a commit group of large results (40 of 4 MiB,
// MaxResultSize's largest: the commit queue groups several callers'
// commits) goes to PostgreSQL in statements of at most 16 MiB and one
// row: a group of 256 such results made one statement over PostgreSQL's
// 1 GiB message limit, failing every retry. Every result is answered
// whole.
func TestLargeResultsCommit(t *testing.T) {
	p := pool(t)
	table := fmt.Sprintf("large_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	d := &sizeDB{DB: p}
	o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, MaxResultSize: engine.MaxResultSize, Logger: slog.New(slog.DiscardHandler)}
	o.Backend = postgres.NewBackend(d, postgres.Config{Table: table})
	e, err := engine.Open(&o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	backendtest.LargeResults(t, e)
	if limit := 16<<20 + engine.MaxResultSize + 1024; d.largest > limit {
		t.Errorf("a statement carried %d MiB, want at most %d", d.largest>>20, limit>>20)
	}
}
