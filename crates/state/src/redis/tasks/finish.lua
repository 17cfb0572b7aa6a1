-- Ends a run: the record becomes terminal, unless it already is or a newer run holds it. Terminal records never
-- change: every script that writes one checks its status first. A run whose client asked to cancel it ends
-- cancelled, whatever it ended with: the cancellation came first.
-- KEYS: record, work, open set ; ARGV: generation, status, outcome ('' = none), message ('' = none), task id
-- Reply: {0} refused, or {1, the record's fields and values...}.
local v = redis.call('HMGET', KEYS[1], 'st', 'g', 'cx')
local st = v[1]
if not st or st == 'completed' or st == 'failed' or st == 'cancelled' or v[2] ~= ARGV[1] then return {0} end
local t = redis.call('TIME')
local status, outcome, message = ARGV[2], ARGV[3], ARGV[4]
if v[3] == '1' then status, outcome, message = 'cancelled', '', '' end
redis.call('HSET', KEYS[1], 'st', status, 'ut', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000), 'ni', 0)
if outcome ~= '' then redis.call('HSET', KEYS[1], 'out', outcome) end
if message ~= '' then redis.call('HSET', KEYS[1], 'msg', message) end
for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
  if string.sub(f, 1, 2) == 'i:' then redis.call('HDEL', KEYS[1], f) end
end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[5])
local out = {1}
for _, x in ipairs(redis.call('HGETALL', KEYS[1])) do out[#out + 1] = x end
return out
