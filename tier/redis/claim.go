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
		err = s.claimNX(ctx, reqs, lease, false, out)
	} else {
		err = s.claimScripted(ctx, reqs, lease, false, out)
	}
	for i := range out {
		out[i].Partition = -1
	}
	return err
}

// claimScripted is Claim through claimScript (mark: Mark's).
func (s *Store) claimScripted(ctx context.Context, reqs []Request, lease time.Duration, mark bool, out []Result) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	return s.evalText(ctx, claimScript, reqs, true, func(r *Request) []any {
		var earlier string
		if r.Earlier != (Token{}) {
			earlier = string(r.Earlier[:])
		}
		if mark {
			return []any{claimPrefix(r.Token), leaseMS, windowMS, s.max, earlier, commitValue(r), s.commitTTL(r).Milliseconds(), s.forgottenInScript()}
		}
		return []any{claimPrefix(r.Token), leaseMS, windowMS, s.max, earlier}
	}, func(i int, v string) (err error) {
		out[i], err = decodeClaim(v)
		return err
	})
}

// Mark is Claim with every key it acquires committed in the same step
// (tier.Marker): one SET … NX GET of the committed value per key without
// MaxAttempts, one script call per key otherwise, in one pipeline. A key
// it acquires is committed with reqs[i].Token and Digest, for the window
// or reqs[i].Window. A mark whose reply was lost finds its own commit when
// retried (Committed with its token).
func (s *Store) Mark(ctx context.Context, reqs []Request, out []Result) error {
	var err error
	if s.max == 0 {
		err = s.claimNX(ctx, reqs, 0, true, out)
	} else {
		err = s.claimScripted(ctx, reqs, time.Millisecond, true, out)
	}
	for i := range out {
		out[i].Partition = -1
	}
	return err
}

// fenceTag starts a mark's fence (Unmark): 'X' ‖ token.
const fenceTag = 'X'

// Unmark undoes each mark of reqs[i].Token, or, where the key is free,
// fences it out for fence (a mark still on its way, the server paused,
// finds the key taken; every script takes the fence as free), in one
// pipeline; out[i] is OK when a mark was undone.
//
// On one server each call's token is also added to the forgotten set
// (forgottenKey, in the same script), as a Forget adds the commits it
// removes: a copy of the call's settling script (go-redis sends a script
// again after a lost reply) that arrives after another call took the key
// and freed it, leaving its own fence, finds the token there and writes
// nothing, where the fence alone no longer names the call. (In a Cluster
// or Ring the scripts cannot reach the set: left open, as for a Forget.)
func (s *Store) Unmark(ctx context.Context, reqs []Request, fence time.Duration, out []Status) error {
	ms := max(fence.Milliseconds(), 1)
	set := s.forgottenInScript()
	return s.runScript(ctx, unmarkScript, reqs, out, func(r *Request) []any {
		return []any{string(append([]byte{commitTag}, r.Token[:]...)), string(append([]byte{fenceTag}, r.Token[:]...)), ms, set, forgottenMS}
	})
}

// CanMark reports whether the engine may mark through Mark: without
// MaxAttempts. With it, a mark whose reply is lost leaves the caller
// without the attempt count its claim replaced, which the give-back must
// restore; the engine then claims and commits in two steps.
func (s *Store) CanMark() bool { return s.max == 0 }

// commitTTL is how long r's commit lives: the window, or its namespace's.
func (s *Store) commitTTL(r *Request) time.Duration {
	if r.Window > 0 {
		return max(r.Window, time.Millisecond)
	}
	return s.window
}

// claimNX is Claim without attempt counting: one SET key 'C'‖token NX PX
// lease GET per key, whose TTL ends the lease (measured 2.2–2.7× the claim
// throughput of the script, which must also read the server's clock). With
// mark it sets the committed value for the commit's TTL instead (Mark).
// The SETs go as plain commands in one pipeline, not as one script call
// per batch: a script's call of SET costs the server about 1.3 times the
// command's own cost (measured with INFO commandstats, docs/shared-tiers.md),
// and the server's time is what processes sharing it compete for.
func (s *Store) claimNX(ctx context.Context, reqs []Request, lease time.Duration, mark bool, out []Result) error {
	olds, lost, err := s.setNX(ctx, reqs, lease, mark)
	if err != nil {
		return err
	}
	var later []int // keys the script must decide
	for i, a := range olds {
		old, _ := a.(string)
		if lost[i] {
			// A mark whose reply was lost: the script finds what it did
			// (its commit, or a Forget's trace of it) or marks the key now.
			later = append(later, i)
			continue
		}
		switch {
		case a == nil:
			out[i] = Result{Status: tier.Acquired}
		case len(old) == 17 && old[0] == claimTag && old[1:] == string(reqs[i].Token[:]) && !mark:
			out[i] = Result{Status: tier.Acquired} // our own claim: a retried SET the server had applied
		case len(old) == 17 && old[0] == claimTag && old[1:] == string(reqs[i].Token[:]):
			// A mark retrying a claim of its token whose reply was lost:
			// the script turns the claim into the commit.
			later = append(later, i)
		case len(old) > 0 && (old[0] == 'R' || old[0] == fenceTag || old[0] == claimTag && len(old) > 17):
			// An attempt count, or a claim with its lease in the value,
			// left while the prefix had MaxAttempts: the script knows them.
			later = append(later, i)
		case len(old) >= 17 && (old[0] == claimTag || old[0] == commitTag) && tier.EarlierOf(reqs[i].Earlier, reqs[i].Token, Token([]byte(old[1:17]))):
			// A claim or commit of the caller's earlier call, whose reply
			// was lost: the script adopts it (Request.Earlier).
			later = append(later, i)
		default:
			var err error
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
	if err := s.claimScripted(ctx, sub, max(lease, time.Millisecond), mark, subOut); err != nil {
		return err
	}
	if s.sharded {
		var settled []int // marks that settled a lost reply
		for j, i := range later {
			if lost[i] {
				settled = append(settled, j)
			}
		}
		if err := s.forgottenAfter(ctx, sub, subOut, settled); err != nil {
			return err
		}
	}
	for j, i := range later {
		out[i] = subOut[j]
		if lost[i] {
			// The SET may still reach the server (a late segment) and
			// commit the key once the other call frees it (Answer.Unsettled).
			a := &out[i]
			a.Unsettled = a.Status == tier.Held || a.Status == tier.Committed && a.Token != reqs[i].Token
		}
	}
	return nil
}

// setNX sets each key of reqs, where it is free, to its claim (for
// lease) or with mark its committed value (for its commit's TTL), and
// answers each key's old value (a string) or nil where it was free. A
// mark is sent once (markOnce); lost[i] reports a mark whose reply was
// lost, which the caller must settle through the claim script.
func (s *Store) setNX(ctx context.Context, reqs []Request, lease time.Duration, mark bool) (olds []any, lost []bool, err error) {
	pipe := s.c.Pipeline()
	cmds := make([]*goredis.StatusCmd, len(reqs))
	var px any // the last TTL, boxed once for the keys that share it
	lastMs := int64(-1)
	for i := range reqs {
		r := &reqs[i]
		if !mark {
			cmds[i] = pipe.SetArgs(ctx, s.Key(r.NS, r.Key), claimPrefix(r.Token), goredis.SetArgs{Mode: "NX", Get: true, TTL: lease})
			continue
		}
		if ms := max(s.commitTTL(r).Milliseconds(), 1); ms != lastMs {
			px, lastMs = ms, ms
		}
		cmds[i] = goredis.NewStatusCmd(ctx, "set", s.Key(r.NS, r.Key), commitValue(r), "px", px, "nx", "get")
		_ = pipe.Process(ctx, markOnce{cmds[i]})
	}
	err = s.execWrites(ctx, pipe)
	// ErrUnavailable here is the WAIT's (too few replicas): the writes'
	// replies came, and durability was not confirmed: a failure, not a
	// lost reply. With WaitReplicas any lost reply is a failure too: a
	// WAIT whose reply was lost confirmed nothing, and a settling script
	// on another connection cannot wait for this connection's writes.
	settle := mark && s.replicas == 0
	if err != nil && !errors.Is(err, goredis.Nil) && (!settle || errors.Is(err, ErrUnavailable) || !lostReply(ctx, err)) {
		return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	olds, lost = make([]any, len(reqs)), make([]bool, len(reqs))
	for i, cmd := range cmds {
		old, err := cmd.Result()
		switch {
		case errors.Is(err, goredis.Nil):
		case err != nil && settle && lostReply(ctx, err):
			lost[i] = true
		case err != nil:
			return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		default:
			olds[i] = old
		}
	}
	return olds, lost, nil
}

// markOnce is a mark's SET … NX GET, which the client must not send
// again by itself after losing its reply. A copy it sent again could be
// applied after this one and answer for a state this one changed: this
// one commits, a Forget removes the commit, another process marks the key
// New, and the copy, finding that process's commit, would answer Duplicate
// for the mark that committed first. The store settles a lost reply
// itself instead, through the claim script, which finds the mark's own
// commit, or the trace a Forget keeps of it (the fence, and the forgotten
// set: forgottenKey), and otherwise marks the key as this mark; so every
// copy of the mark after the first answers as the first applied.
//
// It holds the command by pointer alone, so passing it as a Cmder
// allocates nothing.
type markOnce struct{ *goredis.StatusCmd }

// NoRetry tells the client not to send the command again.
func (markOnce) NoRetry() bool { return true }

// lostReply reports an error after which a command sent may or may not
// have been applied (the connection failed or timed out), while ctx still
// allows asking the server: not a server's error reply, which applied
// nothing.
func lostReply(ctx context.Context, err error) bool {
	var re goredis.Error
	return ctx.Err() == nil && !errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled)
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
