package redis

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"time"

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
// a lost reply answers what the first removed). Behind an archive log,
// reqs[i].LogBy (positive) is when the engine's archive read ended plus
// tier.LogSkew/2: a delete reaching Redis after it that finds the key
// absent appends no removal and fails (ErrUnavailable), as a copy that
// late could hide a commit made since.
func (s *Store) Forget(ctx context.Context, reqs []Request, out []Result) error {
	raw, err := s.raw(ctx, reqs)
	if err != nil {
		return err
	}
	if err := s.recordForgotten(ctx, raw); err != nil {
		return err
	}
	var own Token
	_, _ = rand.Read(own[:]) // for requests that name no call of theirs
	return s.evalText(ctx, forgetScript, reqs, true, func(r *Request) []any {
		token := r.Token
		if token == (Token{}) {
			token = own
		}
		logBy := "0"
		if r.LogBy > 0 {
			logBy = strconv.FormatInt(r.LogBy/int64(time.Millisecond), 10)
		}
		return []any{raw[r], string(token[:]), s.logsRemovals(), logBy}
	}, func(i int, v string) (err error) {
		switch {
		case v == "L":
			return errForgetLate
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

// forgottenMS is how long the forgotten set keeps the token of a commit a
// Forget removed: longer than a mark's call may take between sending its
// SET and settling a lost reply (markOnce), so a mark whose commit was
// forgotten meanwhile still finds that it committed.
const forgottenMS = 10 * 60 * 1000

// forgottenKey is the forgotten set, Prefix ‖ NUL ‖ 0xFF ‖ "forgotten": a
// sorted set of the tokens of commits Forget removed in the last
// forgottenMS, scored by when (ms, the server's clock).
func (s *Store) forgottenKey() string { return s.prefix + "\x00\xffforgotten" }

// forgottenInScript is the forgotten set's name for the claim script, or
// "" in a Cluster or Ring, where a script may touch its key's slot only:
// there a mark that settles a lost reply asks the set after the script
// (forgottenAfter).
func (s *Store) forgottenInScript() string {
	if s.sharded {
		return ""
	}
	return s.forgottenKey()
}

// recordForgottenScript adds the tokens ARGV[2..] to the forgotten set
// KEYS[1], scored by the server's clock (ms), drops the entries older than
// ARGV[1] ms, and keeps the set that long after its last change. The
// server's clock, not the forgetting process's: a process whose clock
// lags would otherwise score its entries as old, and the next Forget of
// any process would trim them at once.
var recordForgottenScript = goredis.NewScript(forgottenLua + `
forget(KEYS[1], ARGV[1], {unpack(ARGV, 2)})
return 1`)

// forgottenLua defines forget(set, ms, tokens), the one writer of the
// forgotten set: it adds tokens to set scored by the server's clock (ms),
// drops the entries older than ms, and keeps set that long. Forget's
// record (recordForgottenScript) and Unmark's (unmarkScript) call it.
const forgottenLua = `
local function forget(set, ms, tokens)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for _, tok in ipairs(tokens) do redis.call('ZADD', set, now, tok) end
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now - tonumber(ms))
  redis.call('PEXPIRE', set, ms)
end
`

// recordForgotten adds to the forgotten set the token of each commit
// among raw (the values Forget read and is about to remove) before any is
// removed, so no mark can find its commit gone without a trace of it. A
// token recorded whose commit then stays (the value changed since the
// read) names a mark that did commit: the trace says nothing false.
// The tokens go chunkKeys at a time: a call's arguments stay small
// whatever the batch.
func (s *Store) recordForgotten(ctx context.Context, raw map[*Request]string) error {
	var tokens []any
	for _, v := range raw {
		if len(v) >= 17 && v[0] == commitTag {
			tokens = append(tokens, v[1:17])
		}
	}
	return s.recordTokens(ctx, tokens)
}

// recordTokens adds tokens to the forgotten set, chunkKeys at a time.
func (s *Store) recordTokens(ctx context.Context, tokens []any) error {
	for lo := 0; lo < len(tokens); lo += chunkKeys {
		args := append([]any{forgottenMS}, tokens[lo:min(lo+chunkKeys, len(tokens))]...)
		keys := []string{s.forgottenKey()}
		err := s.pipelined(ctx, func(p goredis.Pipeliner) { recordForgottenScript.EvalSha(ctx, p, keys, args...) })
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
			err = s.pipelined(ctx, func(p goredis.Pipeliner) { recordForgottenScript.Eval(ctx, p, keys, args...) })
		}
		if err != nil {
			return fmt.Errorf("%w: recording the forgotten commits: %w", ErrUnavailable, err)
		}
	}
	return nil
}

// forgottenAfter is the forgotten set's question asked after the claim
// script, where the script cannot ask it (forgottenInScript): each of
// idx (marks that settled a lost reply) that the script did not answer
// as acquired or as the mark's own commit, and whose token the set holds,
// committed before a Forget removed it, and is acquired.
func (s *Store) forgottenAfter(ctx context.Context, reqs []Request, out []Result, idx []int) error {
	var ask []int
	for _, i := range idx {
		if out[i].Status != tier.Acquired && (out[i].Status != tier.Committed || out[i].Token != reqs[i].Token) {
			ask = append(ask, i)
		}
	}
	if len(ask) == 0 {
		return nil
	}
	members := make([]string, len(ask))
	for j, i := range ask {
		members[j] = string(reqs[i].Token[:])
	}
	var cmd *goredis.FloatSliceCmd
	err := s.pipelined(ctx, func(p goredis.Pipeliner) { cmd = p.ZMScore(ctx, s.forgottenKey(), members...) })
	scores, _ := cmd.Result()
	if err != nil {
		return fmt.Errorf("%w: reading the forgotten commits: %w", ErrUnavailable, err)
	}
	for j, i := range ask {
		if scores[j] != 0 {
			out[i] = Result{Status: tier.Acquired}
		}
	}
	return nil
}

// pipelined sends the commands fn queues as one pipeline. Every call of
// the store's goes as a pipeline, even of one command: go-redis sends a
// pipeline again after a read timeout when the retry needs a new
// connection (a paused or starved server), and fails a single command
// whose retry timed out in that connection's handshake, after one retry
// whatever MaxRetries says (measured on go-redis v9.23: a SET under a
// 200 ms SIGSTOP fails after 50 ms with MaxRetries 400; the same command
// pipelined waits out the pause).
// It returns by ctx's deadline, as every call of the store (exec).
func (s *Store) pipelined(ctx context.Context, fn func(goredis.Pipeliner)) error {
	pipe := s.c.Pipeline()
	fn(pipe)
	return s.exec(ctx, pipe)
}
