-- Admission of one request, in one round trip: the user's token bucket, then the session the request names
-- (touch or create, with the per-user session cap), then a slot in a capped set and a fixed-window counter,
-- which are taken only if both are free; and the releases of earlier calls' slots, whatever the decision. Every
-- key is under the user's hash tag.
-- KEYS: bucket, slot set, window, then only for a touch or a create: session, events, leases, and the user's
--       session index only when the user's sessions are counted for a cap (a request without a session, as every
--       2026-07-28 one, carries three keys, not seven; with no session cap, nothing keeps the index)
-- ARGV: 1 capacity ('' = no bucket), 2 per_second, 3 slot cap ('' = no slot), 4 slot token, 5 slot ttl ms,
--       6 window limit ('' = no window), 7 window ms, 8 op ('' | 'touch' | 'tap' | 'create'), 9 session id;
--       on 'create' only: 10 max sessions (0 = no cap), 11 idle ttl ms, 12 protocol version, 13 capabilities;
--       then slot tokens to release first (earlier calls' ends, riding on this round trip).
-- A 'tap' is a touch by a replica that keeps the session's fixed fields (pv, caps) itself: it reads and returns
-- only what may change.
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
-- The releases (ARGV[first..n]) are applied once, before the reply: after the new slot is added when one is taken
-- (so that a principal whose next call carries its last call's release never empties the set, which would drop its
-- TTL and cost a PEXPIRE on every call), before the count when the set looks full, and at the end otherwise.
local n, first = #ARGV, 10
if op == 'create' then first = 14 end
local rel = first <= n
local reply, tok, wait, slots, wused = nil, '', 0, '', ''
local pv, caps, lvl = '', '', ''
-- The session's new life (ms) when a touch or a create set it: its index entry follows (below), if it has one.
local indexed
-- One pass (repeat ... until true, not indented): a refusal sets the reply and leaves with break.
repeat
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
    reply = {1, string.format('%d', tokens), w, '', '', '', '', '', ''}
    break
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
if op == 'tap' or op == 'touch' then
  local v
  if op == 'tap' then
    v = call('HMGET', KEYS[4], 'ttl', 'lvl')
  else
    v = call('HMGET', KEYS[4], 'ttl', 'lvl', 'pv', 'caps')
  end
  if not v[1] then
    reply = {2, tok, wait, '', '', '', '', '', ''}
    break
  end
  local ttl = v[1] + 0
  if call('PTTL', KEYS[4]) < ttl then
    local life = ttl + (ttl - ttl % 16) / 16
    local lifes = string.format('%d', life)
    call('PEXPIRE', KEYS[4], lifes)
    call('PEXPIRE', KEYS[5], lifes)
    call('PEXPIRE', KEYS[6], lifes)
    indexed = life
  end
  lvl, pv, caps = v[2] or '', v[3] or '', v[4] or ''
elseif op == 'create' then
  if call('EXISTS', KEYS[4]) == 1 then
    reply = {3, tok, wait, '', '', '', '', '', ''}
    break
  end
  local max = ARGV[10] + 0
  if KEYS[7] and max > 0 then
    -- The index's scores are the sessions' ends in whole seconds, rounded up (a smaller entry than in ms: 4 bytes
    -- of an idle session's), so an entry goes at most 1 s after its session: never before.
    call('ZREMRANGEBYSCORE', KEYS[7], '-inf', t[1])
    local open = call('ZCARD', KEYS[7])
    if open >= max then
      reply = {4, tok, wait, '', '', '', open, '', ''}
      break
    end
  end
  local ttl = ARGV[11] + 0
  local life = ttl + (ttl - ttl % 16) / 16
  local lifes = string.format('%d', life)
  -- Only what a request reads: the idle TTL, the protocol version and the capabilities (an idle session's bytes
  -- are mostly this hash: issue 32). `n` starts at 0 by being absent (open.lua's HINCRBY).
  call('HSET', KEYS[4], 'ttl', ARGV[11], 'pv', ARGV[12], 'caps', ARGV[13])
  call('PEXPIRE', KEYS[4], lifes)
  indexed = life
end
if indexed and KEYS[7] then
  -- Its score is its end in whole seconds, rounded up (above); the index outlives its newest entry.
  local e = now + indexed + 999
  call('ZADD', KEYS[7], string.format('%d', (e - e % 1000) / 1000), ARGV[9])
  if call('PTTL', KEYS[7]) < indexed then call('PEXPIRE', KEYS[7], string.format('%d', indexed)) end
end

if ARGV[3] ~= '' then
  -- Counted cheaply (ZCARD), with the leases about to be released and any expired ones (a dead replica's) still in:
  -- that count is at least the live one, so below the cap it admits rightly. Only when it reaches the cap are the
  -- releases applied and the expired leases dropped, and the live ones counted.
  slots = call('ZCARD', KEYS[2])
  local scap = ARGV[3] + 0
  if scap > 0 and slots >= scap then
    for k = first, n do call('ZREM', KEYS[2], ARGV[k]) end
    rel = false
    call('ZREMRANGEBYSCORE', KEYS[2], '-inf', nows)
    slots = call('ZCARD', KEYS[2])
    if slots >= scap then
      reply = {5, tok, wait, pv, caps, lvl, slots, '', ''}
      break
    end
  end
end
if ARGV[6] ~= '' then
  -- Counted first, given back if it went over: one command on the way that admits. (The window's end is read
  -- only on a refusal, for Retry-After; one without a TTL, which nothing here makes, would get one there.)
  wused = call('INCR', KEYS[3])
  if wused == 1 then call('PEXPIRE', KEYS[3], ARGV[7]) end
  if wused > ARGV[6] + 0 then
    local wreset = 0
    if wused == 1 then
      call('DEL', KEYS[3])
    else
      call('DECR', KEYS[3])
      wreset = call('PTTL', KEYS[3])
      if wreset < 0 then
        call('PEXPIRE', KEYS[3], ARGV[7])
        wreset = ARGV[7] + 0
      end
    end
    reply = {6, tok, wait, pv, caps, lvl, slots, wused - 1, wreset}
    break
  end
end
if slots ~= '' then
  -- The new lease first, then (below) the releases: the set never empties between two calls.
  call('ZADD', KEYS[2], string.format('%d', now + ARGV[5]), ARGV[4])
  slots = slots + 1
end
reply = {0, tok, wait, pv, caps, lvl, slots, wused, ''}
until true
-- The releases not applied yet, in one place for every decision.
local released = 0
while rel and first <= n do
  local j = first + 999
  if j > n then j = n end
  released = released + call('ZREM', KEYS[2], unpack(ARGV, first, j))
  first = j + 1
end
if reply[1] == 0 and slots ~= '' then
  -- A slot was taken: the set outlives its newest lease.
  reply[7] = slots - released
  local ttl = ARGV[5] + 0
  if call('PTTL', KEYS[2]) < ttl then call('PEXPIRE', KEYS[2], string.format('%d', 2 * ttl)) end
end
return reply
