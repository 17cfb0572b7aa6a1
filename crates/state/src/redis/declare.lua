-- A replica's declaration of one fact about itself that the fleet compares (the skill set's digest), off the
-- request path: KEYS[1] the fact's zset of live declarers, KEYS[2] its hash of values; ARGV[1] the replica's id,
-- ARGV[2] the declaration's TTL in ms (0 withdraws it), ARGV[3] the value. Scores are expiry times on the Redis
-- clock. Returns every live declarer's value, this one's included, in no order.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
  redis.call('PEXPIRE', KEYS[2], ttl * 2)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
local live = redis.call('ZRANGE', KEYS[1], 0, -1)
for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not redis.call('ZSCORE', KEYS[1], id) then redis.call('HDEL', KEYS[2], id) end
end
if #live == 0 then return {} end
return redis.call('HMGET', KEYS[2], unpack(live))
