-- KEYS: session, leases ; ARGV: stream
-- {0} session gone, {1} finished, {2} running, {3, request_id} abandoned
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local sc = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not sc then return {1} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(sc) > now then return {2} end
return {3, redis.call('HGET', KEYS[1], 'rq:' .. ARGV[1]) or ''}
