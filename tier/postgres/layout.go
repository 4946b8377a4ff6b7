package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// layoutVersion is the format of the rows: 2 stores every key with a
// one-byte form (see appendStoredKey).
const layoutVersion = 2

// columnNames are the table's columns; a table of that name without them
// is not one this Store can use.
var columnNames = []string{"ns", "key", "state", "token", "lease_until", "attempts", "digest", "expires", "taken_over"}

// checkLayout records the table's format, window and MaxAttempts in its
// comment (dropped with the table, so it never outlives the rows it
// describes) on first use, and refuses a Store whose Options disagree. A
// table without a comment is recorded only while it is empty and has every
// column: rows of unknown format are never trusted. To change the options,
// stop every process on the table and drop it, or use a new table.
func (s *Store) checkLayout(ctx context.Context) error {
	want := fmt.Sprintf("tierdedup layout %d window=%dms max-attempts=%d", layoutVersion, s.window.Milliseconds(), s.max)
	if s.uncached {
		want += " uncached"
	}
	var got *string
	var columns int64
	var empty bool
	read := func() error {
		return s.run(ctx, func(rows pgx.Rows) error {
			for rows.Next() {
				if err := rows.Scan(&got, &columns, &empty); err != nil {
					return err
				}
			}
			return nil
		}, fmt.Sprintf(`SELECT obj_description($1::regclass, 'pg_class'),
	(SELECT count(*) FROM pg_attribute WHERE attrelid = $1::regclass AND attname = ANY($2) AND NOT attisdropped),
	NOT EXISTS (SELECT 1 FROM %s)`, s.table), s.table, columnNames)
	}
	err := read()
	if err == nil && got == nil {
		if columns != int64(len(columnNames)) {
			return fmt.Errorf("%w: table %s records no layout and has %d of the %d columns", ErrLayout, s.table, columns, len(columnNames))
		}
		if !empty {
			return fmt.Errorf("%w: table %s records no layout and holds rows of an unknown format", ErrLayout, s.table)
		}
		// First use: record it under a lock, so of two processes opening
		// with different options one records and the other is refused.
		_, err = s.db.Exec(ctx, fmt.Sprintf(`DO $$ BEGIN
	LOCK TABLE %[1]s IN SHARE ROW EXCLUSIVE MODE;
	IF obj_description('%[1]s'::regclass, 'pg_class') IS NULL THEN
		COMMENT ON TABLE %[1]s IS '%[2]s';
	END IF;
END $$`, s.table, want))
		if err == nil {
			err = read()
		}
	}
	if err != nil {
		return fmt.Errorf("%w: the layout of %s: %w", ErrUnavailable, s.table, err)
	}
	if got == nil || *got != want {
		return fmt.Errorf("%w: table %s records %q, these options %q", ErrLayout, s.table, deref(got), want)
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
