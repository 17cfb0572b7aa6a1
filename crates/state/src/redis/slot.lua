-- Renews one leased slot of a capped set, or releases some.
-- KEYS: slot set ; ARGV: op ('renew' | 'release'), ttl ms, token...
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
if ARGV[1] == 'release' then
  -- Also drops the expired slots of replicas that died holding them.
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  for i = 3, #ARGV do redis.call('ZREM', KEYS[1], ARGV[i]) end
  return 1
end
local exp = redis.call('ZSCORE', KEYS[1], ARGV[3])
if not exp or tonumber(exp) <= now then return 0 end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[3])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], 2 * ttl) end
return 1
