-- Takes a delivered answer, once.
-- KEYS: session ; ARGV: request_id
local v = redis.call('HGET', KEYS[1], 'rsp:' .. ARGV[1])
if v then redis.call('HDEL', KEYS[1], 'rsp:' .. ARGV[1]) end
return v
