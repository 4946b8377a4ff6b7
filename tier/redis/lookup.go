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
// if it still holds that value (one script call per key, atomic per key),
// reading again where it changed, up to forgetRounds times. So no copy of
// the delete, late or retried, can remove a value written after the read
// (a commit made since carries another token). Another process's cached
// answer is not reached: see the engine's Forget. reqs[i].Token names the
// call (a copy retried after a lost reply answers what the first removed).
func (s *Store) Forget(ctx context.Context, reqs []Request, out []Result) error {
	todo := make([]int, len(reqs))
	for i := range todo {
		todo[i] = i
	}
	for round := 0; len(todo) > 0; round++ {
		if round == forgetRounds {
			return fmt.Errorf("%w: %d keys changed under %d forgets in a row", ErrUnavailable, len(todo), forgetRounds)
		}
		sub := make([]Request, len(todo))
		for j, i := range todo {
			sub[j] = reqs[i]
			if sub[j].Token == (Token{}) {
				_, _ = rand.Read(sub[j].Token[:]) // a call of its own
				reqs[i].Token = sub[j].Token
			}
		}
		raw, err := s.raw(ctx, sub)
		if err != nil {
			return err
		}
		var again []int
		err = s.evalText(ctx, forgetScript, sub, true, func(r *Request) []any {
			return []any{raw[r], string(r.Token[:]), s.logsRemovals()}
		}, func(j int, v string) (err error) {
			i := todo[j]
			if v == "0" {
				again = append(again, i)
				return nil
			}
			if v == "" || v[0] != '1' {
				return fmt.Errorf("unexpected forget answer of %d bytes", len(v))
			}
			out[i], err = s.decodeLook(v[1:])
			out[i].Partition = -1
			return err
		})
		if err != nil {
			return err
		}
		todo = again
	}
	return nil
}

// forgetRounds bounds how often Forget reads a key again that changed
// between its read and its delete (a claim or commit of it meanwhile).
const forgetRounds = 8

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
