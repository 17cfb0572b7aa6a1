-- Removes consumers of the queue's group that hold no entry: this replica's own when it leaves ('' if not), and
-- any idle longer than IDLE ms (replicas long gone). A consumer holding entries stays: its entries would be lost.
-- KEYS: stream ; ARGV: leaving consumer ('' = none), idle ms
-- Reply: consumers removed.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local ok, consumers = pcall(redis.call, 'XINFO', 'CONSUMERS', KEYS[1], 'w')
if not ok then return 0 end
local removed = 0
for _, c in ipairs(consumers) do
  local name, pending, idle = nil, 0, 0
  for i = 1, #c, 2 do
    if c[i] == 'name' then name = c[i + 1]
    elseif c[i] == 'pending' then pending = tonumber(c[i + 1])
    elseif c[i] == 'idle' then idle = tonumber(c[i + 1]) end
  end
  if name and pending == 0 and (name == ARGV[1] or idle > tonumber(ARGV[2])) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], 'w', name)
    removed = removed + 1
  end
end
return removed
