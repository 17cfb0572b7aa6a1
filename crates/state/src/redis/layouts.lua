-- The live replicas' declarations of the Redis layout (crate::layout), read once by a replica before it serves:
-- KEYS[1] the fleet's members zset, KEYS[2] the fleet's layout hash. One value per live record, in no order;
-- false (a nil reply) for a replica that records none (a build from before declarations).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local live = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
if #live == 0 then return {} end
return redis.call('HMGET', KEYS[2], unpack(live))
