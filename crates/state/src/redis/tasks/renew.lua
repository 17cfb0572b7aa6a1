-- Renews the leases of the runs one replica holds, and returns the members it no longer holds (a sweeper took
-- them); or ('add') sets a new run's lease.
-- KEYS: leases ; ARGV: ttl ms, 'renew' | 'add', members...
local t = redis.call('TIME')
local until_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ARGV[1])
local lost = {}
for i = 3, #ARGV do
  if ARGV[2] == 'add' or redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], until_ms, ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
