-- Commits the final event of a stream whose lease expired. Exactly one caller wins.
-- KEYS: session, events, leases, doorbell ; ARGV: stream, data, maxlen
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return {0} end
local sc = redis.call('ZSCORE', KEYS[3], ARGV[1])
if not sc then return {2} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(sc) > now then return {2} end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', 's', ARGV[1], 'd', ARGV[2], 'f', '1')
redis.call('PEXPIRE', KEYS[2], pttl)
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[1], 'rq:' .. ARGV[1], 'sq:' .. ARGV[1], 'si:' .. ARGV[1])
redis.call('PUBLISH', KEYS[4], 'e:' .. ARGV[1])
return {1, id}
