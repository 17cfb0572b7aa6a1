-- A replica's membership record (fleet membership, off the request path): KEYS[1] the fleet's members zset,
-- KEYS[2] the fleet's layout hash (each member's declaration of the Redis layout it writes and reads: see
-- crate::layout); ARGV[1] the replica's id, ARGV[2] the record's TTL in ms, ARGV[3] its declaration. Scores are
-- expiry times on the Redis clock. Returns how many replicas have a live record, this one included.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  -- The keys outlive their newest record; a leaving replica (ttl 0) leaves the others' expiry alone.
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ttl * 2)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
end
-- A declaration whose record is gone (expired, or removed by a build without declarations) goes too: a few
-- fields, every few seconds, off the request path.
for _, id in ipairs(redis.call('HKEYS', KEYS[2])) do
  if not redis.call('ZSCORE', KEYS[1], id) then redis.call('HDEL', KEYS[2], id) end
end
return redis.call('ZCARD', KEYS[1])
