-- The leases a sweeper must handle: run out, and not a queued task whose entry still waits in the stream (that
-- one is waiting its turn: its lease is extended). Each returned lease is held for GRACE ms by the caller, so that
-- one sweeper handles it; it releases it (or enqueue re-leases it) when done.
-- KEYS: stream, leases, entries ; ARGV: grace ms, limit
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local grace, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local out = {}
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, limit * 4)) do
  redis.call('ZADD', KEYS[2], now + grace, m)
  local waiting = false
  local id = redis.call('HGET', KEYS[3], m)
  if id then
    if #redis.call('XRANGE', KEYS[1], id, id) > 0 then waiting = true else redis.call('HDEL', KEYS[3], m) end
  end
  if not waiting then
    out[#out + 1] = m
    if #out >= limit then break end
  end
end
return out
