-- Stores a client's answer to a pending server→client request in the session hash and wakes the waiter.
-- KEYS: session, doorbell ; ARGV: request_id, message
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'pq:' .. ARGV[1]) == 0 then return 2 end
redis.call('HDEL', KEYS[1], 'pq:' .. ARGV[1])
redis.call('HSET', KEYS[1], 'rsp:' .. ARGV[1], ARGV[2])
redis.call('PUBLISH', KEYS[2], 'r:' .. ARGV[1])
return 1
