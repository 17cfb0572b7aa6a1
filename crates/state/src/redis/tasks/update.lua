-- tasks/update: takes the answers whose keys are outstanding, ignores the others; the last one resumes the task.
-- KEYS: record, work ; ARGV: key/value pairs
-- Reply: {-1} no such task, else {accepted, resumed (0|1)}.
local st = redis.call('HGET', KEYS[1], 'st')
if not st then return {-1} end
if st == 'completed' or st == 'failed' or st == 'cancelled' then return {0, 0} end
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HDEL', KEYS[1], 'i:' .. ARGV[i]) == 1 then
    redis.call('HSET', KEYS[2], 'a:' .. ARGV[i], ARGV[i + 1])
    n = n + 1
  end
end
local resumed = 0
if n > 0 then
  local t = redis.call('TIME')
  local left = redis.call('HINCRBY', KEYS[1], 'ni', -n)
  redis.call('HSET', KEYS[1], 'ut', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  if left <= 0 and st == 'input_required' then
    redis.call('HSET', KEYS[1], 'st', 'working', 'ni', 0)
    resumed = 1
  end
end
return {n, resumed}
