package redis

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
