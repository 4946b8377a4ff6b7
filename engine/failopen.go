package engine

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/tierdedup/tierdedup/tier"
)

// failOpen is a shared exact tier that answers for itself when it cannot be
// reached (Options.FailOpen): every claim Acquired, so its key is New, and
// every commit OK, counting each such answer. Duplicates may then be let
// through, which is what FailOpen trades for availability. Releases are
// passed through: a release that fails changes nothing the caller can lose.
// The tier's optional capabilities (retention, marks) are found under the
// wrapper when the engine opens.
type failOpen struct {
	tier.Exact
	answered *atomic.Uint64 // Stats.FailOpen
}

func (f failOpen) Claim(ctx context.Context, reqs []tier.Request, lease time.Duration, out []tier.Answer) error {
	if err := f.Exact.Claim(ctx, reqs, lease, out); err != nil {
		for i := range out {
			out[i] = tier.Answer{Status: tier.Acquired, Partition: -1}
		}
		f.answered.Add(uint64(len(out)))
	}
	return nil
}

func (f failOpen) Commit(ctx context.Context, partition int64, reqs []tier.Request, out []tier.Status) error {
	if err := f.Exact.Commit(ctx, partition, reqs, out); err != nil {
		for i := range out {
			out[i] = tier.OK
		}
		f.answered.Add(uint64(len(out)))
	}
	return nil
}

// failOpenMarker is failOpen for a tier's marks: a mark that cannot reach
// the tier answers Acquired (the key is New and counted as committed).
type failOpenMarker struct {
	failOpen
	m tier.Marker
}

func (f failOpenMarker) Mark(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	if err := f.m.Mark(ctx, reqs, out); err != nil {
		for i := range out {
			out[i] = tier.Answer{Status: tier.Acquired, Partition: -1}
		}
		f.answered.Add(uint64(len(out)))
	}
	return nil
}
