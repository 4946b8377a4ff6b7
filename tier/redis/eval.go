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
		scripts := []*goredis.Script{leaseScript, trimScript}
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

// newKeyScript makes the keyScript of body, a script about KEYS[1] (and
// KEYS[2]) with its own ARGV. many takes KEYS as each key's nk keys in
// turn and ARGV as nk, na and then each key's na arguments in turn, and
// answers an array of body's answers (false for none).
func newKeyScript(body string) *keyScript {
	ks := &keyScript{
		one: goredis.NewScript(body),
		many: goredis.NewScript(`local function one(KEYS, ARGV)
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
	nk := 1
	if s.logKey != "" {
		nk = 2 // a Cluster keeps no log: one server holds both
	}
	for attempt := 0; ; attempt++ {
		pipe := s.c.Pipeline()
		var cmds []*goredis.Cmd
		if s.sharded {
			cmds = make([]*goredis.Cmd, len(reqs))
			for i := range reqs {
				r := &reqs[i]
				cmds[i] = sc.one.EvalSha(ctx, pipe, []string{s.Key(r.NS, r.Key)}, args(r)...)
			}
		} else {
			for lo := 0; lo < len(reqs); {
				// A call takes at most chunkKeys keys and, past its first
				// key, chunkBytes of arguments: a batch of large results
				// would otherwise make one command of up to a GiB, over
				// the server's query buffer limit, on every retry.
				keys := make([]string, 0, min(len(reqs)-lo, chunkKeys)*nk)
				argv := []any{nk, 0}
				size, i := 0, lo
				for ; i < min(lo+chunkKeys, len(reqs)); i++ {
					r := &reqs[i]
					a := args(r)
					n := argBytes(r.Key, a)
					if i > lo && size+n > chunkBytes {
						break
					}
					size += n
					keys = append(keys, s.Key(r.NS, r.Key))
					if nk == 2 {
						keys = append(keys, s.logKey)
					}
					if i == lo {
						argv[1] = len(a)
					} else if argv[1] != len(a) {
						return nil, fmt.Errorf("%w: %d script arguments for one key of a batch, %d for another", ErrOptions, argv[1], len(a))
					}
					argv = append(argv, a...)
				}
				cmds = append(cmds, sc.many.EvalSha(ctx, pipe, keys, argv...))
				lo = i
			}
		}
		err := s.execWait(ctx, pipe, writes)
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
