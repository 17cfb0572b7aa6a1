-- Admission of one request, in one round trip: the user's token bucket, then the session the request names
-- (touch or create, with the per-user session cap), then a slot in a capped set and a fixed-window counter,
-- which are taken only if both are free. Every key is under the user's hash tag.
-- KEYS: bucket, session, events, leases, session index, slot set, window
-- ARGV: 1 capacity ('' = no bucket), 2 per_second, 3 op ('' | 'touch' | 'create'), 4 session id, 5 max sessions,
--       6 idle ttl ms, 7 protocol version, 8 capabilities, 9 client info, 10 slot cap ('' = no slot), 11 slot token,
--       12 slot ttl ms, 13 window limit ('' = no window), 14 window ms, 15.. slot tokens to release first (earlier
--       calls' ends, riding on this round trip)
-- Reply: {code, tokens, wait_ms, pv, caps, lvl, slots, window_used, window_reset_ms}; code 0 admitted, 1 bucket
-- empty, 2 no such session, 3 session id taken, 4 session cap (slots = open sessions), 5 slot cap, 6 window used up.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
for i = 15, #ARGV do redis.call('ZREM', KEYS[6], ARGV[i]) end
local tok, wait = '', 0
local function reply(code, pv, caps, lvl, slots, wused, wreset)
  return {code, tok, wait, pv or '', caps or '', lvl or '', slots or '', wused or '', wreset or ''}
end
-- The user's session index and slot sets expire with their longest-lived member: every member of one set has the
-- same TTL, so the newest one's is enough.

if ARGV[1] ~= '' then
  local cap, rate = tonumber(ARGV[1]), tonumber(ARGV[2]) / 1000
  local b = redis.call('HMGET', KEYS[1], 't', 'ts')
  local tokens = cap
  if b[1] then tokens = math.min(cap, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * rate) end
  if tokens < 1 then
    -- Refused: nothing is written, so a flood does not push the refill back.
    tok, wait = string.format('%.17g', tokens), math.ceil((1 - tokens) / rate)
    return reply(1)
  end
  tokens = tokens - 1
  local full = math.ceil((cap - tokens) / rate)
  redis.call('HSET', KEYS[1], 't', string.format('%.17g', tokens), 'ts', string.format('%.3f', now))
  redis.call('PEXPIRE', KEYS[1], full + 1000)
  tok, wait = string.format('%.17g', tokens), full
end

local pv, caps, lvl
if ARGV[3] == 'touch' then
  local v = redis.call('HMGET', KEYS[2], 'ttl', 'pv', 'caps', 'lvl')
  if not v[1] then return reply(2) end
  local ttl = tonumber(v[1])
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
  redis.call('PEXPIRE', KEYS[4], ttl)
  redis.call('ZADD', KEYS[5], now + ttl, ARGV[4])
  redis.call('PEXPIRE', KEYS[5], ttl)
  pv, caps, lvl = v[2], v[3], v[4]
elseif ARGV[3] == 'create' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return reply(3) end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  local open = redis.call('ZCARD', KEYS[5])
  local max = tonumber(ARGV[5])
  if max > 0 and open >= max then return reply(4, nil, nil, nil, open) end
  local ttl = tonumber(ARGV[6])
  redis.call('HSET', KEYS[2], 'ttl', ttl, 'pv', ARGV[7], 'caps', ARGV[8], 'info', ARGV[9], 'created', t[1], 'n', 0)
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('ZADD', KEYS[5], now + ttl, ARGV[4])
  redis.call('PEXPIRE', KEYS[5], ttl)
end

local slots, wused, wreset
if ARGV[10] ~= '' then
  -- Live slots only; expired ones (a dead replica's) are dropped when a slot is released (slot.lua).
  slots = redis.call('ZCOUNT', KEYS[6], string.format('(%.3f', now), '+inf')
  local cap = tonumber(ARGV[10])
  if cap > 0 and slots >= cap then return reply(5, pv, caps, lvl, slots) end
end
if ARGV[13] ~= '' then
  wused = tonumber(redis.call('GET', KEYS[7]) or '0')
  if wused >= tonumber(ARGV[13]) then
    return reply(6, pv, caps, lvl, slots, wused, math.max(redis.call('PTTL', KEYS[7]), 0))
  end
end
if slots then
  local ttl = tonumber(ARGV[12])
  redis.call('ZADD', KEYS[6], now + ttl, ARGV[11])
  redis.call('PEXPIRE', KEYS[6], ttl)
  slots = slots + 1
end
if wused then
  wused = redis.call('INCR', KEYS[7])
  wreset = redis.call('PTTL', KEYS[7])
  if wreset < 0 then
    redis.call('PEXPIRE', KEYS[7], ARGV[14])
    wreset = tonumber(ARGV[14])
  end
end
return reply(0, pv, caps, lvl, slots, wused, wreset)
