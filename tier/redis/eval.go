package redis

import (
	"context"
	"errors"
	"fmt"

	"github.com/tierdedup/tierdedup/tier"

	goredis "github.com/redis/go-redis/v9"
)

func (s *Store) loadScripts(ctx context.Context) error {
	return s.eachServer(ctx, func(ctx context.Context, c goredis.Cmdable) error {
		scripts := []*goredis.Script{leaseScript, trimScript, markLogScript}
		for _, ks := range keyScripts {
			scripts = append(scripts, ks.one, ks.many)
		}
		for _, sc := range scripts {
			if err := sc.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("%w: loading scripts: %w", ErrUnavailable, err)
			}
		}
		return nil
	})
}

// keyScript is a script about one key (KEYS[1], and the archive log
// KEYS[2] when the prefix keeps one) in two forms: one, called once per
// key, and many, which runs one's body for each key of a chunk in one
// call. A single server takes a batch as one call of many per chunk of
// at most chunkKeys keys (one round trip, one script run, one reply);
// a Cluster, whose keys fall in different slots and a script may touch
// one slot only, takes one call of one per key, pipelined per node.
type keyScript struct {
	one, many *goredis.Script
}

// keyScripts are every keyScript, loaded on each server.
var keyScripts []*keyScript

// chunkKeys bounds the keys of one call of a keyScript's many form, so
// one call holds the server for a bounded time (about 0.3 ms for 256
// claims) and a large batch is a pipeline of such calls.
const chunkKeys = 256

// chunkBytes bounds the arguments of one call of a keyScript's many form
// (a call holds at least one key, which MaxResultSize and the key limit
// keep to a few MiB): far below the server's query buffer limit (1 GiB by
// default) and its largest argument (512 MiB).
const chunkBytes = 16 << 20

// argBytes is about what a key and its script arguments weigh in a
// command.
func argBytes(key []byte, args []any) int {
	n := len(key) + 64
	for _, a := range args {
		switch v := a.(type) {
		case string:
			n += len(v) + 8
		case []byte:
			n += len(v) + 8
		default:
			n += 24
		}
	}
	return n
}

// logEntryLua buffers a script call's commits for the archive log and
// appends them as one stream entry, {c: each commit as a 4-byte big-endian
// length ‖ the record's Redis key ‖ a 4-byte length ‖ its committed
// value, in the order they were made} (decodeEntry reads it).
//
// logRemoval appends the removal of key k to the log at once, {k, f: 1},
// and records it in the log's removals hash (the log key's prefix ‖ NUL ‖
// 0xff ‖ "removing": field k, value the entry's ID) until the drain trims
// it (trimScript), so an archive read for k until the drain has applied
// it knows the archive may still hold what the removal undoes
// (Store.Removing). The hash is no declared key of the script: a prefix
// with a log is on one server (a Cluster or Ring keeps no log).
const logEntryLua = `
local logged = {}
local function logCommit(k, v)
  logged[#logged + 1] = struct.pack('>I4', #k) .. k .. struct.pack('>I4', #v) .. v
end
local function appendLog(log)
  if #logged > 0 then redis.call('XADD', log, '*', 'c', table.concat(logged)) end
end
local function logRemoval(log, k)
  local id = redis.call('XADD', log, '*', 'k', k, 'f', '1')
  redis.call('HSET', string.sub(log, 1, -2) .. '\255removing', k, id)
end
`

// newKeyScript makes the keyScript of body, a script about KEYS[1] (and
// KEYS[2]) with its own ARGV. many takes KEYS as each key's nk keys in
// turn and ARGV as nk, na and then each key's na arguments in turn, and
// answers an array of body's answers (false for none).
//
// A body appends a commit to the archive log by calling logCommit(key,
// value), not XADD: both forms append every commit of the call as one
// log entry (logEntryLua) at the end of the call, after the last key, in
// the same atomic script run. Nothing a body calls after its first write
// can raise an error (its reads that could are pcalls), so a call that
// committed a key always reaches its append.
func newKeyScript(body string) *keyScript {
	ks := &keyScript{
		one: goredis.NewScript(logEntryLua + `
local function one(KEYS, ARGV)
` + body + `
end
local r = one(KEYS, ARGV)
appendLog(KEYS[2])
return r`),
		many: goredis.NewScript(logEntryLua + `
local function one(KEYS, ARGV)
` + body + `
end
local nk, na = tonumber(ARGV[1]), tonumber(ARGV[2])
local out, k, a = {}, {}, {}
for i = 0, #KEYS / nk - 1 do
  for j = 1, nk do k[j] = KEYS[i * nk + j] end
  for j = 1, na do a[j] = ARGV[2 + i * na + j] end
  local r = one(k, a)
  if r == nil then r = false end
  out[i + 1] = r
end
appendLog(KEYS[2])
return out`),
	}
	keyScripts = append(keyScripts, ks)
	return ks
}

// evalText runs sc for each request and hands each answer's text to
// decode; a decode error names the key.
func (s *Store) evalText(ctx context.Context, sc *keyScript, reqs []Request, writes bool, args func(*Request) []any, decode func(i int, v string) error) error {
	answers, err := s.evalBatch(ctx, sc, reqs, writes, args)
	if err != nil {
		return err
	}
	for i, a := range answers {
		v, ok := a.(string)
		if !ok {
			return fmt.Errorf("%w: script answered %T at %q", ErrUnavailable, a, s.Key(reqs[i].NS, reqs[i].Key))
		}
		if err := decode(i, v); err != nil {
			return fmt.Errorf("%w: %w at %q", ErrUnavailable, err, s.Key(reqs[i].NS, reqs[i].Key))
		}
	}
	return nil
}

func (s *Store) runScript(ctx context.Context, sc *keyScript, reqs []Request, out []Status, args func(*Request) []any) error {
	answers, err := s.evalBatch(ctx, sc, reqs, true, args)
	if err != nil {
		return err
	}
	for i, a := range answers {
		n, ok := a.(int64)
		if !ok {
			return fmt.Errorf("%w: script answered %T at %q", ErrUnavailable, a, s.Key(reqs[i].NS, reqs[i].Key))
		}
		out[i] = tier.Lost
		if n == 1 {
			out[i] = tier.OK
		}
	}
	return nil
}

// evalBatch runs sc for each request, in one pipeline, and returns each
// request's answer: a string, an int64, or nil (Lua false). A single
// server runs sc's many form once per chunk of chunkKeys requests; a
// sharded client (Cluster, Ring) runs its one form once per request.
func (s *Store) evalBatch(ctx context.Context, sc *keyScript, reqs []Request, writes bool, args func(*Request) []any) ([]any, error) {
	for attempt := 0; ; attempt++ {
		pipe := s.c.Pipeline()
		cmds, err := s.scriptCalls(ctx, pipe, sc, reqs, args)
		if err != nil {
			return nil, err
		}
		err = s.execWait(ctx, pipe, writes)
		if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") && attempt == 0 {
			// The server restarted or failed over and lost its scripts;
			// the scripts are idempotent for the caller's token, so the
			// whole batch may run again.
			if err := s.loadScripts(ctx); err != nil {
				return nil, err
			}
			continue
		}
		if err != nil && !errors.Is(err, goredis.Nil) {
			return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		answers := make([]any, 0, len(reqs))
		for _, cmd := range cmds {
			v, err := cmd.Result()
			switch {
			case errors.Is(err, goredis.Nil):
				v = nil
			case err != nil:
				return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
			}
			if s.sharded {
				answers = append(answers, v)
				continue
			}
			many, ok := v.([]any)
			if !ok {
				return nil, fmt.Errorf("%w: batch script answered %T", ErrUnavailable, v)
			}
			answers = append(answers, many...)
		}
		if len(answers) != len(reqs) {
			return nil, fmt.Errorf("%w: %d answers for %d keys", ErrUnavailable, len(answers), len(reqs))
		}
		return answers, nil
	}
}

// scriptCalls adds sc's calls for reqs to pipe: on a single server one
// call of its many form per chunk (nextChunk), on a sharded client one
// call of its one form per request. It returns the calls, in order.
func (s *Store) scriptCalls(ctx context.Context, pipe goredis.Pipeliner, sc *keyScript, reqs []Request, args func(*Request) []any) ([]*goredis.Cmd, error) {
	if s.sharded {
		cmds := make([]*goredis.Cmd, len(reqs))
		for i := range reqs {
			r := &reqs[i]
			cmds[i] = sc.one.EvalSha(ctx, pipe, []string{s.Key(r.NS, r.Key)}, args(r)...)
		}
		return cmds, nil
	}
	nk := 1
	if s.logKey != "" {
		nk = 2 // a Cluster keeps no log: one server holds both
	}
	all := make([][]any, len(reqs))
	for i := range reqs {
		all[i] = args(&reqs[i])
	}
	var cmds []*goredis.Cmd
	for lo := 0; lo < len(reqs); {
		hi := nextChunk(len(reqs), lo, func(i int) int { return argBytes(reqs[i].Key, all[i]) })
		keys := make([]string, 0, (hi-lo)*nk)
		argv := []any{nk, len(all[lo])}
		for i := lo; i < hi; i++ {
			r := &reqs[i]
			keys = append(keys, s.Key(r.NS, r.Key))
			if nk == 2 {
				keys = append(keys, s.logKey)
			}
			if len(all[i]) != len(all[lo]) {
				return nil, fmt.Errorf("%w: %d script arguments for one key of a batch, %d for another", ErrOptions, len(all[lo]), len(all[i]))
			}
			argv = append(argv, all[i]...)
		}
		cmds = append(cmds, sc.many.EvalSha(ctx, pipe, keys, argv...))
		lo = hi
	}
	return cmds, nil
}

// nextChunk returns the end of the chunk of n requests starting at lo: at
// most chunkKeys requests and, past its first, chunkBytes of arguments
// (size weighs request i's key and arguments). A batch of large results would
// otherwise make one command of up to a GiB, over the server's query
// buffer limit, on every retry.
func nextChunk(n, lo int, size func(i int) int) int {
	hi, total := lo, 0
	for ; hi < min(lo+chunkKeys, n); hi++ {
		w := size(hi)
		if hi > lo && total+w > chunkBytes {
			break
		}
		total += w
	}
	return hi
}

// scriptOnce is a script call the client must not send again by itself
// after losing its reply (see markOnce).
type scriptOnce struct{ *goredis.Cmd }

// NoRetry tells the client not to send the command again.
func (scriptOnce) NoRetry() bool { return true }
