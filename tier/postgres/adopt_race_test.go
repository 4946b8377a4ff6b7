package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// betweenDB is a postgres.DB that, armed, holds the next statement (a
// mark sent to a stalled server: its call fails by its deadline, the
// statement unrun), fails every statement after it unrun (the give-back,
// lost to the same stall), and runs the held one right after the next
// adopt statement (a retry's): the late statement lands between the
// retry's adopt and its mark.
type betweenDB struct {
	postgres.DB
	mu        sync.Mutex
	armed     bool
	held      string
	args      []any
	delivered bool
}

func (d *betweenDB) intercept(ctx context.Context, sql string, args []any) (pass bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case !d.armed || d.delivered:
		return true, nil
	case d.held == "":
		// As sent: the caller reuses its buffers once the call failed.
		d.held, d.args = sql, deepCopy(args)
		return false, errLost
	case !strings.Contains(sql, "r.earlier"):
		return false, errLost // the give-back, lost with the server
	}
	// The retry's adopt: run it, then the late statement.
	if _, err := d.DB.Exec(ctx, sql, args...); err != nil {
		return false, err
	}
	if _, err := d.DB.Exec(ctx, d.held, d.args...); err != nil {
		return false, fmt.Errorf("the late mark statement: %w", err)
	}
	d.delivered = true
	return false, nil
}

func (d *betweenDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pass, err := d.intercept(ctx, sql, args); !pass {
		if err != nil {
			return nil, err
		}
		return d.DB.Query(ctx, "SELECT 1 WHERE false") // the adopt ran: no rows
	}
	return d.DB.Query(ctx, sql, args...)
}

func (d *betweenDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if pass, err := d.intercept(ctx, sql, args); !pass {
		return pgconn.CommandTag{}, err
	}
	return d.DB.Exec(ctx, sql, args...)
}

// TestLateMarkBetweenAdoptAndMark: a MarkBatch fails with the server
// stalled (its statement unrun, its give-back lost too); the consumer's
// retry adopts what its earlier call holds (nothing yet), and the earlier
// statement then lands, committing every key for the earlier call's token,
// before the retry's mark statement runs. The retry must answer New for
// every key (they are its own call's, which nobody was told of), and they
// stay Duplicate for another process. Before, the retry answered Duplicate:
// a new message dropped (found by the pause nemesis).
func TestLateMarkBetweenAdoptAndMark(t *testing.T) {
	p := pool(t)
	d := &betweenDB{DB: p}
	a, b := faultyPair(t, p, "between", d)
	ctx := context.Background()
	keys := make([][]byte, 40)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "between-%d", i)
	}
	out := make([]engine.Outcome, len(keys))
	d.mu.Lock()
	d.armed = true
	d.mu.Unlock()
	if err := a.MarkBatch(ctx, keys, nil, out); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("the mark with the server stalled: %v, want ErrUnavailable", err)
	}
	if err := a.MarkBatch(ctx, keys, nil, out); err != nil {
		t.Fatalf("the retry: %v", err)
	}
	if !d.delivered {
		t.Fatal("the late statement never ran between the retry's adopt and mark: the test tests nothing")
	}
	for i, o := range out {
		if o != engine.New {
			t.Fatalf("retry of %s: %v, want New (its own earlier call's commit; nobody was told New)", keys[i], o)
		}
	}
	info := make([]engine.KeyInfo, len(keys))
	if err := b.LookupBatch(ctx, keys, info); err != nil {
		t.Fatal(err)
	}
	for i, in := range info {
		if in.Outcome != engine.Duplicate {
			t.Fatalf("%s for another process: %v, want Duplicate", keys[i], in.Outcome)
		}
	}
}

// deepCopy copies a statement's arguments, byte-array columns included.
func deepCopy(args []any) []any {
	out := make([]any, len(args))
	for i, a := range args {
		if col, ok := a.([][]byte); ok {
			c := make([][]byte, len(col))
			for j, b := range col {
				c[j] = append([]byte{}, b...) // never nil: an empty column value is not NULL
			}
			a = c
		}
		out[i] = a
	}
	return out
}

// faultyPair opens two engines on one fresh table: a through db (a
// wrapper of p that faults), b through p itself, each closed when the
// test ends.
func faultyPair(t *testing.T, p *pgxpool.Pool, prefix string, db postgres.DB) (a, b *engine.Engine) {
	t.Helper()
	table := fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())
	t.Cleanup(func() { _, _ = p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	o := engine.Options{Window: time.Hour, Partition: 10 * time.Minute, Lease: time.Minute, Logger: slog.New(slog.DiscardHandler)}
	for _, side := range []struct {
		db postgres.DB
		e  **engine.Engine
	}{{db, &a}, {p, &b}} {
		o.Backend = postgres.NewBackend(side.db, postgres.Config{Table: table})
		e, err := engine.Open(&o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.Close() })
		*side.e = e
	}
	return a, b
}
