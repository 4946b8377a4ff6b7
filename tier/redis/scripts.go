package redis

import goredis "github.com/redis/go-redis/v9"

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
// call's commit is replaced by it, and appended to the archive log
// (logCommit) when ARGV[9] is 1; with ARGV[10] not empty a mark
// reaching the server after ARGV[10] (ms, the server's clock: the mark's
// Request.LogBy) answers 'L' and writes nothing. A key holding no string
// answers 'W'. A mark first looks for a trace of
// its own token's commit that a Forget removed since (the fence the
// Forget left, or ARGV[8], the forgotten set, when not empty): a copy of
// the mark applied before the Forget, so the mark answers acquired ('A0')
// and writes nothing (see markOnce). A key holding the fence of the
// caller's own token (its release or give-back: this is a late copy of a
// call that ended) is answered 'A0' too, and nothing is written.
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
if ARGV[10] and ARGV[10] ~= '' and now > tonumber(ARGV[10]) then return 'L' end
local ok, v = pcall(redis.call, 'GET', KEYS[1])
if not ok then return 'W' end
local n, tag = 0, 'A'
if v and string.sub(v, 1, 1) == 'X' then
  -- A fence: free, unless it is this call's own (its release or
  -- give-back came first: this is a late copy) or a Forget's over this
  -- mark's own commit.
  if string.sub(v, 2, 17) == own then return 'A0' end
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
  if ARGV[9] == '1' then logCommit(KEYS[1], ARGV[6]) end
  return tag .. n
end
local ttl = ARGV[2]
if max > 0 then ttl = ARGV[3] end
redis.call('SET', KEYS[1], ARGV[1] .. (now + tonumber(ARGV[2])) .. ':' .. n, 'PX', ttl)
return tag .. n`)

// commitScript turns the caller's unexpired claim (token prefix ARGV[1])
// into the committed value ARGV[2] with TTL ARGV[3] ms, appending it to
// the archive log KEYS[2] when ARGV[4] is 1 (logCommit: with the call's
// other commits, in one entry at the call's end); a value already
// committed with the caller's token is a retry and succeeds (and was
// appended by the call that committed it). A key holding no string (no
// key of this layout) is not the caller's: 0. The clock is read only for
// a claim whose lease is in its value (MaxAttempts); a SET NX claim's
// lease is its TTL.
var commitScript = newKeyScript(`
local ok, v = pcall(redis.call, 'GET', KEYS[1])
if not ok then return 0 end
if v and string.sub(v, 1, 17) == ARGV[1] then
  local lease = string.match(string.sub(v, 18), '^(%d+):')
  if lease then
    local t = redis.call('TIME')
    if tonumber(lease) <= tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) then
      return 0
    end
  end
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[4] == '1' then logCommit(KEYS[1], ARGV[2]) end
  return 1
end
if v and string.sub(v, 1, 17) == string.sub(ARGV[2], 1, 17) then
  return 1
end
return 0`)

// markLogScript marks the keys of an archived namespace (LogMarker), a
// chunk in one call: KEYS[1] is the archive log and KEYS[1+i] key i;
// ARGV[1] is the calls' LogBy (ms, the server's clock), ARGV[2i] key i's
// committed value and ARGV[2i+1] its TTL (ms). Where key i is free it
// commits the value (SET … NX GET), answering false; otherwise it
// answers the key's value and writes nothing there; a key holding no
// string answers 'W' (the SET is a pcall: nothing after the first write
// can fail). The commits are appended as one log entry (logEntryLua's
// format) after the last key, in the same script run. A call reaching
// the server after LogBy answers 'L' for every key and writes nothing.
// Written for one call per chunk, not as a keyScript body: measured at
// 5.9 µs of server CPU a key against 9.0–10.4 for the same body under
// newKeyScript's per-key call (a local redis-server, 300,000 keys).
// Like a plain mark's SET it is sent once (scriptOnce): a lost reply is
// settled through claimScript, with the log and the same LogBy.
var markLogScript = goredis.NewScript(`
local t = redis.call('TIME')
local out = {}
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[1]) then
  for i = 2, #KEYS do out[i - 1] = 'L' end
  return out
end
local logged, n = {}, 0
for i = 2, #KEYS do
  local k, v = KEYS[i], ARGV[2 * (i - 1)]
  local ok, old = pcall(redis.call, 'SET', k, v, 'PX', ARGV[2 * (i - 1) + 1], 'NX', 'GET')
  if not ok then
    out[i - 1] = 'W'
  elseif old then
    out[i - 1] = old
  else
    out[i - 1] = false
    n = n + 1
    logged[n] = struct.pack('>I4', #k) .. k .. struct.pack('>I4', #v) .. v
  end
end
if n > 0 then redis.call('XADD', KEYS[1], '*', 'c', table.concat(logged)) end
return out`)

// releaseScript frees the key only while it holds the caller's unexpired
// claim (token prefix ARGV[1]): with ARGV[2] > 0 it keeps the attempt
// count, ARGV[4] higher, for ARGV[3] ms (fencing the key if that is 0);
// otherwise it fences the key. With ARGV[5] = 1 it also undoes a commit
// carrying the caller's token (one whose caller was told it failed): the
// key is freed, keeping with ARGV[2] > 0 the attempt count ARGV[6] the
// claim carried (the commit replaced it). A freed key keeps the caller's
// fence ('X' ‖ token) for fenceMS, not nothing: a mark's SET NX that
// reaches the server late, after its call was settled or given back while
// this claim held the key, finds it taken (every script takes the fence as
// free), and a late copy of the caller's own claim finds its fence and
// takes nothing (claimScript).
var releaseScript = newKeyScript(`
local v = redis.call('GET', KEYS[1])
if v and ARGV[5] == '1' and string.sub(v, 1, 1) == 'D' and string.sub(v, 2, 17) == string.sub(ARGV[1], 2, 17) then
  local carried = tonumber(ARGV[6]) or 0
  if tonumber(ARGV[2]) > 0 and carried > 0 then
    redis.call('SET', KEYS[1], 'R' .. carried, 'PX', ARGV[3])
  else
    redis.call('SET', KEYS[1], 'X' .. string.sub(ARGV[1], 2, 17), 'PX', ` + fenceMS + `)
  end
  if ARGV[7] == '1' then logRemoval(KEYS[2], KEYS[1]) end
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
  redis.call('SET', KEYS[1], 'X' .. string.sub(ARGV[1], 2, 17), 'PX', ` + fenceMS + `)
end
return 1`)

// fenceMS is how long a script that frees a key (a Forget, a release,
// a give-back) leaves its fence ('X' ‖ token, a Forget's with its answer)
// on it: longer than a client's retries of a call (go-redis by default: 3
// retries of up to 3 s reads), so a retried copy of a Forget answers what
// the first copy removed, and a message of an earlier call delayed that
// long (a mark's SET NX) finds the key taken. A claim of the key meanwhile
// goes through the claim script (a SET NX cannot pass a fence), which
// takes the key as free. A message delayed longer than that reaches a free
// key as it would without the fence (docs/reliability.md).
const fenceMS = "30000"

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

// unmarkScript first adds the token to the forgotten set ARGV[4] (when
// not empty: one server) for ARGV[5] ms, then undoes a mark of the token
// prefix ARGV[1] ('D' ‖ token)
// at KEYS[1], leaving the fence ARGV[2] ('X' ‖ token) for ARGV[3] ms and,
// when ARGV[6] is 1, appending the removal to the archive log KEYS[2]
// (the mark may have been a logged one, markLogScript), returning 1; where the key is free it sets that fence, which the plain
// SET NX of a mark still on its way cannot pass and every script takes as
// free, returning 2; where another call's fence is there it keeps it for
// at least ARGV[3] ms (its content may be a Forget's answer, which that
// Forget's retries read), returning 2; otherwise 0. (A mark sent through
// claimScript, for a key holding an attempt count left from MaxAttempts,
// is not fenced out by another call's fence: the script takes the fence as
// free. A copy of the call's own settling script finds the call's own
// fence and writes nothing.)
var unmarkScript = newKeyScript(forgottenLua + `
if ARGV[4] ~= '' then forget(ARGV[4], ARGV[5], {string.sub(ARGV[2], 2, 17)}) end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 17) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  if ARGV[6] == '1' then logRemoval(KEYS[2], KEYS[1]) end
  return 1
end
if not v then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
if string.sub(v, 1, 1) == 'X' then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
  return 2
end
return 0`)
