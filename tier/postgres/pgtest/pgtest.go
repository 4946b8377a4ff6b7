package pgtest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DSN is the loopback PostgreSQL the tests use.
const DSN = "postgres://postgres:test@127.0.0.1:5432/test"

// Pool returns a pool on DSN (with extra connection parameters, such as
// "application_name=x", if given), closed when the test ends.
func Pool(t testing.TB, params ...string) *pgxpool.Pool {
	t.Helper()
	dsn := DSN
	for i, p := range params {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		dsn += sep + p
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p, err := pgxpool.New(ctx, dsn)
	if err == nil {
		err = p.Ping(ctx)
	}
	if err != nil {
		if os.Getenv("TIERDEDUP_REQUIRE_POSTGRES") != "" {
			t.Fatalf("PostgreSQL at %s: %v", DSN, err)
		}
		t.Skipf("no PostgreSQL at %s: %v", DSN, err)
	}
	t.Cleanup(p.Close)
	return p
}
