-- A worker starts a queued task it took from the queue, if the entry's generation is still the task's.
-- KEYS: record, work ; ARGV: generation, replica
-- Reply: {0} stale, or {1, tool, trace id, rerunnable, args, caps, principal, answer key/value pairs...}.
local v = redis.call('HMGET', KEYS[1], 'st', 'g', 'tool', 'tr', 'rr')
if v[1] ~= 'queued' or v[2] ~= ARGV[1] then return {0} end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'st', 'working', 'own', ARGV[2],
  'ut', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local w = redis.call('HGETALL', KEYS[2])
local out = {1, v[3], v[4], v[5], '', '{}', ''}
for i = 1, #w, 2 do
  local f = w[i]
  if f == 'args' then out[5] = w[i + 1]
  elseif f == 'caps' then out[6] = w[i + 1]
  elseif f == 'who' then out[7] = w[i + 1]
  elseif string.sub(f, 1, 2) == 'a:' then
    out[#out + 1] = string.sub(f, 3)
    out[#out + 1] = w[i + 1]
  end
end
return out
