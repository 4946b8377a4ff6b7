package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/internal/backendtest"
	"github.com/tierdedup/tierdedup/internal/crashtest"
	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
)

// TestMain sends a child process (this test binary, re-executed by
// crashtest.Start) to its code.
func TestMain(m *testing.M) {
	crashtest.Main(m, map[string]func(spec string) int{
		"marker": markerChild, // TestMarkNemesis
	})
}

// markerChild is a consumer of TestMarkNemesis on the PostgreSQL tier:
// its policy is its pool's connections (4, or 1: every statement of the
// consumer queues behind the one the paused server holds).
func markerChild(spec string) int {
	return backendtest.NemesisChild(spec, func(sp backendtest.NemesisSpec) (tier.Backend, func(), error) {
		cfg, err := pgxpool.ParseConfig(sp.Addr + "?connect_timeout=1")
		if err != nil {
			return nil, nil, err
		}
		cfg.MaxConns = int32(sp.Policy)
		p, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			return nil, nil, err
		}
		return postgres.NewBackend(p, postgres.Config{Table: sp.Name}), p.Close, nil
	})
}

// TestMarkNemesis: two consumer processes mark batches of 256 keys, half
// of them shared, through MarkBatch on one PostgreSQL server of the
// test's own, each with a one-second deadline a call; one with four
// connections, the other with one. Each round the nemesis pauses the
// server and all its backends (SIGSTOP for 0.3–2 s: statements wait in
// their sockets and run after their callers gave up, gave the claims
// back and retried), kills a consumer (SIGKILL; it restarts after its
// last acknowledged batch, as a consumer group redelivers), or both; the
// checks are backendtest.RunNemesis's: no acknowledged key lost, none New
// twice, none of a finished batch dropped. TIERDEDUP_NEMESIS_ROUNDS sets
// the rounds (CI runs the default, 6).
func TestMarkNemesis(t *testing.T) {
	srv := pgtest.StartServer(t)
	for _, max := range []int{0, 3} {
		t.Run(fmt.Sprint("max=", max), func(t *testing.T) {
			table := fmt.Sprintf("nemesis_%d", time.Now().UnixNano())
			p, err := pgxpool.New(context.Background(), srv.DSN+"?connect_timeout=1")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			backendtest.RunNemesis(t, backendtest.Nemesis{
				Child: "marker", Addr: srv.DSN, Name: table, Policies: []int{4, 1}, MaxAttempts: max,
				Pause: srv.Pause, Resume: srv.Resume, Checker: postgres.NewBackend(p, postgres.Config{Table: table}),
			})
		})
	}
}
