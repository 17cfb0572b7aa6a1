-- Records a cancellation for `ttl_ms` in the session's marker set, and rings it to whichever replica runs the
-- request. The set lives no longer than its session and goes with it on DELETE.
-- KEYS: session, cancellations, doorbell ; ARGV: request_id, ttl_ms
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PEXPIRE', KEYS[2], pttl)
redis.call('PUBLISH', KEYS[3], 'c:' .. ARGV[1])
return 1
