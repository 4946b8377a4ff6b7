package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tierdedup/tierdedup/tier"
	"github.com/tierdedup/tierdedup/tier/postgres"
	"github.com/tierdedup/tierdedup/tier/postgres/pgtest"
	"github.com/tierdedup/tierdedup/tier/tiertest"
)

// TestArchiveContract runs the archive contract suite over the PostgreSQL
// archive on the loopback server, each check in tables of its own,
// dropped after it.
func TestArchiveContract(t *testing.T) {
	p := pgtest.Pool(t)
	run := time.Now().UnixNano() % 1e9
	tables := map[string]string{} // check → its tables' name
	tiertest.RunArchive(t, func(t *testing.T) tier.ArchiveBackend {
		table, ok := tables[t.Name()]
		if !ok {
			table = fmt.Sprintf("arch_%d_%d", run, len(tables))
			tables[t.Name()] = table
			t.Cleanup(func() { dropArchive(t, p, table) })
		}
		return postgres.Archive{DB: p, Table: table}
	})
}

// dropArchive drops an archive's tables.
func dropArchive(t *testing.T, p *pgxpool.Pool, table string) {
	for _, s := range []string{"", "_layout", "_parts", "_blobs", "_log", "_open"} {
		if _, err := p.Exec(context.Background(), "DROP TABLE IF EXISTS "+table+s+" CASCADE"); err != nil {
			t.Errorf("dropping %s%s: %v", table, s, err)
		}
	}
}

// TestArchiveAppenderContract runs the contract of an archive fed from a
// shared tier's log over the PostgreSQL archive.
func TestArchiveAppenderContract(t *testing.T) {
	p := pgtest.Pool(t)
	run := time.Now().UnixNano() % 1e9
	tables := map[string]string{}
	tiertest.RunAppender(t, func(t *testing.T) tier.ArchiveBackend {
		table, ok := tables[t.Name()]
		if !ok {
			table = fmt.Sprintf("app_%d_%d", run, len(tables))
			tables[t.Name()] = table
			t.Cleanup(func() { dropArchive(t, p, table) })
		}
		return postgres.Archive{DB: p, Table: table}
	})
}
