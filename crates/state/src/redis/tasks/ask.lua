-- A running task asks for input: the answer if tasks/update brought it, else the request becomes outstanding and
-- the task input_required.
-- KEYS: record, work ; ARGV: generation, input key, request (JSON)
-- Reply: {0} stop (cancel requested, ended, or a newer run), {1, answer}, {2} pending.
local v = redis.call('HMGET', KEYS[1], 'st', 'g', 'cx')
local st = v[1]
if not st or st == 'completed' or st == 'failed' or st == 'cancelled' or v[2] ~= ARGV[1] or v[3] == '1' then
  return {0}
end
local a = redis.call('HGET', KEYS[2], 'a:' .. ARGV[2])
if a then return {1, a} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('HSETNX', KEYS[1], 'i:' .. ARGV[2], ARGV[3]) == 1 then
  redis.call('HINCRBY', KEYS[1], 'ni', 1)
  redis.call('HSET', KEYS[1], 'ut', now)
end
if st ~= 'input_required' then redis.call('HSET', KEYS[1], 'st', 'input_required', 'ut', now) end
return {2}
