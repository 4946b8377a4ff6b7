package redis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"

	goredis "github.com/redis/go-redis/v9"

	"github.com/tierdedup/tierdedup/tier"
)

// Lookup answers each key without claiming it, in one pipeline: Absent,
// Held, Committed (with the committer's Token, Digest, Result and At),
// Released (its attempt count; a claim whose lease ended counts one more)
// or Poisoned.
func (s *Store) Lookup(ctx context.Context, reqs []Request, out []Result) error {
	return s.look(ctx, reqs, out)
}

// Forget deletes each key unless a live claim holds it, and answers what
// it found, as Lookup does: it reads each key's value, then deletes it only
// if it still holds that value (one script call per key, atomic per key).
// A key whose value changed between the read and the delete (another
// call wrote it) is answered Held, and nothing of it is removed: the
// caller forgets it again once that call is done. So no copy of the
// delete, late or retried by the client, can remove a value written after
// the read (a commit made since carries another token), and a Forget never
// removes two values. Another process's cached answer is not reached: see
// the engine's Forget. reqs[i].Token names the call (a copy retried after
// a lost reply answers what the first removed).
func (s *Store) Forget(ctx context.Context, reqs []Request, out []Result) error {
	raw, err := s.raw(ctx, reqs)
	if err != nil {
		return err
	}
	var own Token
	_, _ = rand.Read(own[:]) // for requests that name no call of theirs
	return s.evalText(ctx, forgetScript, reqs, true, func(r *Request) []any {
		token := r.Token
		if token == (Token{}) {
			token = own
		}
		return []any{raw[r], string(token[:]), s.logsRemovals()}
	}, func(i int, v string) (err error) {
		switch {
		case v == "0":
			out[i] = Result{Status: tier.Held}
		case v == "" || v[0] != '1':
			return fmt.Errorf("unexpected forget answer of %d bytes", len(v))
		default:
			out[i], err = s.decodeLook(v[1:])
		}
		out[i].Partition = -1
		return err
	})
}

// raw reads the value of each of reqs, as the forget script compares
// them: ” for an absent or fenced key.
func (s *Store) raw(ctx context.Context, reqs []Request) (map[*Request]string, error) {
	pipe := s.c.Pipeline()
	cmds := make([]*goredis.StringCmd, len(reqs))
	for i := range reqs {
		cmds[i] = pipe.Get(ctx, s.Key(reqs[i].NS, reqs[i].Key))
	}
	if err := s.exec(ctx, pipe); err != nil && !errors.Is(err, goredis.Nil) {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	raw := make(map[*Request]string, len(reqs))
	for i := range reqs {
		v, err := cmds[i].Result()
		switch {
		case errors.Is(err, goredis.Nil):
			v = ""
		case err != nil:
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		case len(v) > 0 && v[0] == fenceTag:
			v = ""
		}
		raw[&reqs[i]] = v
	}
	return raw, nil
}

func (s *Store) look(ctx context.Context, reqs []Request, out []Result) error {
	return s.evalText(ctx, lookScript, reqs, false, func(r *Request) []any { return nil }, func(i int, v string) (err error) {
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
