package redis

import (
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

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
// fenceMS ('X' ‖ token ‖ answer: free to every script), and with
// ARGV[3] = 1 appends the removal to the archive log KEYS[2] (found or
// not: the log may still hold an earlier commit). It answers '1' ‖ what
// lookScript answers (” when another call removed the key since the
// read: there is nothing left to remove), or '0' when another value was
// written since the read (it is kept, and the caller answers Held). A copy of the call retried after a lost reply finds
// its fence and answers what the first removed; a copy later still finds
// another value (a commit made since carries another token) and changes
// nothing: a Forget removes only what it read. With ARGV[4] not '0' (ms,
// the server's clock: the Forget's Request.LogBy), a call that finds the
// key absent after ARGV[4] and would append a removal answers 'L' and
// writes nothing: a commit made after the Forget's reads lives in Redis
// for the window, longer than LogBy is after them, so by LogBy an absent
// key holds no commit made since; later, one may have left Redis for the
// archive, where the removal would hide it.
var forgetScript = newKeyScript(strings.ReplaceAll(lookBody, "HELD", "'1H'") + `
if fenced and #fenced > 17 and string.sub(fenced, 2, 17) == ARGV[2] then
  return '1' .. string.sub(fenced, 18) -- a copy of this forget that applied
end
if v and v ~= ARGV[1] then return '0' end -- written since the read: kept
if not v and ARGV[3] == '1' and ARGV[4] ~= '0' then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then return 'L' end
end
if not v then out = '' end
if v then redis.call('SET', KEYS[1], 'X' .. ARGV[2] .. out, 'PX', ` + fenceMS + `) end
if ARGV[3] == '1' then logRemoval(KEYS[2], KEYS[1]) end
return '1' .. out`)

// trimRemovals bounds the fields of the log's removals hash one trim
// reads (trimScript).
const trimRemovals = "20000"

// trimScript trims the archive log KEYS[1] below the ID ARGV[1] and
// records in KEYS[2] the newest position trimmed, ARGV[2] ‖ '-' ‖ ARGV[3]
// (ms, seq), unless a later one is recorded (XTRIM does not move the
// stream's max-deleted-entry-id). It deletes from the log's removals
// hash (logRemoval) every removal at or before that position: the drain
// trims only what the archive applied, so a removal trimmed is one the
// archive holds, and a later removal of the same key, which replaced the
// field's ID, stays. (A late copy of the script trims and deletes only
// what a newer copy already did.) A trim reads at most about
// trimRemovals fields of the hash (HSCAN, a thousand at a time), so a
// backlog of removals (the drain was down) never holds the server long:
// the rest go at later trims, and a field left meanwhile hides nothing
// the archive read had applied.
var trimScript = goredis.NewScript(`
redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1])
local a, b = tonumber(ARGV[2]), tonumber(ARGV[3])
local pending = string.sub(KEYS[1], 1, -2) .. '\255removing'
local cursor, read = '0', 0
repeat
  local r = redis.call('HSCAN', pending, cursor, 'COUNT', 1000)
  cursor = r[1]
  local all = r[2]
  for i = 1, #all, 2 do
    local ms, seq = string.match(all[i + 1], '^(%d+)-(%d+)$')
    if not ms or tonumber(ms) < a or (tonumber(ms) == a and tonumber(seq) <= b) then
      redis.call('HDEL', pending, all[i])
    end
  end
  read = read + #all / 2
until cursor == '0' or read >= ` + trimRemovals + `
local v = redis.call('GET', KEYS[2])
if v then
  local ms, seq = string.match(v, '^(%d+)-(%d+)$')
  if ms and (tonumber(ms) > a or (tonumber(ms) == a and tonumber(seq) >= b)) then return 0 end
end
redis.call('SET', KEYS[2], ARGV[2] .. '-' .. ARGV[3])
return 1`)

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
