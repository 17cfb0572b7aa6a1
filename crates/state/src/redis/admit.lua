-- Admission of one request, in one round trip: the user's token bucket, then the session the request names
-- (touch or create, with the per-user session cap), then a slot in a capped set and a fixed-window counter,
-- which are taken only if both are free. Every key is under the user's hash tag.
-- KEYS: bucket, session, events, leases, session index, slot set, window
-- ARGV: 1 capacity ('' = no bucket), 2 per_second, 3 slot cap ('' = no slot), 4 slot token, 5 slot ttl ms,
--       6 window limit ('' = no window), 7 window ms, 8 op ('' | 'touch' | 'create'), 9 session id;
--       on 'create' only: 10 max sessions, 11 idle ttl ms, 12 protocol version, 13 capabilities, 14 client info;
--       then slot tokens to release first (earlier calls' ends, riding on this round trip).
-- Reply: {code, tokens (millionths), wait_ms, pv, caps, lvl, slots, window_used, window_reset_ms (on code 6 only)};
-- code 0 admitted, 1 bucket empty, 2 no such session, 3 session id taken, 4 session cap (slots = open sessions), 5 slot cap, 6 window used up.
--
-- This is the hot path: every tools/call runs it, and one Redis runs it for the whole fleet, one at a time, so it
-- is written for Redis's instruction count (issue 19, docs/BENCHMARKS.md). It writes only what changes: a TTL is
-- pushed out only when it would end too early, and then by more than is needed, so that the calls that follow
-- find it long enough and leave it alone. A key that outlives its need is harmless: an expired bucket and a full
-- one read the same, and stale slots and index members are skipped by their scores. Measured with callgrind, not
-- guessed: each argument costs Redis about 1k instructions (so a touch does not carry create's five), and Lua's
-- arithmetic operators, which also turn strings into numbers, are cheaper than math.* and tonumber calls. Numbers
-- go to redis.call as strings formatted here with %d: a Lua number argument costs Redis a %.17g.
local call = redis.call
local t = call('TIME')
local us = t[2] + 0
local now = t[1] * 1000 + (us - us % 1000) / 1000
local nows = string.format('%d', now)
local op = ARGV[8]
local n, i = #ARGV, 10
if op == 'create' then i = 15 end
while i <= n do
  local j = i + 999
  if j > n then j = n end
  call('ZREM', KEYS[6], unpack(ARGV, i, j))
  i = j + 1
end

local tok, wait = '', 0
if ARGV[1] ~= '' then
  -- u: tokens in millionths (an integer), ts: last update (ms), x: when the key expires (ms).
  local cap, rate = ARGV[1] * 1000000, ARGV[2] * 1000
  local b = call('HMGET', KEYS[1], 'u', 'ts', 'x')
  local tokens = cap
  if b[1] then
    tokens = b[1] + 0
    local gap = now - b[2]
    if gap > 0 then
      local add = gap * rate
      tokens = tokens + add - add % 1
          end
  end
  if tokens > cap then tokens = cap end
  if tokens < 1000000 then
    -- Refused: nothing is written, so a flood does not push the refill back.
    local w = (1000000 - tokens) / rate
    if w % 1 > 0 then w = w - w % 1 + 1 end
    return {1, string.format('%d', tokens), w, '', '', '', '', '', ''}
  end
  tokens = tokens - 1000000
  local full = (cap - tokens) / rate
  if full % 1 > 0 then full = full - full % 1 + 1 end
  tok, wait = string.format('%d', tokens), full
  -- The key must outlive the refill (an expired bucket reads full): it expires 1 to 2 s after the bucket is full,
  -- an eighth of the refill time later at most.
  if b[3] and b[3] - now >= full + 1000 then
    call('HSET', KEYS[1], 'u', tok, 'ts', nows)
  else
    local life = full + 2000 + (full - full % 8) / 8
    call('HSET', KEYS[1], 'u', tok, 'ts', nows, 'x', string.format('%d', now + life))
    call('PEXPIRE', KEYS[1], string.format('%d', life))
  end
end

-- A session lives for its idle TTL after its last request, and at most a sixteenth longer: its TTLs (and its score
-- in the user's index) are pushed out to ttl + ttl/16 only once less than ttl is left.
local pv, caps, lvl = '', '', ''
if op == 'touch' then
  local v = call('HMGET', KEYS[2], 'ttl', 'pv', 'caps', 'lvl')
  if not v[1] then return {2, tok, wait, '', '', '', '', '', ''} end
  local ttl = v[1] + 0
  if call('PTTL', KEYS[2]) < ttl then
    local life = ttl + (ttl - ttl % 16) / 16
    local lifes = string.format('%d', life)
    call('PEXPIRE', KEYS[2], lifes)
    call('PEXPIRE', KEYS[3], lifes)
    call('PEXPIRE', KEYS[4], lifes)
    call('ZADD', KEYS[5], string.format('%d', now + life), ARGV[9])
    if call('PTTL', KEYS[5]) < life then call('PEXPIRE', KEYS[5], lifes) end
  end
  pv, caps, lvl = v[2] or '', v[3] or '', v[4] or ''
elseif op == 'create' then
  if call('EXISTS', KEYS[2]) == 1 then return {3, tok, wait, '', '', '', '', '', ''} end
  call('ZREMRANGEBYSCORE', KEYS[5], '-inf', nows)
  local open = call('ZCARD', KEYS[5])
  local max = ARGV[10] + 0
  if max > 0 and open >= max then return {4, tok, wait, '', '', '', open, '', ''} end
  local ttl = ARGV[11] + 0
  local life = ttl + (ttl - ttl % 16) / 16
  local lifes = string.format('%d', life)
  call('HSET', KEYS[2], 'ttl', ARGV[11], 'pv', ARGV[12], 'caps', ARGV[13], 'info', ARGV[14], 'created', t[1], 'n', '0')
  call('PEXPIRE', KEYS[2], lifes)
  call('ZADD', KEYS[5], string.format('%d', now + life), ARGV[9])
  if call('PTTL', KEYS[5]) < life then call('PEXPIRE', KEYS[5], lifes) end
end

local slots, wused = '', ''
if ARGV[3] ~= '' then
  -- Live slots only; expired ones (a dead replica's) are dropped when a slot is released (slot.lua).
  slots = call('ZCOUNT', KEYS[6], '(' .. nows, '+inf')
  local scap = ARGV[3] + 0
  if scap > 0 and slots >= scap then return {5, tok, wait, pv, caps, lvl, slots, '', ''} end
end
if ARGV[6] ~= '' then
  -- Counted first, given back if it went over: one command on the way that admits. (The window's end is read
  -- only on a refusal, for Retry-After; one without a TTL, which nothing here makes, would get one there.)
  wused = call('INCR', KEYS[7])
  if wused == 1 then call('PEXPIRE', KEYS[7], ARGV[7]) end
  if wused > ARGV[6] + 0 then
    local wreset = 0
    if wused == 1 then
      call('DEL', KEYS[7])
    else
      call('DECR', KEYS[7])
      wreset = call('PTTL', KEYS[7])
      if wreset < 0 then
        call('PEXPIRE', KEYS[7], ARGV[7])
        wreset = ARGV[7] + 0
      end
    end
    return {6, tok, wait, pv, caps, lvl, slots, wused - 1, wreset}
  end
end
if slots ~= '' then
  -- The set outlives its newest lease.
  local ttl = ARGV[5] + 0
  call('ZADD', KEYS[6], string.format('%d', now + ttl), ARGV[4])
  if call('PTTL', KEYS[6]) < ttl then call('PEXPIRE', KEYS[6], string.format('%d', 2 * ttl)) end
  slots = slots + 1
end
return {0, tok, wait, pv, caps, lvl, slots, wused, ''}
