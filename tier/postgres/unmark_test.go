package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/tier/postgres"
)

// holdDB is a postgres.DB that, armed, holds the next statement without
// running it, failing it at once as a caller's deadline would, until
// deliver runs it: a statement the server runs after its caller gave up
// (it waited on a lock, or in a stalled server's input).
type holdDB struct {
	postgres.DB
	mu    sync.Mutex
	armed bool
	sql   string
	args  []any
}

func (d *holdDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.mu.Lock()
	if !d.armed {
		d.mu.Unlock()
		return d.DB.Query(ctx, sql, args...)
	}
	// A copy, as the statement on the wire is: the caller's buffers are
	// reused once the call returns.
	d.armed, d.sql, d.args = false, sql, make([]any, len(args))
	for i, a := range args {
		if col, ok := a.([][]byte); ok {
			c := make([][]byte, len(col))
			for j, b := range col {
				if b != nil {
					c[j] = append(make([]byte, 0, len(b)), b...)
				}
			}
			a = c
		}
		d.args[i] = a
	}
	d.mu.Unlock()
	return nil, fmt.Errorf("held: %w", context.DeadlineExceeded)
}

func (d *holdDB) deliver(t *testing.T) {
	t.Helper()
	d.mu.Lock()
	sql, args := d.sql, d.args
	d.mu.Unlock()
	if sql == "" {
		t.Fatal("no statement was held")
	}
	if _, err := d.DB.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("the late statement: %v", err)
	}
}

// TestLateMarkAfterGiveBack: a's MarkIfAbsent fails before its mark
// statement ran; the engine gives the mark back; then the statement runs
// (late). Nobody was told New, so the message's redelivery, to b or to a,
// must be New: the give-back's fence keeps the late statement out. (A
// give-back that only deleted a commit of the call's token found none,
// and the late statement committed the key: Duplicate for a message
// nobody acted on.)
func TestLateMarkAfterGiveBack(t *testing.T) {
	p := pool(t)
	for _, to := range []string{"b", "a"} {
		t.Run("redelivered-to-"+to, func(t *testing.T) {
			d := &holdDB{DB: p}
			a, b := faultyPair(t, p, "latemark", d)
			ctx := context.Background()
			key := []byte("late-mark")
			d.mu.Lock()
			d.armed = true
			d.mu.Unlock()
			if o, err := a.MarkIfAbsent(ctx, key); err == nil || !errors.Is(err, engine.ErrUnavailable) {
				t.Fatalf("a's mark, its statement held: %v %v, want ErrUnavailable", o, err)
			}
			d.deliver(t)
			e := b
			if to == "a" {
				e = a
			}
			if o, err := e.MarkIfAbsent(ctx, key); err != nil || o != engine.New {
				t.Fatalf("redelivery to %s after the late statement: %v %v, want New", to, o, err)
			}
			if o, err := b.MarkIfAbsent(ctx, key); err != nil || o != engine.Duplicate {
				t.Errorf("b's mark after the redelivery: %v %v, want Duplicate", o, err)
			}
		})
	}
}
