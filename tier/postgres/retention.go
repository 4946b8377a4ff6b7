package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Drop starts a sweep of the table's expired rows in the background and
// returns at once (before and highWater are the engine's; every row carries
// its own expiry and answers as absent once it passed, so a sweep only
// reclaims space and no answer waits for it). A sweep deletes block range
// by block range (Options.SweepBlocks), one short statement each, so no
// claim waits behind a long delete; a Drop during a sweep runs one more
// after it. LastSweep reports how the last one ended.
func (s *Store) Drop(_, _ int64) error {
	s.sweeps.start(s.sweep)
	return nil
}

// LastSweep reports when the last finished sweep ended, how many rows it
// deleted and the error that stopped it (nil when it swept the whole
// table). A zero time means no sweep has finished.
func (s *Store) LastSweep() (at time.Time, deleted int64, err error) {
	return s.sweeps.last()
}

// sweep deletes the expired rows of the whole table, block range by block
// range, and returns how many it deleted.
func (s *Store) sweep(ctx context.Context) (int64, error) {
	var blocks int64
	if err := s.run(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			if err := rows.Scan(&blocks); err != nil {
				return err
			}
		}
		return nil
	}, s.sizeQ); err != nil {
		return 0, err
	}
	var deleted int64
	for from := int64(0); from < blocks; from += s.sweeps.blocks {
		tag, err := s.db.Exec(ctx, s.sweepQ, from, from+s.sweeps.blocks)
		for try := 0; err != nil && try < 5 && ctx.Err() == nil && aborted(err); try++ {
			// A claim taking an expired row locks it in key order, the
			// sweep in the heap's: they can deadlock.
			tag, err = s.db.Exec(ctx, s.sweepQ, from, from+s.sweeps.blocks)
		}
		if err != nil {
			return deleted, fmt.Errorf("%w: sweeping blocks %d to %d: %w", ErrUnavailable, from, from+s.sweeps.blocks, err)
		}
		deleted += tag.RowsAffected()
	}
	return deleted, nil
}
