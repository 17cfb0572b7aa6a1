-- Admission of one request or of several of one principal's at once (a batch: issue 32), in one round trip. For
-- each, in order: the user's token bucket, then the session the request names (touch or create, with the per-user
-- session cap), then a slot in a capped set and a fixed-window counter, which are taken only if both are free. The
-- releases of earlier calls' slots ride along and are applied whatever the decisions. Every key is under the user's
-- hash tag, so a batch is one slot on Redis Cluster. A batch's admissions share one bucket, slot set, window and
-- their parameters (the replica batches only admissions that do), and each gets the decision it would get alone,
-- one after the other: the bucket, the slot count and the window are read once and carried from one to the next.
-- KEYS: bucket, slot set, window, the user's revocations, then the user's session index only when the user's
--       sessions are counted for a cap (with no session cap, nothing keeps the index), then for each admission in
--       order: session, events, leases when it touches or creates a session (a request without a session, as every
--       2026-07-28 one, has none), and its DPoP proof's replay key in a batch of admissions with proofs.
-- ARGV: 1 capacity ('' = no bucket), 2 per_second, 3 slot cap ('' = no slot), 4 slot ttl ms, 5 window limit
--       ('' = no window), 6 window ms, 7 the token's revocation field ('j:<jti>', or '-' for a token without an
--       id), 8 how many admissions (a batch whose admissions each came with a DPoP proof: '<count>:<ms to remember
--       each proof>'); then each admission's: op ('' | 'touch' | 'tap' |
--       'create'), session id, slot token, and on 'create' only: max sessions (0 = no cap), idle ttl ms, protocol
--       version, capabilities; then the slot tokens to release (earlier calls' ends, riding on this round trip).
-- A 'tap' is a touch by a replica that keeps the session's fixed fields (pv, caps) itself: it reads and returns
-- only what may change.
-- Reply: for each admission, a table (a lone admission's alone, not inside another) of nine values: {code, tokens
-- (millionths), wait_ms, pv, caps, lvl, slots, window_used, window_reset_ms (on code 6 only)}, or of six when pv,
-- caps and window_reset_ms are all empty (a tap, a request without a session): {code, tokens, wait_ms, lvl, slots,
-- window_used}; code 0 admitted, 1 bucket empty, 2 no such session, 3 session id taken, 4 session cap (slots = open
-- sessions), 5 slot cap, 6 window used up, 7 revoked (the principal, field '*' of the revocations, or this token:
-- each field's value is when the revocation ends, in ms; nothing is taken, the releases still apply), 8 the DPoP
-- proof was recorded before (a replay, through any replica: nothing is taken, the releases still apply).
--
-- This is the hot path: every tools/call runs it, and one Redis runs it for the whole fleet, one at a time, so it
-- is written for Redis's instruction count (issues 19 and 32, docs/BENCHMARKS.md). It writes only what changes: a
-- TTL is pushed out only when it would end too early, and then by more than is needed, so that the calls that
-- follow find it long enough and leave it alone. A key that outlives its need is harmless: an expired bucket and a
-- full one read the same, and stale slots and index members are skipped by their scores. Measured with callgrind,
-- not guessed: each argument costs Redis about 1k instructions (so a touch does not carry create's four), and Lua's
-- arithmetic operators, which also turn strings into numbers, are cheaper than math.* and tonumber calls. Numbers
-- go to redis.call as strings formatted here with %d: a Lua number argument costs Redis a %.17g. In a batch, what
-- the admissions share is read once and written once: the bucket, the slot count, the new leases (one ZADD) and
-- the releases (one ZREM).
local call = redis.call
local t = call('TIME')
local us = t[2] + 0
local now = t[1] * 1000 + (us - us % 1000) / 1000
local nows = string.format('%d', now)
-- The count is at most 32 (two characters); a longer ARGV[8] is '<count>:<ms>', a batch with DPoP proofs. (An
-- operator, not a function call, decides it: the hot path without proofs pays nothing for them.)
local m, proof = nil, nil
if #ARGV[8] > 2 then
  local c = string.find(ARGV[8], ':', 1, true)
  m, proof = string.sub(ARGV[8], 1, c - 1) + 0, string.sub(ARGV[8], c + 1)
else
  m = ARGV[8] + 0
end
-- The index, when there is one, is the fifth key: without proofs the session keys come in threes after it.
local idx, sk = nil, 5
if not proof and #KEYS % 3 == 2 then idx, sk = KEYS[5], 6 end
-- Where the releases start: after every admission's arguments (a create carries four more).
local first, n = 9, #ARGV
-- A revocation of the principal or of this token refuses every admission of the batch (one read: a key that is
-- almost always absent).
local rv = call('HMGET', KEYS[4], '*', ARGV[7])
local revoked = (rv[1] and rv[1] + 0 > now) or (rv[2] and rv[2] + 0 > now)
if proof then
  -- Each admission has its proof's key after its session's: the index is there when the keys outnumber those.
  local sessions = 0
  for _ = 1, m do
    if ARGV[first] ~= '' then sessions = sessions + 1 end
    if ARGV[first] == 'create' then first = first + 7 else first = first + 3 end
  end
  if #KEYS > 4 + 3 * sessions + m then idx, sk = KEYS[5], 6 end
else
  for _ = 1, m do
    if ARGV[first] == 'create' then first = first + 7 else first = first + 3 end
  end
end
local rel = first <= n
-- The replies, one table each; a lone admission's is returned as it is (a table less for Redis to make and send).
local out, one = nil, nil
if m > 1 then out = {} end
-- The bucket (read once): cap and rate in millionths, tokens after the admissions so far.
-- btok: the tokens left after the last admission that took one, formatted (what the bucket keeps).
local cap, rate, tokens, bx, full, btok = nil, nil, nil, nil, 0, nil
if ARGV[1] ~= '' then
  -- u: tokens in millionths (an integer), ts: last update (ms), x: when the key expires (ms).
  cap, rate = ARGV[1] * 1000000, ARGV[2] * 1000
  local b = call('HMGET', KEYS[1], 'u', 'ts', 'x')
  tokens = cap
  if b[1] then
    tokens = b[1] + 0
    local gap = now - b[2]
    if gap > 0 then
      local add = gap * rate
      tokens = tokens + add - add % 1
    end
  end
  if tokens > cap then tokens = cap end
  bx = b[3]
end
-- The slot set's count (read when first needed: the leases in it, those about to be released and any expired),
-- the new leases (nl of them, added in one ZADD at the end: the first token, then the others), and swept: the
-- releases applied and the expired leases dropped, which a batch does once, at the cap. (No table is made for
-- what a lone admission does not need: each costs Redis allocations.)
local scap, zc, nl, lease1, more, swept = nil, nil, 0, nil, nil, false
if ARGV[3] ~= '' then scap = ARGV[3] + 0 end
-- The window: wcount, its count with the batch's admissions so far (read by the first that reaches it); wpend, the
-- uses not written yet; wres, its end (ms) once a refusal read it.
local wcount, wpend, wres = nil, 0, nil
-- Each admission's session's new life (ms) when a touch or a create set it: the index outlives the longest.
local longest = 0
local a = 9
for j = 1, m do
  local op, sid, token = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local tok, wait, slots, wused, wend = '', 0, '', '', ''
  local pv, caps, lvl = '', '', ''
  -- This admission's session keys, if it names a session, and its proof's key, in a batch with proofs.
  local ks, pk = sk, nil
  if op ~= '' then sk = sk + 3 end
  if proof then pk, sk = sk, sk + 1 end
  local code = 0
  -- One pass (repeat ... until true, not indented): a refusal sets the code and leaves with break.
  repeat
  if revoked then
    code = 7
    break
  end
  -- A DPoP proof is recorded whatever comes next (one seen once is never accepted again), for as long as it could
  -- be accepted: its key is there already if any replica recorded it, or an admission before in this batch.
  if pk and not call('SET', KEYS[pk], '1', 'PX', proof, 'NX') then
    code = 8
    break
  end
  if cap then
    if tokens < 1000000 then
      -- Refused: nothing is written, so a flood does not push the refill back.
      local w = (1000000 - tokens) / rate
      if w % 1 > 0 then w = w - w % 1 + 1 end
      code, tok, wait = 1, string.format('%d', tokens), w
      break
    end
    tokens = tokens - 1000000
    full = (cap - tokens) / rate
    if full % 1 > 0 then full = full - full % 1 + 1 end
    tok, wait = string.format('%d', tokens), full
    btok = tok
  end

  -- A session lives for its idle TTL after its last request, and at most a sixteenth longer: its TTLs (and its
  -- score in the user's index) are pushed out to ttl + ttl/16 only once less than ttl is left.
  local indexed
  if op == 'tap' or op == 'touch' then
    local v
    if op == 'tap' then
      v = call('HMGET', KEYS[ks], 'ttl', 'lvl')
    else
      v = call('HMGET', KEYS[ks], 'ttl', 'lvl', 'pv', 'caps')
    end
    if not v[1] then
      code = 2
      break
    end
    local ttl = v[1] + 0
    if call('PTTL', KEYS[ks]) < ttl then
      local life = ttl + (ttl - ttl % 16) / 16
      local lifes = string.format('%d', life)
      call('PEXPIRE', KEYS[ks], lifes)
      call('PEXPIRE', KEYS[ks + 1], lifes)
      call('PEXPIRE', KEYS[ks + 2], lifes)
      indexed = life
    end
    lvl, pv, caps = v[2] or '', v[3] or '', v[4] or ''
  elseif op == 'create' then
    if call('EXISTS', KEYS[ks]) == 1 then
      code = 3
      break
    end
    local max = ARGV[a + 3] + 0
    if idx and max > 0 then
      -- The index's scores are the sessions' ends in whole seconds, rounded up (a smaller entry than in ms: 4
      -- bytes of an idle session's), so an entry goes at most 1 s after its session: never before.
      call('ZREMRANGEBYSCORE', idx, '-inf', t[1])
      local open = call('ZCARD', idx)
      if open >= max then
        code, slots = 4, open
        break
      end
    end
    local ttl = ARGV[a + 4] + 0
    local life = ttl + (ttl - ttl % 16) / 16
    -- Only what a request reads: the idle TTL, the protocol version and the capabilities (an idle session's
    -- bytes are mostly this hash: issue 32). `n` starts at 0 by being absent (open.lua's HINCRBY).
    call('HSET', KEYS[ks], 'ttl', ARGV[a + 4], 'pv', ARGV[a + 5], 'caps', ARGV[a + 6])
    call('PEXPIRE', KEYS[ks], string.format('%d', life))
    indexed = life
  end
  if indexed and idx then
    -- Its score is its end in whole seconds, rounded up (above); the index outlives its newest entry (below).
    local e = now + indexed + 999
    call('ZADD', idx, string.format('%d', (e - e % 1000) / 1000), sid)
    if indexed > longest then longest = indexed end
  end

  if scap then
    -- Counted cheaply (ZCARD), with the leases about to be released and any expired ones (a dead replica's) still
    -- in: that count is at least the live one, so below the cap it admits rightly. Only when it reaches the cap
    -- are the releases applied and the expired leases dropped, and the live ones counted.
    if not zc then zc = call('ZCARD', KEYS[2]) end
    slots = zc + nl
    if scap > 0 and slots >= scap and not swept then
      while rel and first <= n do
        local z = first + 999
        if z > n then z = n end
        call('ZREM', KEYS[2], unpack(ARGV, first, z))
        first = z + 1
      end
      rel, swept = false, true
      call('ZREMRANGEBYSCORE', KEYS[2], '-inf', nows)
      zc = call('ZCARD', KEYS[2])
      slots = zc + nl
    end
    if scap > 0 and slots >= scap then
      code = 5
      break
    end
  end
  if ARGV[5] ~= '' then
    -- The first admission to reach the window counts itself first and gives the use back if it went over: one
    -- command on the way that admits. The others count on its count, and their uses are written at the end (one
    -- INCRBY). The window's end is read only on a refusal, once, for Retry-After (one without a TTL, which nothing
    -- here makes, would get one there).
    local limit = ARGV[5] + 0
    if not wcount then
      wused = call('INCR', KEYS[3])
      if wused == 1 then call('PEXPIRE', KEYS[3], ARGV[6]) end
      wcount = wused
      if wused > limit then
        wcount = wused - 1
        if wused == 1 then
          call('DEL', KEYS[3])
          wres = 0
        else
          call('DECR', KEYS[3])
        end
      end
    elseif wcount < limit then
      wcount, wpend = wcount + 1, wpend + 1
      wused = wcount
    else
      wused = wcount + 1
    end
    if wused > limit then
      if not wres then
        wres = call('PTTL', KEYS[3])
        if wres < 0 then
          call('PEXPIRE', KEYS[3], ARGV[6])
          wres = ARGV[6] + 0
        end
      end
      code, wused, wend = 6, wused - 1, wres
      break
    end
  end
  if scap then
    -- Taken: added with the others at the end, before the releases, so the set never empties between two calls.
    nl = nl + 1
    if nl == 1 then
      lease1 = token
    else
      if not more then more = {} end
      more[nl - 1] = token
    end
    slots = slots + 1
  end
  until true
  -- Six values when the last three would be empty (a tap, a request without a session: most), else nine.
  if pv == '' and caps == '' and wend == '' then
    one = {code, tok, wait, lvl, slots, wused}
  else
    one = {code, tok, wait, pv, caps, lvl, slots, wused, wend}
  end
  if out then out[j] = one end
  if op == 'create' then a = a + 7 else a = a + 3 end
end

if wpend > 0 then call('INCRBY', KEYS[3], string.format('%d', wpend)) end
if btok then
  -- The bucket after the batch. The key must outlive the refill (an expired bucket reads full): it expires 1 to 2 s
  -- after the bucket is full, an eighth of the refill time later at most.
  if bx and bx - now >= full + 1000 then
    call('HSET', KEYS[1], 'u', btok, 'ts', nows)
  else
    local life = full + 2000 + (full - full % 8) / 8
    call('HSET', KEYS[1], 'u', btok, 'ts', nows, 'x', string.format('%d', now + life))
    call('PEXPIRE', KEYS[1], string.format('%d', life))
  end
end
if longest > 0 and call('PTTL', idx) < longest then call('PEXPIRE', idx, string.format('%d', longest)) end
if nl > 0 then
  -- The new leases first, then (below) the releases: the set never empties between two calls.
  local score = string.format('%d', now + ARGV[4])
  if nl == 1 then
    call('ZADD', KEYS[2], score, lease1)
  else
    local zargs = {score, lease1}
    for i = 1, nl - 1 do
      zargs[2 * i + 1], zargs[2 * i + 2] = score, more[i]
    end
    call('ZADD', KEYS[2], unpack(zargs))
  end
end
-- The releases not applied yet, in one place for every decision.
local released = 0
while rel and first <= n do
  local z = first + 999
  if z > n then z = n end
  released = released + call('ZREM', KEYS[2], unpack(ARGV, first, z))
  first = z + 1
end
if nl > 0 then
  -- A slot was taken: the admitted's counts are corrected by the releases, and the set outlives its newest lease.
  if released > 0 then
    for j = 1, m do
      local r = one
      if out then r = out[j] end
      if r[1] == 0 then
        -- The slot count is the fifth of six values, the seventh of nine.
        local k = 7
        if #r == 6 then k = 5 end
        r[k] = r[k] - released
      end
    end
  end
  local ttl = ARGV[4] + 0
  if call('PTTL', KEYS[2]) < ttl then call('PEXPIRE', KEYS[2], string.format('%d', 2 * ttl)) end
end
return out or one
