-- Commits one event, then rings the doorbell.
-- KEYS: session, events, leases, doorbell ; ARGV: stream, data, final ('1'|'0'), maxlen, pending_request, lease_ms,
-- waiter traceparent (the pending request's value is '<stream>|<traceparent>'), seq ('' = none: the event's place
-- in its stream; the session keeps the last place written and its id in 'sq:<k>' and 'si:<k>' while the stream
-- runs, so that a repeat of an append, or a write that arrives after its writer gave up, adds no second copy)
-- Reply: {1, id} committed (or a repeat of the last event: its id); {0} no session; {2} stream finished;
-- {3} a later event of the stream is already committed.
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return {0} end
local k = ARGV[1]
if ARGV[8] ~= '' then
  local last = redis.call('HMGET', KEYS[1], 'sq:' .. k, 'si:' .. k)
  if last[1] then
    local seen, q = tonumber(last[1]), tonumber(ARGV[8])
    if seen == q then return {1, last[2]} end
    if seen > q then return {3} end
  end
end
if k ~= '0' and not redis.call('ZSCORE', KEYS[3], k) then return {2} end
local id
if ARGV[3] == '1' then
  id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 's', k, 'd', ARGV[2], 'f', '1')
  redis.call('ZREM', KEYS[3], k)
  redis.call('HDEL', KEYS[1], 'rq:' .. k, 'sq:' .. k, 'si:' .. k)
else
  id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 's', k, 'd', ARGV[2])
  if ARGV[8] ~= '' then redis.call('HSET', KEYS[1], 'sq:' .. k, ARGV[8], 'si:' .. k, id) end
  if k ~= '0' and ARGV[6] ~= '' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    redis.call('ZADD', KEYS[3], 'XX', now + tonumber(ARGV[6]), k)
  end
end
if ARGV[5] ~= '' then redis.call('HSET', KEYS[1], 'pq:' .. ARGV[5], k .. '|' .. ARGV[7]) end
redis.call('PEXPIRE', KEYS[2], pttl)
redis.call('PEXPIRE', KEYS[3], pttl)
redis.call('PUBLISH', KEYS[4], 'e:' .. k)
return {1, id}
