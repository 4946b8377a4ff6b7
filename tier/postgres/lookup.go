package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// Lookup answers each key without claiming it, in one statement: Absent,
// Held, Committed (with Token, Digest, Result and At), Released (its
// attempt count; a claim whose lease ended counts one more) or Poisoned.
func (s *Store) Lookup(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	return s.look(ctx, reqs, out, s.stateQ)
}

// Forget deletes each key's row unless a live claim holds it, in one
// statement, and answers what it found, as Lookup does.
func (s *Store) Forget(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	return s.look(ctx, reqs, out, s.forgetQ)
}

// look runs q (stateQ or forgetQ) over the batch and answers each key from
// its row; a key without one is Absent.
func (s *Store) look(ctx context.Context, reqs []tier.Request, out []tier.Answer, q string) error {
	if len(reqs) == 0 {
		return nil
	}
	ns, keys, _ := columns(reqs)
	at := make(map[string]int, len(reqs))
	for i := range reqs {
		at[rowID(ns[i], keys[i])] = i
	}
	return s.run(ctx, func(rows pgx.Rows) error {
		for i := range out {
			out[i] = tier.Answer{Status: tier.Absent, Partition: -1}
		}
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				return err
			}
			i, ok := at[rowID(r.ns, r.key)]
			if !ok {
				continue
			}
			a := tier.Answer{Status: tier.Absent, Partition: -1}
			switch {
			case r.expires <= r.ms, r.state == "X" && r.attempts == 0: // expired, or a fence without a count: free
			case r.state == "D":
				if err := r.committed(&a); err != nil {
					return err
				}
			case r.state == "C" && r.leaseEnd > r.ms:
				a.Status = tier.Held
			default: // a count, or a claim whose lease ended (counted)
				n := int(r.attempts)
				if r.state == "C" && s.max > 0 {
					n++
				}
				a.Status, a.Attempts = tier.Released, uint16(min(n, tier.MaxAttempts))
				if s.max > 0 && n >= s.max {
					a.Status = tier.Poisoned
				}
			}
			out[i] = a
		}
		return nil
	}, q, ns, keys)
}
