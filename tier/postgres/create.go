package postgres

import (
	"context"
	"strconv"
	"strings"
)

// createLockKey is the advisory lock every creation of the tier's tables
// takes ("tierdedu" in ASCII): creations are rare, one lock for all.
const createLockKey = 0x7469657264656475

// createTables runs stmts (CREATE … IF NOT EXISTS and the like) as one
// statement holding the creation lock to its end. PostgreSQL's IF NOT
// EXISTS does not settle a race of processes creating one table together:
// the loser fails on the catalog (23505, 42P07, or 42710 for the table's
// row type), so processes that start together must not create at once. The
// lock is a transaction's (pg_advisory_xact_lock inside a DO block, one
// implicit transaction), so a pooled connection cannot keep it.
func createTables(ctx context.Context, db DB, stmts ...string) error {
	var b strings.Builder
	b.WriteString("DO $tierdedup$ BEGIN PERFORM pg_advisory_xact_lock(")
	b.WriteString(strconv.FormatInt(createLockKey, 10))
	b.WriteString("); ")
	for _, s := range stmts {
		b.WriteString(s)
		b.WriteString("; ")
	}
	b.WriteString("END $tierdedup$")
	_, err := db.Exec(ctx, b.String())
	return err
}
