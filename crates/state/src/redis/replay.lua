-- Reads the session log after a cursor, keeping one stream's entries.
-- KEYS: session, events ; ARGV: cursor, stream, check_stream ('1'|'0'), limit
-- {0} session gone, {3} cursor gone, {1, last_scanned, id, data, final, id, data, final, ...}
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local c = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #c == 0 then return {3} end
if ARGV[3] == '1' then
  local f = c[1][2]
  local s
  for i = 1, #f, 2 do if f[i] == 's' then s = f[i + 1] end end
  if s ~= ARGV[2] then return {3} end
end
local out = {1, ARGV[1]}
local batch = redis.call('XRANGE', KEYS[2], '(' .. ARGV[1], '+', 'COUNT', ARGV[4])
for _, e in ipairs(batch) do
  out[2] = e[1]
  local f = e[2]
  local s, d, fin = nil, '', '0'
  for i = 1, #f, 2 do
    if f[i] == 's' then s = f[i + 1] elseif f[i] == 'd' then d = f[i + 1] elseif f[i] == 'f' then fin = f[i + 1] end
  end
  if s == ARGV[2] then
    out[#out + 1] = e[1]
    out[#out + 1] = d
    out[#out + 1] = fin
  end
end
return out
