package engine_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
)

const postgresDSN = "postgres://postgres:test@127.0.0.1:5432/test"

// postgresPool connects to the loopback PostgreSQL; with
// TIERDEDUP_REQUIRE_POSTGRES set (CI) a server that cannot be reached
// fails the test.
func postgresPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, postgresDSN)
	if err == nil {
		err = p.Ping(ctx)
	}
	if err != nil {
		if os.Getenv("TIERDEDUP_REQUIRE_POSTGRES") != "" {
			t.Fatalf("PostgreSQL at %s: %v", postgresDSN, err)
		}
		t.Skipf("no PostgreSQL at %s: %v", postgresDSN, err)
	}
	t.Cleanup(p.Close)
	return p
}

// TestConformancePostgres runs the conformance model against the
// PostgreSQL tier: the same operations, crashes of the consumer, clock
// jumps (the table aged by each step) and checks as every configuration.
func TestConformancePostgres(t *testing.T) {
	pg := confConfig{name: "postgres", tiers: engine.Postgres, capacity: 4096, postgres: postgresPool}
	small := pg
	small.name, small.capacity = "postgres-small-cache", 16
	t.Run(pg.name, func(t *testing.T) { runConformanceSeeds(t, pg) })
	t.Run(small.name, func(t *testing.T) { runConformanceSeeds(t, small) })
}

// TestPostgresFencing: two consumer processes (two engines) share a table.
// A's claim runs out in the table (its clock ages past the lease) and B
// takes the key over: A's commit is refused with ErrLeaseLost although A's
// own memory still holds its claim, and B's commit is the one every
// process sees.
func TestPostgresFencing(t *testing.T) {
	ctx := context.Background()
	pool := postgresPool(t)
	table := "fence_" + time.Now().Format("150405000000")
	t.Cleanup(func() { _, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+table) })
	o := engine.Options{Tiers: engine.Postgres, Postgres: pool, PostgresTable: table, Lease: time.Minute}
	a, b, c := open(t, o), open(t, o), open(t, o)
	defer a.Close()
	defer b.Close()
	defer c.Close()
	key := []byte("order-1")
	ca, err := a.Claim(ctx, key)
	if err != nil || ca.Outcome != engine.New {
		t.Fatalf("A: %v, %v", ca.Outcome, err)
	}
	if cb, err := b.Claim(ctx, key); err != nil || cb.Outcome != engine.InFlight {
		t.Fatalf("B while A holds it: %v, %v", cb.Outcome, err)
	}
	if err := agePostgres(ctx, pool, table, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	cb, err := b.Claim(ctx, key)
	if err != nil || cb.Outcome != engine.New {
		t.Fatalf("B after A's lease ended: %v, %v", cb.Outcome, err)
	}
	if err := a.Commit(ctx, ca); !errors.Is(err, engine.ErrLeaseLost) {
		t.Fatalf("A's commit after the takeover: %v, want ErrLeaseLost", err)
	}
	if err := b.Commit(ctx, cb); err != nil {
		t.Fatalf("B's commit: %v", err)
	}
	if cc, err := c.Claim(ctx, key); err != nil || cc.Outcome != engine.Duplicate {
		t.Fatalf("a third process after B's commit: %v, %v", cc.Outcome, err)
	}
}

// TestPostgresProcessesRace: four OS processes claim the same keys through
// one table; each key is New in exactly one process.
func TestPostgresProcessesRace(t *testing.T) {
	postgresPool(t) // fails here, not in the children, when the server is missing
	runProcessesRace(t, postgresDSN)
}
