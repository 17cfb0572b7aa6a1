-- Adds a queued task's entry to its shard's stream (creating the stream and its consumer group on first use), and
-- its lease, which the sweeper checks once it runs out.
-- Then it rings the shard's bell (a channel in the shard's slot), so that idle workers on every replica look at once.
-- KEYS: stream, leases, entries, bell ; ARGV: lease member, check ms, user, task id, generation, shard
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('EXISTS', KEYS[1]) == 0 then redis.call('XGROUP', 'CREATE', KEYS[1], 'w', '0', 'MKSTREAM') end
local id = redis.call('XADD', KEYS[1], '*', 'u', ARGV[3], 't', ARGV[4], 'g', ARGV[5])
redis.call('HSET', KEYS[3], ARGV[1], id)
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
redis.call('PUBLISH', KEYS[4], 'e:' .. ARGV[6])
return id
