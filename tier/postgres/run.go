package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// run runs one statement and hands its rows to read, and runs both again
// when PostgreSQL aborted the statement as a deadlock's victim (40P01) or
// a serialization failure (40001): a single statement is its own
// transaction, rolled back whole, so running it again is safe, and read
// starts its answers afresh. Claims lock rows in key order, but commits
// and releases (UPDATE … FROM) lock them in their join's order, and the
// two can meet.
func (s *Store) run(ctx context.Context, read func(pgx.Rows) error, q string, args ...any) error {
	for try := 0; ; try++ {
		rows, err := s.db.Query(ctx, q, args...)
		if err == nil {
			err = read(rows)
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		if err != nil && try < 5 && ctx.Err() == nil && aborted(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return nil
	}
}

// aborted reports a statement PostgreSQL rolled back as a deadlock's
// victim (40P01) or a serialization failure (40001): running it again is
// safe.
func aborted(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}
