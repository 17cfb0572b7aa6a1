-- tasks/cancel: a queued task is cancelled at once; a running one gets a flag its runner reads.
-- KEYS: record, work, open set ; ARGV: task id
-- Reply: -1 no such task, 0 already ended, 1 cancelled, 2 requested.
local st = redis.call('HGET', KEYS[1], 'st')
if not st then return -1 end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if st == 'queued' then
  redis.call('HSET', KEYS[1], 'st', 'cancelled', 'ut', now)
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[3], ARGV[1])
  return 1
end
redis.call('HSET', KEYS[1], 'cx', '1')
return 2
