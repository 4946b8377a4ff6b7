package redis

import (
	"context"
	"fmt"
	"strconv"

	"github.com/tierdedup/tierdedup/tier"
)

// Lookup answers each key without claiming it, in one pipeline: Absent,
// Held, Committed (with the committer's Token, Digest, Result and At),
// Released (its attempt count; a claim whose lease ended counts one more)
// or Poisoned.
func (s *Store) Lookup(ctx context.Context, reqs []Request, out []Result) error {
	return s.look(ctx, reqs, out, false)
}

// Forget deletes each key unless a live claim holds it (one script call
// per key, atomic per key, in one pipeline), and answers what it found, as
// Lookup does. Another process's cached answer is not reached: see the
// engine's Forget.
func (s *Store) Forget(ctx context.Context, reqs []Request, out []Result) error {
	return s.look(ctx, reqs, out, true)
}

func (s *Store) look(ctx context.Context, reqs []Request, out []Result, forget bool) error {
	flag := 0
	if forget {
		flag = 1
	}
	return s.evalText(ctx, lookScript, reqs, forget, func(r *Request) []any { return []any{flag, s.logsRemovals()} }, func(i int, v string) (err error) {
		out[i], err = s.decodeLook(v)
		out[i].Partition = -1
		return err
	})
}

// decodeLook reads lookScript's answer.
func (s *Store) decodeLook(v string) (Result, error) {
	if v == "" {
		return Result{Status: tier.Absent}, nil
	}
	counted := func(digits string, plus uint64) (Result, error) {
		n, err := strconv.ParseUint(digits, 10, 16)
		if err != nil {
			return Result{}, fmt.Errorf("attempt count %q: %w", digits, err)
		}
		n = min(n+plus, tier.MaxAttempts)
		r := Result{Status: tier.Released, Attempts: uint16(n)}
		if s.max > 0 && int(n) >= s.max {
			r.Status = tier.Poisoned
		}
		return r, nil
	}
	switch v[0] {
	case 'H':
		return Result{Status: tier.Held}, nil
	case 'E':
		return counted(v[1:], 1)
	case 'R':
		return counted(v[1:], 0)
	case commitTag:
		return decodeClaim(v)
	}
	return Result{}, fmt.Errorf("unexpected value of %d bytes", len(v))
}
