package redis

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tierdedup/tierdedup/tier"

	goredis "github.com/redis/go-redis/v9"
)

// Claim tries to claim every key for lease, in one pipeline of one script
// call per key; out must have len(reqs). On error nothing is known: some
// keys may hold the caller's claims until their lease ends (a retry with
// the same tokens acquires them again).
func (s *Store) Claim(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	var err error
	if s.max == 0 {
		err = s.claimNX(ctx, reqs, lease, out)
	} else {
		err = s.claimScripted(ctx, reqs, lease, out)
	}
	for i := range out {
		out[i].Partition = -1
	}
	return err
}

// claimScripted is Claim through claimScript.
func (s *Store) claimScripted(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.evalText(ctx, claimScript, reqs, func(r *Request) []any {
		return []any{claimPrefix(r.Token), leaseMS, windowMS, s.max}
	}, func(i int, v string) (err error) {
		out[i], err = decodeClaim(v)
		return err
	})
}

// claimNX is Claim without attempt counting: one SET key 'C'‖token NX PX
// lease GET per key, whose TTL ends the lease (measured 2.2–2.7× the claim
// throughput of the script, which must also read the server's clock).
func (s *Store) claimNX(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	pipe := s.c.Pipeline()
	cmds := make([]*goredis.StatusCmd, len(reqs))
	for i := range reqs {
		r := &reqs[i]
		cmds[i] = pipe.SetArgs(ctx, s.Key(r.NS, r.Key), claimPrefix(r.Token), goredis.SetArgs{Mode: "NX", Get: true, TTL: lease})
	}
	if err := s.exec(ctx, pipe); err != nil && !errors.Is(err, goredis.Nil) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	var later []int // keys the script must decide
	for i, cmd := range cmds {
		old, err := cmd.Result()
		switch {
		case errors.Is(err, goredis.Nil):
			out[i] = Result{Status: tier.Acquired}
		case err != nil:
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		case len(old) == 17 && old[0] == claimTag && old[1:] == string(reqs[i].Token[:]):
			out[i] = Result{Status: tier.Acquired} // our own claim: a retried SET the server had applied
		case len(old) > 0 && (old[0] == 'R' || old[0] == claimTag && len(old) > 17):
			// An attempt count, or a claim with its lease in the value,
			// left while the prefix had MaxAttempts: the script knows them.
			later = append(later, i)
		default:
			if out[i], err = decodeClaim(old); err != nil || out[i].Status != tier.Held && out[i].Status != tier.Committed {
				return fmt.Errorf("%w: unexpected value of %d bytes at %q", ErrUnavailable, len(old), s.Key(reqs[i].NS, reqs[i].Key))
			}
		}
	}
	if len(later) == 0 {
		return nil
	}
	sub, subOut := make([]Request, len(later)), make([]Result, len(later))
	for j, i := range later {
		sub[j] = reqs[i]
	}
	if err := s.claimScripted(ctx, sub, lease, subOut); err != nil {
		return err
	}
	for j, i := range later {
		out[i] = subOut[j]
	}
	return nil
}

// decodeClaim reads claimScript's answer.
func decodeClaim(v string) (Result, error) {
	if v == "" {
		return Result{}, errors.New("empty claim answer")
	}
	switch v[0] {
	case 'A', 'T', 'O', 'P', 'Q':
		n, err := strconv.ParseUint(v[1:], 10, 16)
		if err != nil {
			return Result{}, fmt.Errorf("claim answer %q: %w", v, err)
		}
		r := Result{Status: tier.Acquired, Attempts: uint16(n), Expired: v[0] == 'T' || v[0] == 'Q'}
		if v[0] == 'P' || v[0] == 'Q' {
			r.Status = tier.Poisoned
		}
		return r, nil
	case claimTag:
		return Result{Status: tier.Held}, nil
	case commitTag:
		if len(v) < 17 {
			return Result{}, fmt.Errorf("committed value of %d bytes", len(v))
		}
		r := Result{Status: tier.Committed}
		copy(r.Token[:], v[1:17])
		switch n := len(v); {
		case n == 17:
		case n == 33:
			copy(r.Digest[:], v[17:])
		case n > 41:
			copy(r.Digest[:], v[17:33])
			r.At = int64(binary.BigEndian.Uint64([]byte(v[33:41])))
			r.Result = []byte(v[41:])
		default:
			return Result{}, fmt.Errorf("committed value of %d bytes", n)
		}
		return r, nil
	}
	return Result{}, fmt.Errorf("unexpected claim answer of %d bytes", len(v))
}
