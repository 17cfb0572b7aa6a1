-- KEYS: session, cancel_marker, doorbell ; ARGV: request_id, ttl_ms
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('SET', KEYS[2], '1', 'PX', ARGV[2])
redis.call('PUBLISH', KEYS[3], 'c:' .. ARGV[1])
return 1
