-- Puts a task back in line for a new run (its replica died or handed it back): the next generation, queued. A task
-- whose client asked to cancel it is cancelled instead.
-- KEYS: record, work, open set ; ARGV: generation, task id
-- Reply: {0} refused (ended, or a newer run), {1, new generation}, {2} cancelled.
local v = redis.call('HMGET', KEYS[1], 'st', 'g', 'cx')
local st = v[1]
if not st or st == 'completed' or st == 'failed' or st == 'cancelled' or v[2] ~= ARGV[1] then return {0} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 2) == 'i:' then redis.call('HDEL', KEYS[1], f) end
end
if v[3] == '1' then
  redis.call('HSET', KEYS[1], 'st', 'cancelled', 'ut', now, 'ni', 0)
  redis.call('DEL', KEYS[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
  return {2}
end
local g = tonumber(v[2]) + 1
redis.call('HSET', KEYS[1], 'st', 'queued', 'g', g, 'own', '', 'ut', now, 'ni', 0)
return {1, g}
