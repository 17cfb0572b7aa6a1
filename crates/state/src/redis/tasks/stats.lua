-- A queue shard, for the metrics: entries in the stream, entries taken and not settled, leases, and the id of the
-- oldest entry no worker has taken yet ('' if none).
-- KEYS: stream, leases
local leased = redis.call('ZCARD', KEYS[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return {0, 0, leased, ''} end
local len = redis.call('XLEN', KEYS[1])
local ok, p = pcall(redis.call, 'XPENDING', KEYS[1], 'w')
local pending = 0
if ok then pending = p[1] end
local last = nil
local ok2, groups = pcall(redis.call, 'XINFO', 'GROUPS', KEYS[1])
if ok2 then
  for _, g in ipairs(groups) do
    local name, ldid = nil, nil
    for i = 1, #g, 2 do
      if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then ldid = g[i + 1] end
    end
    if name == 'w' then last = ldid end
  end
end
local oldest = ''
if last then
  local first = redis.call('XRANGE', KEYS[1], '(' .. last, '+', 'COUNT', 1)
  if first[1] then oldest = first[1][1] end
end
return {len, pending, leased, oldest}
