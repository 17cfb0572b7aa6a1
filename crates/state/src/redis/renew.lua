-- KEYS: session, leases ; ARGV: stream, lease_ms, token
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[1] == '0' and redis.call('HGET', KEYS[1], 'g') ~= ARGV[3] then return 0 end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[2], 'XX', now + tonumber(ARGV[2]), ARGV[1])
return 1
