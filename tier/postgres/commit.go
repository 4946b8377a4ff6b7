package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// Commit turns each unexpired claim of its token into a commit for the
// window, in one statement; out[i] is OK or Lost. partition is not used. On
// error the outcome of each commit is unknown (a retry is safe: a commit
// that finds its own token's commit succeeds).
func (s *Store) Commit(ctx context.Context, _ int64, reqs []tier.Request, out []tier.Status) error {
	// One statement per at most statementBytes of results: a commit
	// group of large results (the commit queue groups several callers')
	// would otherwise exceed PostgreSQL's 1 GiB message, on every retry.
	// Statements apart are no weaker a promise: on error the outcome of
	// each key is unknown either way.
	for lo := 0; lo < len(reqs); {
		hi, size := lo, 0
		for hi < len(reqs) && (hi == lo || size+rowBytes(reqs[hi].Key, reqs[hi].Result) <= statementBytes) {
			size += rowBytes(reqs[hi].Key, reqs[hi].Result)
			hi++
		}
		ns, keys, tokens := columns(reqs[lo:hi])
		if err := s.statuses(ctx, out[lo:hi], s.commitQ, ns, keys, tokens, committedColumn(reqs[lo:hi]), s.window.Milliseconds()); err != nil {
			return err
		}
		lo = hi
	}
	return nil
}

// Release frees each key its token still holds, in one statement; out[i]
// is OK or Lost. Counted (with MaxAttempts) the key keeps its attempt
// count, one more; with giveBack nothing is counted and a commit of the
// same token, applied although the caller was told it failed, is undone.
// partition is not used.
func (s *Store) Release(ctx context.Context, _ int64, reqs []tier.Request, giveBack bool, out []tier.Status) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, tokens := columns(reqs)
	count, undo := 1, 0
	if giveBack {
		count, undo = 0, 1
	}
	return s.statuses(ctx, out, s.releaseQ, ns, keys, tokens, count, undo, s.max)
}

// Unmark gives back the marks of a failed Mark call (tier.Unmarker): a
// commit of reqs[i].Token is undone (out[i] OK), and a free key is fenced
// for fence, so that the call's mark statement, if the server runs it
// later (it had not when the caller gave up), takes nothing; every other
// statement takes the fence as free. Two statements (fenceQ, then
// unmarkQ), each safe to repeat: a late copy of either touches only the
// call's own rows, a fence on a free key, or another fence's length.
func (s *Store) Unmark(ctx context.Context, reqs []tier.Request, fence time.Duration, out []tier.Status) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, tokens := columns(reqs)
	ms := max(fence.Milliseconds(), 1)
	if err := s.run(ctx, func(pgx.Rows) error { return nil }, s.fenceQ, ns, keys, tokens, ms, s.max); err != nil {
		return err
	}
	return s.statuses(ctx, out, s.unmarkQ, ns, keys, tokens, ms)
}

// Extend makes each claim that reqs[i].Token holds, unexpired, last lease
// from now unless it lasts longer, in one statement; out[i] is OK or Lost.
func (s *Store) Extend(ctx context.Context, reqs []tier.Request, lease time.Duration, out []tier.Status) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, tokens := columns(reqs)
	return s.statuses(ctx, out, s.extendQ, ns, keys, tokens, max(lease.Milliseconds(), 1))
}

// statuses runs a statement that returns the (1-based) index of every
// request it applied: those are OK, the others Lost.
func (s *Store) statuses(ctx context.Context, out []tier.Status, q string, args ...any) error {
	return s.run(ctx, func(rows pgx.Rows) error {
		for i := range out {
			out[i] = tier.Lost
		}
		for rows.Next() {
			var i int64
			if err := rows.Scan(&i); err != nil {
				return err
			}
			if i < 1 || int(i) > len(out) || out[i-1] == tier.OK {
				return fmt.Errorf("answer for key %d of %d", i, len(out))
			}
			out[i-1] = tier.OK
		}
		return nil
	}, q, args...)
}
