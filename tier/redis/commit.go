package redis

import (
	"context"
	"time"
)

// Commit turns each unexpired claim into a committed key with the window
// (or the request's shorter Window) as TTL, in one pipeline; out[i] is OK or Lost. On error the outcome of each
// commit is unknown (a retry is safe: a commit that finds its own value
// succeeds).
// partition is not used: Redis dates keys by their TTL.
func (s *Store) Commit(ctx context.Context, _ int64, reqs []Request, out []Status) error {
	window := s.window.Milliseconds()
	return s.runScript(ctx, commitScript, reqs, out, func(r *Request) []any {
		w := window
		if r.Window > 0 {
			w = max(r.Window.Milliseconds(), 1)
		}
		return []any{claimPrefix(r.Token), commitValue(r), w, s.logs(r)}
	})
}

// Release frees each key that still holds the caller's unexpired claim
// (keeping its attempt count with MaxAttempts, one more for this release),
// in one pipeline; out[i] is OK or Lost. A retried release whose first
// attempt was applied reports Lost: the key is free either way.
//
// With giveBack the caller gives claims back because its own call failed
// (not because a handler did): the attempt count is kept as it is, and a
// commit carrying the caller's token, applied by the server although the
// caller was told it failed, is undone too, so that every process finds
// the key free again, with the attempt count reqs[i].Attempts the claim
// carried. partition is not used.
func (s *Store) Release(ctx context.Context, _ int64, reqs []Request, giveBack bool, out []Status) error {
	window := s.window.Milliseconds()
	count, undo := 1, 0
	if giveBack {
		count, undo = 0, 1
	}
	var versioned []int
	for i := range reqs {
		if reqs[i].Versioned {
			versioned = append(versioned, i)
		}
	}
	if len(versioned) == 0 {
		return s.runScript(ctx, releaseScript, reqs, out, func(r *Request) []any {
			return []any{claimPrefix(r.Token), s.max, window, count, undo, r.Attempts, s.logsRemovals()}
		})
	}
	// Version keys restore the version their claim replaced; the others
	// are released as claims are.
	var plain []int
	for i := range reqs {
		if !reqs[i].Versioned {
			plain = append(plain, i)
		}
	}
	restored := string(append([]byte{commitTag}, make([]byte, len(Token{}))...)) // no committer's token
	for _, part := range []struct {
		idx  []int
		sc   *keyScript
		args func(*Request) []any
	}{
		{plain, releaseScript, func(r *Request) []any {
			return []any{claimPrefix(r.Token), s.max, window, count, undo, r.Attempts, s.logsRemovals()}
		}},
		{versioned, unadvanceScript, func(r *Request) []any { return []any{claimPrefix(r.Token), window, restored} }},
	} {
		if len(part.idx) == 0 {
			continue
		}
		sub, st := make([]Request, len(part.idx)), make([]Status, len(part.idx))
		for j, i := range part.idx {
			sub[j] = reqs[i]
		}
		if err := s.runScript(ctx, part.sc, sub, st, part.args); err != nil {
			return err
		}
		for j, i := range part.idx {
			out[i] = st[j]
		}
	}
	return nil
}

// Extend makes each claim that reqs[i].Token holds, unexpired, last lease
// from now unless it lasts longer, in one pipeline; out[i] is OK or Lost.
func (s *Store) Extend(ctx context.Context, reqs []Request, lease time.Duration, out []Status) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.runScript(ctx, extendScript, reqs, out, func(r *Request) []any {
		return []any{claimPrefix(r.Token), leaseMS, windowMS}
	})
}
