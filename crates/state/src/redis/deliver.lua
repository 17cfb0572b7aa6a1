-- Stores a client's answer to a pending server→client request in the session hash and wakes the waiter.
-- KEYS: session, doorbell ; ARGV: request_id, message
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local pending = redis.call('HGET', KEYS[1], 'pq:' .. ARGV[1])
if not pending then return {2} end
redis.call('HDEL', KEYS[1], 'pq:' .. ARGV[1])
redis.call('HSET', KEYS[1], 'rsp:' .. ARGV[1], ARGV[2])
redis.call('PUBLISH', KEYS[2], 'r:' .. ARGV[1])
-- The waiter's traceparent, after the stream number.
return {1, string.match(pending, '|(.*)$') or ''}
