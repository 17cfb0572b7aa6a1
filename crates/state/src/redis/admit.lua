-- Admission of one request, in one round trip: the user's token bucket, then the session the request names
-- (touch or create, with the per-user session cap), then a slot in a capped set and a fixed-window counter,
-- which are taken only if both are free. Every key is under the user's hash tag.
-- KEYS: bucket, session, events, leases, session index, slot set, window
-- ARGV: 1 capacity ('' = no bucket), 2 per_second, 3 op ('' | 'touch' | 'create'), 4 session id, 5 max sessions,
--       6 idle ttl ms, 7 protocol version, 8 capabilities, 9 client info, 10 slot cap ('' = no slot), 11 slot token,
--       12 slot ttl ms, 13 window limit ('' = no window), 14 window ms, 15.. slot tokens to release first (earlier
--       calls' ends, riding on this round trip)
-- Reply: {code, tokens (millionths), wait_ms, pv, caps, lvl, slots, window_used, window_reset_ms (on code 6 only)};
-- code 0 admitted, 1 bucket empty, 2 no such session, 3 session id taken, 4 session cap (slots = open sessions), 5 slot cap, 6 window used up.
--
-- This is the hot path: every tools/call runs it. It writes only what changes (issue 19, docs/BENCHMARKS.md): a
-- TTL is pushed out only when it would end too early, and then by more than is needed, so that the calls that
-- follow find it long enough and leave it alone. A key that outlives its need is harmless: an expired bucket and a
-- full one read the same, and stale slots and index members are skipped by their scores.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Numbers go to redis.call as strings formatted here with %d: a Lua number argument costs Redis a %.17g.
local nows = string.format('%d', now)
local n = #ARGV
local i = 15
while i <= n do
  local j = math.min(n, i + 999)
  redis.call('ZREM', KEYS[6], unpack(ARGV, i, j))
  i = j + 1
end
local tok, wait = '', 0
local function reply(code, pv, caps, lvl, slots, wused, wreset)
  return {code, tok, wait, pv or '', caps or '', lvl or '', slots or '', wused or '', wreset or ''}
end

if ARGV[1] ~= '' then
  -- u: tokens in millionths (an integer), ts: last update (ms), x: when the key expires (ms).
  local cap, rate = tonumber(ARGV[1]) * 1e6, tonumber(ARGV[2]) * 1000
  local b = redis.call('HMGET', KEYS[1], 'u', 'ts', 'x')
  local tokens = cap
  if b[1] then tokens = math.min(cap, tonumber(b[1]) + math.floor(math.max(0, now - tonumber(b[2])) * rate)) end
  if tokens < 1e6 then
    -- Refused: nothing is written, so a flood does not push the refill back.
    tok, wait = string.format('%d', tokens), math.ceil((1e6 - tokens) / rate)
    return reply(1)
  end
  tokens = tokens - 1e6
  local full = math.ceil((cap - tokens) / rate)
  tok, wait = string.format('%d', tokens), full
  -- The key must outlive the refill (an expired bucket reads full): it expires 1 to 2 s after the bucket is full,
  -- an eighth of the refill time later at most.
  if b[3] and tonumber(b[3]) >= now + full + 1000 then
    redis.call('HSET', KEYS[1], 'u', tok, 'ts', nows)
  else
    local life = full + 2000 + math.floor(full / 8)
    redis.call('HSET', KEYS[1], 'u', tok, 'ts', nows, 'x', string.format('%d', now + life))
    redis.call('PEXPIRE', KEYS[1], string.format('%d', life))
  end
end

-- A session lives for its idle TTL after its last request, and at most a sixteenth longer: its TTLs (and its score
-- in the user's index) are pushed out to ttl + ttl/16 only once less than ttl is left.
local pv, caps, lvl
if ARGV[3] == 'touch' then
  local v = redis.call('HMGET', KEYS[2], 'ttl', 'pv', 'caps', 'lvl')
  if not v[1] then return reply(2) end
  local ttl = tonumber(v[1])
  if redis.call('PTTL', KEYS[2]) < ttl then
    local life = ttl + math.floor(ttl / 16)
    local lifes = string.format('%d', life)
    redis.call('PEXPIRE', KEYS[2], lifes)
    redis.call('PEXPIRE', KEYS[3], lifes)
    redis.call('PEXPIRE', KEYS[4], lifes)
    redis.call('ZADD', KEYS[5], string.format('%d', now + life), ARGV[4])
    if redis.call('PTTL', KEYS[5]) < life then redis.call('PEXPIRE', KEYS[5], lifes) end
  end
  pv, caps, lvl = v[2], v[3], v[4]
elseif ARGV[3] == 'create' then
  if redis.call('EXISTS', KEYS[2]) == 1 then return reply(3) end
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
  local open = redis.call('ZCARD', KEYS[5])
  local max = tonumber(ARGV[5])
  if max > 0 and open >= max then return reply(4, nil, nil, nil, open) end
  local ttl = tonumber(ARGV[6])
  local life = ttl + math.floor(ttl / 16)
  local lifes = string.format('%d', life)
  redis.call('HSET', KEYS[2], 'ttl', ARGV[6], 'pv', ARGV[7], 'caps', ARGV[8], 'info', ARGV[9], 'created', t[1], 'n', '0')
  redis.call('PEXPIRE', KEYS[2], lifes)
  redis.call('ZADD', KEYS[5], string.format('%d', now + life), ARGV[4])
  if redis.call('PTTL', KEYS[5]) < life then redis.call('PEXPIRE', KEYS[5], lifes) end
end

local slots, wused, wreset
if ARGV[10] ~= '' then
  -- Live slots only; expired ones (a dead replica's) are dropped when a slot is released (slot.lua).
  slots = redis.call('ZCOUNT', KEYS[6], '(' .. nows, '+inf')
  local cap = tonumber(ARGV[10])
  if cap > 0 and slots >= cap then return reply(5, pv, caps, lvl, slots) end
end
if ARGV[13] ~= '' then
  -- Counted first, given back if it went over: one command on the way that admits. (The window's end is read
  -- only on a refusal, for Retry-After; one without a TTL, which nothing here makes, would get one there.)
  wused = redis.call('INCR', KEYS[7])
  if wused == 1 then redis.call('PEXPIRE', KEYS[7], ARGV[14]) end
  if wused > tonumber(ARGV[13]) then
    if wused == 1 then
      redis.call('DEL', KEYS[7])
      wreset = 0
    else
      redis.call('DECR', KEYS[7])
      wreset = redis.call('PTTL', KEYS[7])
      if wreset < 0 then
        redis.call('PEXPIRE', KEYS[7], ARGV[14])
        wreset = tonumber(ARGV[14])
      end
    end
    return reply(6, pv, caps, lvl, slots, wused - 1, wreset)
  end
end
if slots then
  -- The set outlives its newest lease.
  local ttl = tonumber(ARGV[12])
  redis.call('ZADD', KEYS[6], string.format('%d', now + ttl), ARGV[11])
  if redis.call('PTTL', KEYS[6]) < ttl then redis.call('PEXPIRE', KEYS[6], string.format('%d', 2 * ttl)) end
  slots = slots + 1
end
return reply(0, pv, caps, lvl, slots, wused, wreset)
