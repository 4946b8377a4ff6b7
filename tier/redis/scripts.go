package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/tierdedup/tierdedup/tier"

	goredis "github.com/redis/go-redis/v9"
)

// claimScript claims KEYS[1] for the token prefix ARGV[1] ('C' ‖ token)
// for ARGV[2] ms, keeping the value ARGV[3] ms, counting attempts up to
// ARGV[4] (0: none). It returns 'A'|'T'|'O' ‖ attempts (acquired: free,
// taken over from an ended lease, or the caller's own claim: a retry),
// 'P'|'Q' ‖ attempts (poisoned: already, or by this expiry), or the value
// of a live claim ('C'…) or a commit ('D'…). ARGV[5], when not empty, is
// the earliest token of the caller's earlier calls of the key whose
// replies were lost (tier.Request.Earlier): a claim or commit of a token
// from it up to the caller's is adopted (moved to the caller's token) in
// this step, a claim as the caller's own, a commit answered with the
// caller's token. With ARGV[6] (a mark) a key it acquires is committed
// instead, to the value ARGV[6] with TTL ARGV[7] ms, and an earlier
// call's commit is replaced by it. A mark first looks for a trace of
// its own token's commit that a Forget removed since (the fence the
// Forget left, or ARGV[8], the forgotten set, when not empty): a copy of
// the mark applied before the Forget, so the mark answers acquired ('A0')
// and writes nothing (see markOnce).
var claimScript = newKeyScript(versionLE + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local max = tonumber(ARGV[4])
local own = string.sub(ARGV[1], 2, 17)
local function earlier(tok)
  local e = ARGV[5]
  if e == '' or tok == own or string.sub(tok, 1, 8) ~= string.sub(own, 1, 8) then return false end
  return le(e, tok) and le(tok, own)
end
local v = redis.call('GET', KEYS[1])
local n, tag = 0, 'A'
if v and string.sub(v, 1, 1) == 'X' then
  -- A fence: free, unless a Forget left it over this mark's own commit.
  if ARGV[6] and string.sub(v, 18, 34) == 'D' .. own then return 'A0' end
  v = nil
end
if ARGV[8] and ARGV[8] ~= '' and redis.call('ZSCORE', ARGV[8], own) then
  return 'A0' -- this mark's commit, removed by a Forget since
end
if v then
  local kind = string.sub(v, 1, 1)
  if kind == 'D' then
    if not earlier(string.sub(v, 2, 17)) then return v end
    -- An earlier call's commit, never acknowledged: adopted.
    if not ARGV[6] then
      local a = 'D' .. own .. string.sub(v, 18)
      redis.call('SET', KEYS[1], a, 'KEEPTTL')
      return a
    end
    tag = 'O' -- a mark: replaced by this mark's commit below
  elseif kind == 'C' then
    local lease, cnt = string.match(string.sub(v, 18), '^(%d+):(%d+)$')
    local tok = string.sub(v, 2, 17)
    if tok == own or earlier(tok) then
      n, tag = tonumber(cnt) or 0, 'O' -- the caller's own claim: renewed below
    elseif not lease or tonumber(lease) > now then
      return v
    else
      n, tag = tonumber(cnt), 'T'
    end
    if tag == 'T' and max > 0 then
      n = n + 1
      if n >= max then
        redis.call('SET', KEYS[1], 'R' .. n, 'PX', ARGV[3])
        return 'Q' .. n
      end
    end
  elseif kind == 'R' then
    n = tonumber(string.sub(v, 2)) or 0
    if max > 0 and n >= max then return 'P' .. n end
  end
end
if ARGV[6] then
  -- a mark: committed at once, with the commit's value and TTL
  redis.call('SET', KEYS[1], ARGV[6], 'PX', ARGV[7])
  return tag .. n
end
local ttl = ARGV[2]
if max > 0 then ttl = ARGV[3] end
redis.call('SET', KEYS[1], ARGV[1] .. (now + tonumber(ARGV[2])) .. ':' .. n, 'PX', ttl)
return tag .. n`)

// commitScript turns the caller's unexpired claim (token prefix ARGV[1])
// into the committed value ARGV[2] with TTL ARGV[3] ms, appending it to
// the archive log KEYS[2] when ARGV[4] is 1; a value already committed
// with the caller's token is a retry and succeeds (and was appended).
var commitScript = newKeyScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  local lease = string.match(string.sub(v, 18), '^(%d+):')
  local t = redis.call('TIME')
  if lease and tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
    return 0
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[4] == '1' then redis.call('XADD', KEYS[2], '*', 'k', KEYS[1], 'v', ARGV[2]) end
  return 1
end
if v and string.sub(v, 1, 17) == string.sub(ARGV[2], 1, 17) then
  return 1
end
return 0`)

// releaseScript frees the key only while it holds the caller's unexpired
// claim (token prefix ARGV[1]): with ARGV[2] > 0 it keeps the attempt
// count, ARGV[4] higher, for ARGV[3] ms (deleting the key if that is 0);
// otherwise it deletes the key. With ARGV[5] = 1 it also undoes a commit
// carrying the caller's token (one whose caller was told it failed): the
// key is freed, keeping with ARGV[2] > 0 the attempt count ARGV[6] the
// claim carried (the commit replaced it).
var releaseScript = newKeyScript(`
local v = redis.call('GET', KEYS[1])
if v and ARGV[5] == '1' and string.sub(v, 1, 1) == 'D' and string.sub(v, 2, 17) == string.sub(ARGV[1], 2, 17) then
  local carried = tonumber(ARGV[6]) or 0
  if tonumber(ARGV[2]) > 0 and carried > 0 then
    redis.call('SET', KEYS[1], 'R' .. carried, 'PX', ARGV[3])
  else
    redis.call('DEL', KEYS[1])
  end
  if ARGV[7] == '1' then redis.call('XADD', KEYS[2], '*', 'k', KEYS[1], 'f', '1') end
  return 1
end
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
local lease, cnt = string.match(string.sub(v, 18), '^(%d+):(%d+)$')
local t = redis.call('TIME')
if lease and tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
  return 0
end
local n = (tonumber(cnt) or 0) + tonumber(ARGV[4])
if tonumber(ARGV[2]) > 0 and n > 0 then
  redis.call('SET', KEYS[1], 'R' .. n, 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return 1`)

// forgetFenceMS is how long a Forget leaves its fence ('X' ‖ token ‖
// answer) on the key it removed: longer than a client's retries of the
// call (go-redis by default: 3 retries of up to 3 s reads), so a retried
// copy answers what the first copy removed. A claim of the key meanwhile
// goes through the claim script (a SET NX cannot pass a fence), which
// takes the key as free.
const forgetFenceMS = "30000"

// extendScript makes the lease of the caller's unexpired claim (token
// prefix ARGV[1]) end ARGV[2] ms from now unless it ends later, keeping an
// attempt-counted claim (MaxAttempts) for ARGV[3] ms; a claim without a
// recorded lease (SET NX: its TTL is its lease) has its TTL raised
// instead. It returns 1, or 0 when the key does not hold the caller's live
// claim.
var extendScript = newKeyScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
local rest = string.sub(v, 18)
if rest == '' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
local lease, cnt = string.match(rest, '^(%d+):(%x*)$')
if not lease then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(lease) <= now then return 0 end
local untilMS = now + tonumber(ARGV[2])
if untilMS > tonumber(lease) then
  redis.call('SET', KEYS[1], ARGV[1] .. untilMS .. ':' .. cnt, 'PX', ARGV[3])
end
return 1`)

// lookScript reads KEYS[1] without claiming it: ” (absent), 'H' (a live
// claim), 'E' ‖ attempts (a claim whose lease ended) or the value of a
// commit ('D'…) or an attempt count ('R'…).
var lookScript = newKeyScript(strings.ReplaceAll(lookBody, "HELD", "'H'") + `
if not v then return '' end
return out`)

// lookBody reads KEYS[1] into v (nil when absent or fenced), the fence
// into fenced, and its answer into out, as lookScript answers; for a live
// claim it returns HELD itself (the script's form of 'H').
const lookBody = `
local v = redis.call('GET', KEYS[1])
local fenced = v and string.sub(v, 1, 1) == 'X' and v
if fenced then v = nil end -- a fence: free
local out = v
if v and string.sub(v, 1, 1) == 'C' then
  local lease, cnt = string.match(string.sub(v, 18), '^(%d+):(%d+)$')
  if not lease then return HELD end
  local t = redis.call('TIME')
  if tonumber(lease) > tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then return HELD end
  out = 'E' .. cnt
end`

// forgetScript deletes KEYS[1] if it still holds exactly ARGV[1] (its raw
// value as the caller read it, ” for absent or fenced) and no live claim,
// leaving the fence of the call's token ARGV[2] with the answer for
// forgetFenceMS ('X' ‖ token ‖ answer: free to every script), and with
// ARGV[3] = 1 appends the removal to the archive log KEYS[2] (found or
// not: the log may still hold an earlier commit). It answers '1' ‖ what
// lookScript answers (” when another call removed the key since the
// read: there is nothing left to remove), or '0' when another value was
// written since the read (it is kept, and the caller answers Held). A copy of the call retried after a lost reply finds
// its fence and answers what the first removed; a copy later still finds
// another value (a commit made since carries another token) and changes
// nothing: a Forget removes only what it read.
var forgetScript = newKeyScript(strings.ReplaceAll(lookBody, "HELD", "'1H'") + `
if fenced and #fenced > 17 and string.sub(fenced, 2, 17) == ARGV[2] then
  return '1' .. string.sub(fenced, 18) -- a copy of this forget that applied
end
if v and v ~= ARGV[1] then return '0' end -- written since the read: kept
if not v then out = '' end
if v then redis.call('SET', KEYS[1], 'X' .. ARGV[2] .. out, 'PX', ` + forgetFenceMS + `) end
if ARGV[3] == '1' then redis.call('XADD', KEYS[2], '*', 'k', KEYS[1], 'f', '1') end
return '1' .. out`)

// trimScript trims the archive log KEYS[1] below the ID ARGV[1] and
// records in KEYS[2] the newest position trimmed, ARGV[2] ‖ '-' ‖ ARGV[3]
// (ms, seq), unless a later one is recorded (XTRIM does not move the
// stream's max-deleted-entry-id).
var trimScript = goredis.NewScript(`
redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
local v = redis.call('GET', KEYS[2])
if v then
  local ms, seq = string.match(v, '^(%d+)-(%d+)$')
  local a, b = tonumber(ARGV[2]), tonumber(ARGV[3])
  if ms and (tonumber(ms) > a or (tonumber(ms) == a and tonumber(seq) >= b)) then return 0 end
end
redis.call('SET', KEYS[2], ARGV[2] .. '-' .. ARGV[3])
return 1`)

// unmarkScript undoes a mark of the token prefix ARGV[1] ('D' ‖ token)
// at KEYS[1], returning 1; where the key is free it sets the fence ARGV[2]
// ('X' ‖ token) for ARGV[3] ms, which the plain SET NX of a mark still on
// its way cannot pass and every script takes as free, returning 2;
// otherwise 0. (A mark sent through claimScript, for a key holding an
// attempt count left from MaxAttempts, is not fenced: the script takes the
// fence as free.)
var unmarkScript = newKeyScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
return 0`)

// leaseScript gives the drain lease KEYS[1] to ARGV[1] for ARGV[2] ms if
// it is free or already ARGV[1]'s, and returns 1; otherwise 0.
var leaseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and v ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1`)

// Versions (the engine's Advance) live in keys of the engine's own
// namespaces: committed 'D' ‖ token ‖ version (16 hex digits, the Digest),
// claimed 'C' ‖ token ‖ lease end ‖ ':' ‖ the version the claim replaced
// (” for none), kept for the window, so a claim that ends without a
// commit (released, or left to expire) never loses the version it
// replaced. Versions compare byte by byte (string.byte: no locale).
const versionLE = `
local function le(a, b)
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return true
end
`

// advanceScript claims KEYS[1] for the token prefix ARGV[1] for ARGV[3] ms
// (keeping the value ARGV[4] ms) when the version ARGV[2] is greater than
// the stored one. It returns 'A' ‖ the version replaced, 'S' ‖ the stored
// version (not greater), or 'H' (a live claim).
var advanceScript = newKeyScript(versionLE + `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('GET', KEYS[1])
local stored = ''
if v then
  local kind = string.sub(v, 1, 1)
  if kind == 'C' then
    local lease, prev = string.match(string.sub(v, 18), '^(%d+):(%x*)$')
    if not lease then return redis.error_reply('not a version key') end
    if string.sub(v, 1, 17) ~= ARGV[1] and tonumber(lease) > now then return 'H' end
    stored = prev
  elseif kind == 'D' and #v == 33 then
    stored = string.sub(v, 18, 33)
  else
    return redis.error_reply('not a version key')
  end
end
if stored ~= '' and le(ARGV[2], stored) then return 'S' .. stored end
redis.call('SET', KEYS[1], ARGV[1] .. (now + tonumber(ARGV[3])) .. ':' .. stored, 'PX', ARGV[4])
return 'A' .. stored`)

// unadvanceScript ends the caller's live claim of a version key (token
// prefix ARGV[1]), restoring the version it replaced as committed value
// ARGV[3] ‖ version for ARGV[2] ms, or deleting the key if it replaced
// none. It returns 1, or 0 when the key does not hold the caller's live
// claim.
var unadvanceScript = newKeyScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 17) ~= ARGV[1] then return 0 end
local lease, prev = string.match(string.sub(v, 18), '^(%d+):(%x*)$')
local t = redis.call('TIME')
if not lease or tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then return 0 end
if prev == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[3] .. prev, 'PX', ARGV[2])
end
return 1`)

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
