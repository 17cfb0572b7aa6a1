-- Renews or releases one leased slot of a capped set.
-- KEYS: slot set ; ARGV: op ('renew' | 'release'), token, ttl ms
if ARGV[1] == 'release' then return redis.call('ZREM', KEYS[1], ARGV[2]) end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
local exp = redis.call('ZSCORE', KEYS[1], ARGV[2])
if not exp or tonumber(exp) <= now then return 0 end
local ttl = tonumber(ARGV[3])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[2])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
