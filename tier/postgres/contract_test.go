package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// TestContract runs the exact tiers' contract suite over Stores on the
// loopback PostgreSQL (pgtest: a failure, not a skip, when it is missing
// and TIERDEDUP_REQUIRE_POSTGRES is set), each in a table of its own
// named for this run and dropped after its check, once without attempt
// counting and once with MaxAttempts.
func TestContract(t *testing.T) {
	p := pgtest.Pool(t)
	run := time.Now().UnixNano()
	var mu sync.Mutex
	tables := map[tier.Exact]string{} // the table of each Store the suite opened
	n := 0
	for _, maxAttempts := range []int{0, 3} {
		open := func(t *testing.T, table string) tier.Exact {
			t.Helper()
			s, err := postgres.New(context.Background(), p, &postgres.Options{Table: table, Window: time.Hour, MaxAttempts: maxAttempts})
			if err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			tables[s] = table
			mu.Unlock()
			return s
		}
		t.Run(fmt.Sprint("max-attempts=", maxAttempts), func(t *testing.T) {
			tiertest.Run(t, tiertest.Options{
				MaxAttempts: maxAttempts,
				// Commits are kept for the table's window: the engine
				// refuses NamespaceWindows over PostgreSQL.
				IgnoresWindow: true,
				Reopen: func(t *testing.T, closed tier.Exact) tier.Exact {
					mu.Lock()
					table := tables[closed]
					mu.Unlock()
					return open(t, table)
				},
			}, func(t *testing.T) tier.Exact {
				mu.Lock()
				n++
				table := fmt.Sprintf("contract_%d_%d", run, n)
				mu.Unlock()
				t.Cleanup(func() {
					if _, err := p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table); err != nil {
						t.Errorf("dropping %s: %v", table, err)
					}
				})
				return open(t, table)
			})
		})
	}
}
