package redis

import (
	"context"
	"fmt"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// Advance claims each version key whose requested version is greater than
// the stored one (tier.Advancer), in one pipeline of one script call per
// key.
func (s *Store) Advance(ctx context.Context, reqs []Request, lease time.Duration, out []Result) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.evalText(ctx, advanceScript, reqs, true, func(r *Request) []any {
		return []any{claimPrefix(r.Token), string(r.Digest[:]), leaseMS, windowMS}
	}, func(i int, v string) error {
		out[i] = Result{Partition: -1}
		switch {
		case v == "H":
			out[i].Status = tier.Held
		case v == "A":
			out[i].Status = tier.Acquired
		case len(v) == 17 && (v[0] == 'A' || v[0] == 'S'):
			out[i].Status = tier.Acquired
			if v[0] == 'S' {
				out[i].Status = tier.Committed
			}
			copy(out[i].Digest[:], v[1:])
		default:
			return fmt.Errorf("unexpected advance answer of %d bytes", len(v))
		}
		return nil
	})
}
