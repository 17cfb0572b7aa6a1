-- Creates a task record, unless the principal has too many open tasks. The record (R) holds what a poll reads;
-- the work hash (W) what a worker needs (arguments, capabilities, answers). Both expire with the task's TTL.
-- KEYS: record, work, open set ; ARGV: 1 cap (0 = none), 2 ttl ms, 3 poll ms, 4 tool, 5 args, 6 caps, 7 principal,
--       8 trace id, 9 rerunnable ('1'|'0'), 10 owner replica ('' = queued), 11 task id, 12.. answer key/value pairs
-- Reply: creation time (ms), 0 at the cap, -1 if the id is taken.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local cap = tonumber(ARGV[1])
if cap > 0 and redis.call('ZCARD', KEYS[3]) >= cap then return 0 end
if redis.call('EXISTS', KEYS[1]) == 1 then return -1 end
local ttl = tonumber(ARGV[2])
local st = 'working'
if ARGV[10] == '' then st = 'queued' end
redis.call('HSET', KEYS[1], 'st', st, 'g', 1, 'ct', now, 'ut', now, 'ttl', ttl, 'poll', ARGV[3], 'tool', ARGV[4],
  'tr', ARGV[8], 'rr', ARGV[9], 'own', ARGV[10], 'ni', 0)
redis.call('HSET', KEYS[2], 'args', ARGV[5], 'caps', ARGV[6], 'who', ARGV[7])
for i = 12, #ARGV, 2 do redis.call('HSET', KEYS[2], 'a:' .. ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIREAT', KEYS[1], now + ttl)
redis.call('PEXPIREAT', KEYS[2], now + ttl)
redis.call('ZADD', KEYS[3], now + ttl, ARGV[11])
if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
return now
