package enginetest_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
)

// TestPostgresSweepsWithAndWithoutFailOpen: rows expired on the server
// are swept once the engine's partition rotates, with FailOpen too (its
// wrapper must not hide the tier's retention).
func TestPostgresSweepsWithAndWithoutFailOpen(t *testing.T) {
	for _, failOpen := range []bool{false, true} {
		t.Run(fmt.Sprintf("FailOpen=%v", failOpen), func(t *testing.T) {
			ctx := context.Background()
			p := postgresPool(t)
			table := pgTable(t, p, "pgfo")
			clock := newClock()
			e := open(t, engine.Options{Backend: pgBackend(p, table),
				Window: 10 * time.Second, Partition: time.Second, Lease: time.Second, Clock: clock, FailOpen: failOpen})
			defer e.Close()
			for i := range 100 {
				if o, err := e.MarkIfAbsent(ctx, []byte(fmt.Sprintf("k%d", i))); err != nil || o != engine.New {
					t.Fatalf("mark %d: %v %v", i, o, err)
				}
			}
			// Every row expires (server time), and the engine's clock
			// moves into the next partitions: rotation runs Drop.
			if err := agePostgres(ctx, p, table, time.Hour); err != nil {
				t.Fatal(err)
			}
			clock.Add(3 * time.Second)
			if _, err := e.MarkIfAbsent(ctx, []byte("trigger")); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) {
				if n := pgRows(t, p, table); n <= 1 {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Fatalf("%d rows left, 100 of them expired an hour ago: no sweep ran after the partition rotated", pgRows(t, p, table))
		})
	}
}

// TestPostgresLongKey: a key over the index's limit (3000 bytes under
// MaxKeySize 4096) is claimed like any other.
func TestPostgresLongKey(t *testing.T) {
	ctx := context.Background()
	p := postgresPool(t)
	table := pgTable(t, p, "pglong")
	e := open(t, engine.Options{Backend: pgBackend(p, table), MaxKeySize: 4096})
	defer e.Close()
	key := make([]byte, 3000)
	_, _ = rand.Read(key)
	c, err := e.Claim(ctx, key)
	if err != nil {
		t.Fatalf("claim of a %d-byte key under MaxKeySize 4096: %v", len(key), err)
	}
	if c.Outcome != engine.New {
		t.Fatalf("outcome %v", c.Outcome)
	}
}

// lossyDB runs every statement, but for the ones lose picks it drops the
// reply: the statement is applied and the caller sees an error.
type lossyDB struct {
	*pgxpool.Pool
	mu   sync.Mutex
	lose func(sql string) bool
}

func (d *lossyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.mu.Lock()
	lose := d.lose != nil && d.lose(sql)
	if lose {
		d.lose = nil
	}
	d.mu.Unlock()
	if !lose {
		return d.Pool.Query(ctx, sql, args...)
	}
	rows, err := d.Pool.Query(ctx, sql, args...)
	if err == nil {
		for rows.Next() {
		}
		rows.Close()
		err = rows.Err()
	}
	if err != nil {
		return nil, err
	}
	return nil, errors.New("connection reset by peer (injected: reply lost)")
}

func (d *lossyDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return d.Pool.Exec(ctx, sql, args...)
}

func isMark(sql string) bool { return strings.Contains(sql, "'D', r.token") }

// TestPostgresLostMarkThenFailedHandler: a mark whose reply was lost
// (applied in the table), then the redelivery handled with Do: the claim
// is New (the caller's own mark), the handler fails, and Do's release
// undoes the mark's commit, so the next redelivery is New again: the
// message was never processed.
func TestPostgresLostMarkThenFailedHandler(t *testing.T) {
	ctx := context.Background()
	p := postgresPool(t)
	table := pgTable(t, p, "pglost")
	db := &lossyDB{Pool: p}
	e := open(t, engine.Options{Backend: pgBackend(db, table)})
	defer e.Close()
	key := []byte("order-7")
	db.mu.Lock()
	db.lose = isMark
	db.mu.Unlock()
	if _, err := e.MarkIfAbsent(ctx, key); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("mark with a lost reply: %v", err)
	}
	o, err := e.Do(ctx, key, func(context.Context) error { return errors.New("handler failed") })
	t.Logf("Do after the lost mark: %v, %v", o, err)
	if o != engine.New {
		t.Fatalf("Do after the lost mark: %v (the caller never learnt it was New)", o)
	}
	o, err = e.Do(ctx, key, func(context.Context) error { return nil })
	if err != nil || o != engine.New {
		t.Fatalf("redelivery after the handler failed and Do released: %v, %v; want New (the message was never processed)", o, err)
	}
}

// TestPostgresDeadlineOnLockedTable: a claim or mark returns within the
// caller's deadline plus a small margin, even when another transaction
// holds the table locked.
func TestPostgresDeadlineOnLockedTable(t *testing.T) {
	ctx := context.Background()
	p := postgresPool(t)
	table := pgTable(t, p, "pgdl")
	e := open(t, engine.Options{Backend: pgBackend(p, table), Lease: time.Second})
	defer e.Close()
	key := []byte("locked")
	c, err := e.Claim(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, c); err != nil {
		t.Fatal(err)
	}
	// Another session locks the whole table.
	tx, err := p.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	for _, op := range []string{"claim", "mark"} {
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		start := time.Now()
		switch op {
		case "claim":
			_, err = e.Claim(dctx, []byte("other"))
		case "mark":
			_, err = e.MarkIfAbsent(dctx, []byte("other2"))
		}
		cancel()
		if took := time.Since(start); took > 800*time.Millisecond {
			t.Errorf("%s with a 300ms deadline took %v (err %v)", op, took, err)
		}
	}
}

// TestPostgresMemoryNeverOutlivesRow: memory keeps the engine's own
// commits on the process clock while the row expires on the server's. With
// the process clock behind the server's by less than half the window, the
// row expires, another process commits the key anew with another payload,
// and this process answers Duplicate for that payload (not Conflict from a
// stale memory entry).
func TestPostgresMemoryNeverOutlivesRow(t *testing.T) {
	ctx := context.Background()
	p := postgresPool(t)
	table := pgTable(t, p, "pgmem")
	clock := newClock()
	a := open(t, engine.Options{Backend: pgBackend(p, table), Clock: clock,
		Window: time.Hour, Partition: time.Minute, Lease: time.Second})
	b := open(t, engine.Options{Backend: pgBackend(p, table),
		Window: time.Hour, Partition: time.Minute, Lease: time.Second})
	defer a.Close()
	defer b.Close()
	key := []byte("k")
	d1, d2 := engine.Digest{1}, engine.Digest{2}
	na, _ := a.Namespace("")
	nb, _ := b.Namespace("")
	ca, err := na.ClaimDigest(ctx, key, d1)
	if err != nil || ca.Outcome != engine.New {
		t.Fatal(ca.Outcome, err)
	}
	if err := a.Commit(ctx, ca); err != nil {
		t.Fatal(err)
	}
	// The window passes on the server's clock; a's clock lags by 2 minutes.
	if err := agePostgres(ctx, p, table, time.Hour+time.Minute); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Hour - time.Minute)
	cb, err := nb.ClaimDigest(ctx, key, d2)
	if err != nil || cb.Outcome != engine.New {
		t.Fatalf("b after the window: %v %v", cb.Outcome, err)
	}
	if err := b.Commit(ctx, cb); err != nil {
		t.Fatal(err)
	}
	ca2, err := na.ClaimDigest(ctx, key, d2)
	if err != nil {
		t.Fatal(err)
	}
	if ca2.Outcome != engine.Duplicate {
		t.Fatalf("a, payload d2 that b committed: %v, want Duplicate (the table holds b's commit of d2)", ca2.Outcome)
	}
}

// failDB fails, without running it, the next statement fail picks (the
// server unreachable for that one call).
type failDB struct {
	*pgxpool.Pool
	mu   sync.Mutex
	fail func(sql string) bool
}

func (d *failDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	d.mu.Lock()
	f := d.fail != nil && d.fail(sql)
	if f {
		d.fail = nil
	}
	d.mu.Unlock()
	if f {
		return nil, errors.New("dial tcp 127.0.0.1:5432: connect: connection refused (injected)")
	}
	return d.Pool.Query(ctx, sql, args...)
}

func isClaim(sql string) bool { return strings.Contains(sql, "'C', r.token") }

// TestPostgresFailOpenClaimCommitsWhenBack: with FailOpen a claim meets an
// outage and is answered New (counted); the server is back for the
// commit, which takes and commits the key then, so every other process
// answers Duplicate.
func TestPostgresFailOpenClaimCommitsWhenBack(t *testing.T) {
	ctx := context.Background()
	p := postgresPool(t)
	table := pgTable(t, p, "pgfoc")
	db := &failDB{Pool: p}
	o := engine.Options{Backend: pgBackend(db, table), FailOpen: true}
	a := open(t, o)
	defer a.Close()
	o.Backend = pgBackend(p, table)
	b := open(t, o)
	defer b.Close()
	key := []byte("pay-42")
	db.mu.Lock()
	db.fail = isClaim
	db.mu.Unlock()
	ca, err := a.Claim(ctx, key)
	if err != nil || ca.Outcome != engine.New {
		t.Fatalf("A during the outage: %v %v", ca.Outcome, err)
	}
	// A processes the message; PostgreSQL is back.
	cerr := a.Commit(ctx, ca)
	cb, err := b.Claim(ctx, key)
	t.Logf("A commit: %v; B then: %v %v; A Stats.Calls.FailOpen=%d", cerr, cb.Outcome, err, a.Stats().Calls.FailOpen)
	if cerr != nil {
		t.Fatalf("A's commit with the server back: %v", cerr)
	}
	if cb.Outcome != engine.Duplicate {
		t.Fatalf("B after A's commit: %v", cb.Outcome)
	}
}

// TestPostgresLostMarkRetryIsCommittedInMemory: a lost claim reply and a
// lost mark reply: the retries are New here; the lost claim is InFlight in
// another process, and the lost mark, given back by the failed call, is
// gone from the table; once the mark's retry is New the key is a
// Duplicate here and in the other process (committed, not left a leased
// claim).
func TestPostgresLostMarkRetryIsCommittedInMemory(t *testing.T) {
	ctx := context.Background()
	p := postgresPool(t)
	table := pgTable(t, p, "pgretry")
	db := &lossyDB{Pool: p}
	e := open(t, engine.Options{Backend: pgBackend(db, table)})
	defer e.Close()
	o := open(t, engine.Options{Backend: pgBackend(p, table)})
	defer o.Close()
	db.mu.Lock()
	db.lose = isClaim
	db.mu.Unlock()
	if _, err := e.Claim(ctx, []byte("c")); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatal(err)
	}
	if c, err := o.Claim(ctx, []byte("c")); err != nil || c.Outcome != engine.InFlight {
		t.Fatalf("other process: %v %v", c.Outcome, err)
	}
	c, err := e.Claim(ctx, []byte("c"))
	if err != nil || c.Outcome != engine.New {
		t.Fatalf("retry of the lost claim: %v %v", c.Outcome, err)
	}
	if err := e.Commit(ctx, c); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	db.lose = isMark
	db.mu.Unlock()
	if _, err := e.MarkIfAbsent(ctx, []byte("m")); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatal(err)
	}
	if info, err := o.Lookup(ctx, []byte("m")); err != nil || info.Outcome != engine.New {
		t.Fatalf("other process after the lost mark was given back: %+v %v; want New (nobody processed it)", info, err)
	}
	if out, err := e.MarkIfAbsent(ctx, []byte("m")); err != nil || out != engine.New {
		t.Fatalf("retry of the lost mark: %v %v", out, err)
	}
	if out, err := e.MarkIfAbsent(ctx, []byte("m")); err != nil || out != engine.Duplicate {
		t.Fatalf("after: %v %v", out, err)
	}
	if out, err := o.MarkIfAbsent(ctx, []byte("m")); err != nil || out != engine.Duplicate {
		t.Fatalf("other process after the retry: %v %v", out, err)
	}
}
