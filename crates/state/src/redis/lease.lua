-- A lease of a tenant's shared window (LimitStore::lease_window): KEYS[1] the tenant's counter for one tool; ARGV[1]
-- how many uses are wanted, ARGV[2] the window's limit, ARGV[3] its length (ms). Grants what is left, at most what
-- is wanted, and counts it as used; the counter expires with its window. Returns {granted, ms until the window ends}.
local want, limit = tonumber(ARGV[1]), tonumber(ARGV[2])
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
local grant = math.min(want, limit - used)
if grant < 0 then grant = 0 end
if grant > 0 then
  local n = redis.call('INCRBY', KEYS[1], grant)
  if n == grant then redis.call('PEXPIRE', KEYS[1], ARGV[3]) end
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then ttl = tonumber(ARGV[3]) end
return {grant, ttl}
