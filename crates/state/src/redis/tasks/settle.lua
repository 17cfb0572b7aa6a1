-- Removes a taken entry from its stream and sets its task's lease: the worker's ('lease'), none ('release'), or
-- unchanged ('keep').
-- KEYS: stream, leases, entries ; ARGV: entry id, lease member, mode, ttl ms
redis.call('XACK', KEYS[1], 'w', ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
if redis.call('HGET', KEYS[3], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[3], ARGV[2]) end
if ARGV[3] == 'lease' then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[4]), ARGV[2])
elseif ARGV[3] == 'release' then
  redis.call('ZREM', KEYS[2], ARGV[2])
end
return 1
