package engine

import (
	"context"
	"sync"
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
//
// A claim it answered for holds no record in the tier. When the tier is
// back by the time that claim commits, the commit takes the key in the
// tier then (claim and commit), so the processed message is recorded; a
// key another worker holds or committed meanwhile is fenced as usual.
//
// It answers only for the caller's keys. A call touching one of the
// engine's own namespaces (tokens, Advance's versions) fails closed
// whole: their promises are "exactly once" and "never backwards", which
// an answer made up while the tier is down would break (a token issued
// that was never stored, or used twice; an entity's version that moves
// back once the lease ends).
type failOpen struct {
	tier.Exact
	answered *atomic.Uint64 // Stats.Calls.FailOpen
	lease    time.Duration
	open     *openClaims
}

// openClaims are the owner tokens of claims failOpen answered for, until
// they commit or release, or their lease ends.
type openClaims struct {
	mu sync.Mutex
	m  map[tier.Token]time.Time
}

func (o *openClaims) add(reqs []tier.Request, until time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = make(map[tier.Token]time.Time)
	}
	now := time.Now()
	for t, u := range o.m {
		if u.Before(now) {
			delete(o.m, t)
		}
	}
	for i := range reqs {
		o.m[reqs[i].Token] = until
	}
}

// take removes and reports whether token was answered for.
func (o *openClaims) take(token tier.Token) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.m[token]
	delete(o.m, token)
	return ok
}

func newFailOpen(x tier.Exact, answered *atomic.Uint64, lease time.Duration) failOpen {
	return failOpen{Exact: x, answered: answered, lease: lease, open: &openClaims{}}
}

// mayAnswer reports whether failOpen may answer for every request of a
// call: none is in one of the engine's own namespaces, whose names start
// with a NUL byte.
func mayAnswer(reqs []tier.Request) bool {
	for i := range reqs {
		if ownNamespace(reqs[i].NS) || reqs[i].Versioned {
			return false
		}
	}
	return true
}

func (f failOpen) Claim(ctx context.Context, reqs []tier.Request, lease time.Duration, out []tier.Answer) error {
	if err := f.Exact.Claim(ctx, reqs, lease, out); err != nil {
		if !mayAnswer(reqs) {
			return err
		}
		for i := range out {
			out[i] = tier.Answer{Status: tier.Acquired, Partition: -1}
		}
		f.answered.Add(uint64(len(out)))
		f.open.add(reqs, time.Now().Add(lease))
	}
	return nil
}

func (f failOpen) Commit(ctx context.Context, partition int64, reqs []tier.Request, out []tier.Status) error {
	if err := f.Exact.Commit(ctx, partition, reqs, out); err != nil {
		if !mayAnswer(reqs) {
			// A group commit holding one of the engine's own keys fails
			// closed as a whole: the tier returned one error for all.
			return err
		}
		f.answerCommits(reqs, out)
		return nil
	}
	// Claims answered for while the tier was down, which it does not hold:
	// take them now.
	var late []int
	for i := range reqs {
		if f.open.take(reqs[i].Token) && out[i] == tier.Lost {
			late = append(late, i)
		}
	}
	if len(late) == 0 {
		return nil
	}
	sub := make([]tier.Request, len(late))
	for q, i := range late {
		sub[q] = reqs[i]
	}
	ans := make([]tier.Answer, len(sub))
	if err := f.Exact.Claim(ctx, sub, f.lease, ans); err != nil {
		f.answerCommits(sub, nil)
		for _, i := range late {
			out[i] = tier.OK
		}
		return nil
	}
	var take []tier.Request
	var at []int
	for q, a := range ans {
		if a.Status == tier.Acquired {
			take, at = append(take, sub[q]), append(at, late[q])
		}
	}
	if len(take) == 0 {
		return nil
	}
	st := make([]tier.Status, len(take))
	if err := f.Exact.Commit(ctx, partition, take, st); err != nil {
		f.answerCommits(take, st)
	}
	for q, i := range at {
		out[i] = st[q]
	}
	return nil
}

// answerCommits answers OK for commits the tier could not take.
func (f failOpen) answerCommits(reqs []tier.Request, out []tier.Status) {
	for i := range out {
		out[i] = tier.OK
	}
	for i := range reqs {
		f.open.take(reqs[i].Token)
	}
	f.answered.Add(uint64(len(reqs)))
}

func (f failOpen) Release(ctx context.Context, partition int64, reqs []tier.Request, giveBack bool, out []tier.Status) error {
	err := f.Exact.Release(ctx, partition, reqs, giveBack, out)
	for i := range reqs {
		if f.open.take(reqs[i].Token) && err == nil && out[i] == tier.Lost {
			out[i] = tier.OK // the tier never held it: nothing to free
		}
	}
	return err
}

// failOpenMarker is failOpen for a tier's marks: a mark that cannot reach
// the tier answers Acquired (the key is New and counted as committed; the
// tier never records it).
type failOpenMarker struct {
	failOpen
	m tier.Marker
}

func (f failOpenMarker) Mark(ctx context.Context, reqs []tier.Request, out []tier.Answer) error {
	if err := f.m.Mark(ctx, reqs, out); err != nil {
		if !mayAnswer(reqs) {
			return err
		}
		for i := range out {
			out[i] = tier.Answer{Status: tier.Acquired, Partition: -1}
		}
		f.answered.Add(uint64(len(out)))
	}
	return nil
}
