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
		err = s.claimNX(ctx, reqs, lease, false, 0, out)
	} else {
		err = s.claimScripted(ctx, reqs, lease, false, 0, out)
	}
	for i := range out {
		out[i].Partition = -1
	}
	return err
}

// claimScripted is Claim through claimScript (mark: Mark's; a logged
// mark's when logBy is not zero).
func (s *Store) claimScripted(ctx context.Context, reqs []Request, lease time.Duration, mark bool, logBy int64, out []Result) error {
	leaseMS, windowMS := max(lease.Milliseconds(), 1), s.window.Milliseconds()
	logs, deadline := "0", ""
	if logBy != 0 {
		logs, deadline = "1", strconv.FormatInt(logBy/int64(time.Millisecond), 10)
	}
	return s.evalText(ctx, claimScript, reqs, true, func(r *Request) []any {
		var earlier string
		if r.Earlier != (Token{}) {
			earlier = string(r.Earlier[:])
		}
		if mark {
			return []any{claimPrefix(r.Token), leaseMS, windowMS, s.max, earlier, commitValue(r), s.commitTTL(r).Milliseconds(), s.forgottenInScript(), logs, deadline}
		}
		return []any{claimPrefix(r.Token), leaseMS, windowMS, s.max, earlier}
	}, func(i int, v string) (err error) {
		if err := scriptRefused(v); err != nil {
			return err
		}
		out[i], err = decodeClaim(v)
		return err
	})
}

// errLate is a logged mark's answer past its Request.LogBy.
var errLate = fmt.Errorf("%w: a mark (the archive read it relies on is too old, or this host's clock is behind Redis's): nothing written", ErrPastLogBy)

// errForgetLate is a Forget's answer past its Request.LogBy for a key
// it found absent.
var errForgetLate = fmt.Errorf("%w: a forget that found the key absent (the archive read it relies on is too old, or this host's clock is behind Redis's): no removal appended", ErrPastLogBy)

// scriptRefused reads a script's refusal of one key: 'L', past the
// mark's LogBy (errLate), or 'W', a key holding no string (no value of
// this layout).
func scriptRefused(v string) error {
	switch v {
	case "L":
		return errLate
	case "W":
		return errors.New("the key holds no string (no value of this layout)")
	}
	return nil
}

// Mark is Claim with every key it acquires committed in the same step
// (tier.Marker): one SET … NX GET of the committed value per key without
// MaxAttempts, one script call per key otherwise, in one pipeline. A key
// it acquires is committed with reqs[i].Token and Digest, for the window
// or reqs[i].Window. A mark whose reply was lost finds its own commit when
// retried (Committed with its token).
//
// With the archive log, requests with Archive set (every request of the
// call, with one LogBy) are marked through markLogScript, which appends
// each commit it makes to the log in the same script run and refuses to
// commit past LogBy (tier.LogMarker).
func (s *Store) Mark(ctx context.Context, reqs []Request, out []Result) error {
	logBy, err := s.markLogBy(reqs)
	if err != nil {
		return err
	}
	if s.max == 0 {
		err = s.claimNX(ctx, reqs, 0, true, logBy, out)
	} else {
		err = s.claimScripted(ctx, reqs, time.Millisecond, true, logBy, out)
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
	logs := s.logsRemovals() // the mark undone may have been a logged one
	return s.runScript(ctx, unmarkScript, reqs, out, func(r *Request) []any {
		return []any{string(append([]byte{commitTag}, r.Token[:]...)), string(append([]byte{fenceTag}, r.Token[:]...)), ms, set, forgottenMS, logs}
	})
}

// MarksWithLog reports whether Mark appends the commits of requests with
// Archive set to the archive log (tier.LogMarker): with the log and
// without MaxAttempts.
func (s *Store) MarksWithLog() bool { return s.logKey != "" && s.max == 0 }

// markLogBy returns the LogBy of a Mark's requests with Archive set, or
// 0 when none has it; a call mixing them, or differing LogBy, or one the
// store cannot log, is refused (ErrOptions): a mark with Archive must
// never commit without its log entry.
func (s *Store) markLogBy(reqs []Request) (int64, error) {
	if len(reqs) == 0 || !reqs[0].Archive {
		for i := range reqs {
			if reqs[i].Archive {
				return 0, fmt.Errorf("%w: a Mark mixes requests to archive with others", ErrOptions)
			}
		}
		return 0, nil
	}
	if !s.MarksWithLog() {
		return 0, fmt.Errorf("%w: this store cannot log marks (no archive log, or MaxAttempts)", ErrOptions)
	}
	logBy := reqs[0].LogBy
	for i := range reqs {
		if !reqs[i].Archive || reqs[i].LogBy != logBy || logBy <= 0 {
			return 0, fmt.Errorf("%w: a logged Mark's requests need Archive and one positive LogBy", ErrOptions)
		}
	}
	return logBy, nil
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
//
// With logBy (a logged mark: Mark) the keys go through markLogScript
// instead, and the keys the claim script decides are logged and bound by
// logBy too.
func (s *Store) claimNX(ctx context.Context, reqs []Request, lease time.Duration, mark bool, logBy int64, out []Result) error {
	var olds []any
	var lost []bool
	var err error
	if logBy != 0 {
		olds, lost, err = s.markLogNX(ctx, reqs, logBy)
	} else {
		olds, lost, err = s.setNX(ctx, reqs, lease, mark)
	}
	if err != nil {
		return err
	}
	var later []int // keys the script must decide
	for i, a := range olds {
		old, _ := a.(string)
		if err := scriptRefused(old); err != nil && logBy != 0 && !lost[i] {
			return fmt.Errorf("%w: %w at %q", ErrUnavailable, err, s.Key(reqs[i].NS, reqs[i].Key))
		}
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
	if err := s.claimScripted(ctx, sub, max(lease, time.Millisecond), mark, logBy, subOut); err != nil {
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

// markLogNX marks reqs through markLogScript (a logged mark, bound by
// logBy), each call sent once (scriptOnce), and answers as setNX does:
// each key's old value (or the script's refusal, 'L' or 'W'), nil where
// the mark committed (and logged) it, lost[i] where the reply was lost.
// A call the server did not know the script for (NOSCRIPT: not run) is
// sent again once the scripts are loaded, alone.
func (s *Store) markLogNX(ctx context.Context, reqs []Request, logBy int64) (olds []any, lost []bool, err error) {
	olds, lost = make([]any, len(reqs)), make([]bool, len(reqs))
	deadline := logBy / int64(time.Millisecond)
	todo := make([]int, len(reqs))
	for i := range todo {
		todo[i] = i
	}
	settle := s.replicas == 0 // as setNX: with WaitReplicas a lost reply is a failure
	for attempt := 0; len(todo) > 0; attempt++ {
		pipe := s.c.Pipeline()
		var cmds []*goredis.Cmd
		var sizes []int
		values := make([]string, len(todo))
		for k, i := range todo {
			values[k] = commitValue(&reqs[i])
		}
		for lo := 0; lo < len(todo); {
			hi := nextChunk(len(todo), lo, func(k int) int { return len(reqs[todo[k]].Key) + len(values[k]) + 96 })
			args := make([]any, 0, 4+(hi-lo)*3)
			args = append(args, "evalsha", markLogScript.Hash(), 1+hi-lo, s.logKey)
			for k := lo; k < hi; k++ {
				r := &reqs[todo[k]]
				args = append(args, s.Key(r.NS, r.Key))
			}
			args = append(args, deadline)
			for k := lo; k < hi; k++ {
				args = append(args, values[k], max(s.commitTTL(&reqs[todo[k]]).Milliseconds(), 1))
			}
			cmd := goredis.NewCmd(ctx, args...)
			_ = pipe.Process(ctx, scriptOnce{cmd})
			cmds, sizes = append(cmds, cmd), append(sizes, hi-lo)
			lo = hi
		}
		err = s.execWrites(ctx, pipe)
		if err != nil && !errors.Is(err, goredis.Nil) && !goredis.HasErrorPrefix(err, "NOSCRIPT") && (!settle || errors.Is(err, ErrUnavailable) || !lostReply(ctx, err)) {
			return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		var again []int
		at := 0
		for c, cmd := range cmds {
			idx := todo[at : at+sizes[c]]
			at += sizes[c]
			v, err := cmd.Result()
			switch {
			case err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0:
				again = append(again, idx...)
			case err != nil && settle && lostReply(ctx, err):
				for _, i := range idx {
					lost[i] = true
				}
			case err != nil:
				return nil, nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			default:
				many, ok := v.([]any)
				if !ok || len(many) != len(idx) {
					return nil, nil, fmt.Errorf("%w: the mark script answered %T for %d keys", ErrUnavailable, v, len(idx))
				}
				for k, i := range idx {
					olds[i] = many[k]
				}
			}
		}
		if len(again) > 0 {
			if err := s.loadScripts(ctx); err != nil {
				return nil, nil, err
			}
		}
		todo = again
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
