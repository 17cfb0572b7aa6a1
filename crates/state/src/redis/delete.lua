-- KEYS: session, events, leases, cancellations, doorbell, session index ; ARGV: session id
local n = redis.call('DEL', KEYS[1])
if n == 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('PUBLISH', KEYS[5], 'x')
return 1
