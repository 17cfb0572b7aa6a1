-- KEYS: session, response, doorbell ; ARGV: request_id, message, ttl_ms
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], 'pq:' .. ARGV[1]) == 0 then return 2 end
redis.call('HDEL', KEYS[1], 'pq:' .. ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('PUBLISH', KEYS[3], 'r:' .. ARGV[1])
return 1
