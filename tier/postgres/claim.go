package postgres

import (
	"bytes"
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tierdedup/tierdedup/tier"
)

// Claim claims every key for lease, in one statement; out must have
// len(reqs), and no key may appear twice in reqs. Answers: Acquired (with
// the count the claim carries, and Expired when it took over a lease that
// ended), Held, Committed (with the committer's Token and the Digest) or
// Poisoned. Partition is -1: rows expire by the table's own clock. On error
// nothing is known: some keys may hold the caller's claims until their
// lease ends (a retry with the same tokens acquires them again).
func (s *Store) Claim(ctx context.Context, reqs []tier.Request, lease time.Duration, out []tier.Answer) error {
	if len(reqs) == 0 {
		return nil
	}
	if err := s.adopt(ctx, reqs, false); err != nil {
		return err
	}
	return s.take(ctx, reqs, out, func(reqs []tier.Request) (string, []any) {
		ns, keys, tokens := columns(reqs)
		return s.claimQ, []any{ns, keys, tokens, max(lease.Milliseconds(), 1), s.window.Milliseconds(), s.max}
	})
}

// Mark is Claim with every key it takes committed at once, with its digest
// (tier.Marker): one statement instead of a claim and a commit.
func (s *Store) Mark(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	if len(reqs) == 0 {
		return nil
	}
	if err := s.adopt(ctx, reqs, true); err != nil {
		return err
	}
	mark := func(reqs []tier.Request) (string, []any) {
		ns, keys, tokens := columns(reqs)
		return s.markQ, []any{ns, keys, tokens, digestColumn(reqs), s.window.Milliseconds(), s.max}
	}
	err := s.take(ctx, reqs, out, mark)
	// An earlier call's mark statement the server ran between the adopt
	// and the mark (it waited in a stalled server while its call failed)
	// left a commit of one of the caller's earlier tokens: adopted and
	// marked again, so the retry answers for it, and a late give-back of
	// that call, naming its token, finds nothing of its own. Each late
	// statement runs once, so the rounds are few.
	for round := 0; err == nil && round < takeRounds; round++ {
		var late []int
		for i := range reqs {
			if out[i].Status == tier.Committed && out[i].Token != reqs[i].Token && tier.EarlierOf(reqs[i].Earlier, reqs[i].Token, out[i].Token) {
				late = append(late, i)
			}
		}
		if len(late) == 0 {
			break
		}
		sub, sout := make([]tier.Request, len(late)), make([]tier.Answer, len(late))
		for j, i := range late {
			sub[j] = reqs[i]
		}
		if err = s.adopt(ctx, sub, true); err != nil {
			break
		}
		if err = s.take(ctx, sub, sout, mark); err != nil {
			break
		}
		for j, i := range late {
			out[i] = sout[j]
		}
	}
	for i := range reqs {
		if err == nil && reqs[i].Earlier != (tier.Token{}) && out[i].Status == tier.Committed && out[i].Token == reqs[i].Token {
			// An earlier call's commit, adopted and made this mark's.
			out[i] = tier.Answer{Status: tier.Acquired, Partition: -1}
		}
	}
	return err
}

// adopt moves to each retry's token (reqs[i].Earlier set) the claim or
// commit its earlier calls' tokens hold, in one statement, before the
// claim or mark statement runs: only retries after lost replies pay it.
// A late copy of it moves only rows of calls that were never answered.
func (s *Store) adopt(ctx context.Context, reqs []tier.Request, mark bool) error {
	var retried []tier.Request
	for i := range reqs {
		if reqs[i].Earlier != (tier.Token{}) {
			retried = append(retried, reqs[i])
		}
	}
	if len(retried) == 0 {
		return nil
	}
	ns, keys, tokens := columns(retried)
	earlier := make([][]byte, len(retried))
	for i := range retried {
		earlier[i] = retried[i].Earlier[:]
	}
	return s.run(ctx, func(pgx.Rows) error { return nil }, s.adoptQ, ns, keys, tokens, earlier, mark, digestColumn(retried), s.window.Milliseconds())
}

// takeRounds bounds how often take runs its statement again for keys whose
// row went (a Forget, an expiry) between the statement and the read of the
// keys it did not take: each further round needs another removal of the
// same key in that gap. A key still unsettled after them answers Held.
const takeRounds = 4

// take runs a claim or mark statement (stmt builds it for a batch), which
// returns the rows it took, and reads the others. A key it did not take
// whose row is gone or expired by the read was freed in between: it is
// not held by anyone, so the statement runs again for it rather than
// answer Held.
func (s *Store) take(ctx context.Context, reqs []tier.Request, out []tier.Answer, stmt func([]tier.Request) (string, []any)) error {
	again, err := s.takeOnce(ctx, reqs, out, stmt)
	for round := 1; round < takeRounds && err == nil && len(again) > 0; round++ {
		sub := make([]tier.Request, len(again))
		for q, i := range again {
			sub[q] = reqs[i]
		}
		subOut := make([]tier.Answer, len(sub))
		var next []int
		next, err = s.takeOnce(ctx, sub, subOut, stmt)
		for q, i := range again {
			out[i] = subOut[q]
		}
		for q, j := range next {
			next[q] = again[j]
		}
		again = next
	}
	return err
}

// takeOnce is one round of take; it returns the indices of the keys freed
// between its statement and its read (answered Held meanwhile).
func (s *Store) takeOnce(ctx context.Context, reqs []tier.Request, out []tier.Answer, stmt func([]tier.Request) (string, []any)) (freed []int, err error) {
	q, args := stmt(reqs)
	ns, keys := args[0].([][]byte), args[1].([][]byte)
	at := make(map[string]int, len(reqs)) // (ns, key) → index in reqs
	for i := range reqs {
		at[rowID(ns[i], keys[i])] = i
	}
	taken := 0
	err = s.run(ctx, func(rows pgx.Rows) error {
		taken = 0
		clear(out)
		for rows.Next() {
			var rns, rkey []byte
			var attempts int32
			var takenOver bool
			if err := rows.Scan(&rns, &rkey, &attempts, &takenOver); err != nil {
				return err
			}
			i, ok := at[rowID(rns, rkey)]
			if !ok || out[i].Status != 0 {
				return errors.New("an answer for a key not asked")
			}
			out[i] = tier.Answer{Status: tier.Acquired, Attempts: uint16(attempts), Expired: s.max > 0 && takenOver, Partition: -1}
			taken++
		}
		return nil
	}, q, args...)
	if err != nil || taken == len(reqs) {
		return nil, err
	}
	// The keys not taken: read as they stand now.
	var sns, skeys [][]byte
	read := make([]bool, len(reqs))
	for i := range reqs {
		if out[i].Status == 0 {
			sns, skeys = append(sns, ns[i]), append(skeys, keys[i])
			out[i] = tier.Answer{Status: tier.Held, Partition: -1} // unless the row says more
		} else {
			read[i] = true
		}
	}
	err = s.run(ctx, func(rows pgx.Rows) error {
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				return err
			}
			i, ok := at[rowID(r.ns, r.key)]
			if !ok || out[i].Status == tier.Acquired {
				continue
			}
			a := tier.Answer{Status: tier.Held, Partition: -1}
			switch {
			case r.expires <= r.ms, r.state == "X" && !bytes.Equal(r.token, reqs[i].Token[:]) && (s.max == 0 || int(r.attempts) < s.max):
				// Expired, or another call's fence (its count below the
				// limit), since the claim ran: free now, but not taken by
				// it: the statement runs again for it. (A fence of the
				// caller's own token is this late call's own give-back:
				// Held, nothing taken.)
				continue
			case r.state == "D":
				if err := r.committed(&a); err != nil {
					return err
				}
			case s.max > 0 && ((r.state == "R" || r.state == "X") && int(r.attempts) >= s.max ||
				r.state == "C" && r.leaseEnd <= r.ms && int(r.attempts)+1 >= s.max):
				a.Status, a.Attempts = tier.Poisoned, uint16(r.attempts)
				if r.state == "C" {
					a.Attempts++
					a.Expired = true
				}
			}
			out[i], read[i] = a, true
		}
		return nil
	}, s.stateQ, sns, skeys)
	if err != nil {
		return nil, err
	}
	for i, ok := range read {
		if !ok {
			freed = append(freed, i) // its row went since the statement
		}
	}
	return freed, nil
}
