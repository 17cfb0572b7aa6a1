-- Opens a stream and commits its priming event.
-- KEYS: session, events, leases, doorbell ; ARGV: kind ('post'|'get'), lease_ms, token, maxlen, request_id
local pttl = redis.call('PTTL', KEYS[1])
if pttl < 0 then return {0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local k
if ARGV[1] == 'get' then
  k = 0
  redis.call('HSET', KEYS[1], 'g', ARGV[3])
else
  k = redis.call('HINCRBY', KEYS[1], 'n', 1)
  redis.call('HSET', KEYS[1], 'rq:' .. k, ARGV[5])
end
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), k)
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[4], '*', 's', k, 'd', '')
redis.call('PEXPIRE', KEYS[2], pttl)
redis.call('PEXPIRE', KEYS[3], pttl)
if k == 0 then redis.call('PUBLISH', KEYS[4], 'g:' .. ARGV[3]) end
return {1, k, id}
