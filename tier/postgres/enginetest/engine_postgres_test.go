package enginetest_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/engine"
	"github.com/tierdedup/tierdedup/internal/enginetest"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

const postgresDSN = pgtest.DSN

func postgresPool(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) }

// pgBackend is the PostgreSQL tier over db, its rows in table.
var pgBackend = enginetest.PGBackend

// TestConformancePostgres runs the conformance model against the
// PostgreSQL tier: the same operations, crashes of the consumer, clock
// jumps (the table aged by each step) and checks as every configuration.
func TestConformancePostgres(t *testing.T) {
	pg := enginetest.ConformanceConfig{Name: "postgres", Config: enginetest.Named("postgres"), Capacity: 4096}
	small := pg
	small.Name, small.Capacity = "postgres-small-cache", 16
	t.Run(pg.Name, func(t *testing.T) { enginetest.Conformance(t, pg) })
	t.Run(small.Name, func(t *testing.T) { enginetest.Conformance(t, small) })
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
	o := engine.Options{Backend: pgBackend(pool, table), Lease: time.Minute}
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
	enginetest.ProcessesRace(t, postgresDSN)
}

// TestPostgresConnectionsKilledMidRun: while four workers claim and commit,
// the server terminates every connection of the engine's pool, again and
// again for 300 ms (pg_terminate_backend: what a server restart or a
// failover does to its clients). Calls fail with ErrUnavailable, never
// with a wrong answer; then the engine recovers, and every commit it
// acknowledged is a Duplicate in the table, read by another engine whose
// memory has not cached it.
func TestPostgresConnectionsKilledMidRun(t *testing.T) {
	ctx := context.Background()
	app := fmt.Sprintf("tdkill_%d", time.Now().UnixNano())
	p := pgtest.Pool(t, "application_name="+app)
	admin := postgresPool(t)
	table := app
	t.Cleanup(func() { _, _ = admin.Exec(ctx, "DROP TABLE IF EXISTS "+table) })
	e := open(t, engine.Options{Backend: pgBackend(p, table)})
	defer e.Close()
	load := enginetest.StartOutageLoad(e)
	time.Sleep(200 * time.Millisecond)
	killed := 0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		var n int
		if err := admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	load.Finish(t)
	if t.Failed() {
		t.FailNow()
	}
	acked, unavailable := load.Acked, &load.Unavailable
	if killed == 0 || unavailable.Load() == 0 {
		t.Fatalf("connections killed %d, calls unavailable %d: the outage was not exercised", killed, unavailable.Load())
	}
	assertDuplicates(t, open(t, engine.Options{Backend: pgBackend(admin, table)}), acked)
	t.Logf("%d connections killed, %d calls unavailable, %d acknowledged commits all duplicates afterwards", killed, unavailable.Load(), len(acked))
}

// assertDuplicates checks, through check (an engine whose memory has cached
// none of them), that every key is a Duplicate, and closes check.
func assertDuplicates(t *testing.T, check *engine.Engine, keys [][]byte) {
	t.Helper()
	defer check.Close()
	claimEach(t, check, keys, func(key []byte, c engine.Claim) {
		if c.Outcome != engine.Duplicate {
			t.Fatalf("acknowledged %s = %v after the outage", key, c.Outcome)
		}
	})
}

// TestPostgresServerKilledMidRun: while four workers claim and commit, a
// private PostgreSQL server is SIGKILLed with all its processes, kept down
// for half a second and started again on its data directory (crash
// recovery). Calls fail with ErrUnavailable while it is down, never with a
// wrong answer; marks succeed again after the restart; and every commit the
// engine acknowledged, before the kill or after, is a Duplicate in the
// recovered table, read by another engine.
func TestPostgresServerKilledMidRun(t *testing.T) {
	srv := pgtest.StartServer(t)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(srv.DSN + "?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	o := engine.Options{Backend: pgBackend(p, "dedup")}
	e := open(t, o)
	defer e.Close()
	load := enginetest.StartOutageLoad(e)
	acked := func() int {
		load.Mu.Lock()
		defer load.Mu.Unlock()
		return len(load.Acked)
	}
	time.Sleep(300 * time.Millisecond)
	srv.Kill()
	atKill := acked()
	time.Sleep(500 * time.Millisecond)
	srv.Start()
	atRestart := acked()
	time.Sleep(time.Second)
	load.Finish(t)
	if t.Failed() {
		t.FailNow()
	}
	unavailable := load.Unavailable.Load()
	if atKill == 0 || unavailable == 0 || len(load.Acked) == atRestart {
		t.Fatalf("acknowledged %d before the kill, %d after the restart; %d calls unavailable: the outage was not exercised",
			atKill, len(load.Acked)-atRestart, unavailable)
	}
	check, err := pgxpool.New(ctx, srv.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer check.Close()
	o.Backend = pgBackend(check, "dedup")
	assertDuplicates(t, open(t, o), load.Acked)
	t.Logf("server killed and restarted: %d calls unavailable; acknowledged %d before the kill, %d while it came back (before Start saw it ready), %d after; all %d duplicates in the recovered table",
		unavailable, atKill, atRestart-atKill, len(load.Acked)-atRestart, len(load.Acked))
}

// TestPostgresLayoutMismatch: a process whose window differs from the one
// the table recorded is refused with ErrLayout at Open.
func TestPostgresLayoutMismatch(t *testing.T) {
	pool := postgresPool(t)
	table := fmt.Sprintf("layout_%d", time.Now().UnixNano())
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table) })
	o := engine.Options{Backend: pgBackend(pool, table), Window: 24 * time.Hour, Partition: time.Hour}
	open(t, o).Close()
	o.Window = 48 * time.Hour
	if _, err := engine.Open(&o); !errors.Is(err, engine.ErrLayout) {
		t.Fatalf("Open with another window: %v, want ErrLayout", err)
	}
}

// TestPostgresFailOpen: with the server killed
// a fail-closed engine's marks fail with ErrUnavailable, and a fail-open
// engine's answer New, each key counted once as a fail-open answer.
func TestPostgresFailOpen(t *testing.T) {
	srv := pgtest.StartServer(t)
	ctx := context.Background()
	p, err := pgxpool.New(ctx, srv.DSN+"?connect_timeout=1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	o := engine.Options{Backend: pgBackend(p, "dedup")}
	closed := open(t, o)
	defer closed.Close()
	o.FailOpen = true
	opened := open(t, o)
	defer opened.Close()
	keys := [][]byte{[]byte("a"), []byte("b"), []byte("c")}
	out := make([]engine.Outcome, len(keys))
	if err := opened.MarkBatch(ctx, keys[:1], nil, out[:1]); err != nil || out[0] != engine.New {
		t.Fatalf("mark with the server up: %v, %v", out[0], err)
	}
	srv.Kill()
	if err := closed.MarkBatch(ctx, keys[1:], nil, out[1:]); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("fail-closed mark with the server down: %v", err)
	}
	if err := opened.MarkBatch(ctx, keys[1:], nil, out[1:]); err != nil || out[1] != engine.New || out[2] != engine.New {
		t.Fatalf("fail-open mark with the server down: %v, %v", out[1:], err)
	}
	if st := opened.Stats(); st.Calls.FailOpen != 2 {
		t.Fatalf("Stats.Calls.FailOpen = %d after two keys marked fail-open, want 2", st.Calls.FailOpen)
	}
}
