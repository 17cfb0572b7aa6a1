-- A replica's membership record (fleet membership, off the request path): KEYS[1] the fleet's members zset;
-- ARGV[1] the replica's id, ARGV[2] the record's TTL in ms. Scores are expiry times on the Redis clock. Returns how
-- many replicas have a live record, this one included.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if ttl > 0 then
  redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
  -- The key outlives its newest record; a leaving replica (ttl 0) leaves the others' expiry alone.
  redis.call('PEXPIRE', KEYS[1], ttl * 2)
else
  redis.call('ZREM', KEYS[1], ARGV[1])
end
return redis.call('ZCARD', KEYS[1])
