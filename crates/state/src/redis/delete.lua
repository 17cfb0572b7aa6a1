-- KEYS: session, events, leases, cancellations, doorbell, session index ; ARGV: session id
-- Returns 0 when there was no such session, else {1, its protocol version}.
local pv = redis.call('HGET', KEYS[1], 'pv')
local n = redis.call('DEL', KEYS[1])
if n == 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('PUBLISH', KEYS[5], 'x')
return {1, pv or ''}
