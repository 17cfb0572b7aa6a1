-- Stores a version of the fleet's policy and announces it (crate::policy): KEYS[1] the policy hash, KEYS[2] the
-- fleet's notice channel (same slot); ARGV[1] the version the applier compared against (0: none), ARGV[2] the new
-- version's number (0: ARGV[1] + 1), ARGV[3] the document, ARGV[4] who, ARGV[5] the summary. Returns {1, version}
-- when stored, {0, current} when another version is in force than the one compared against.
local cur = tonumber(redis.call('HGET', KEYS[1], 'v') or '0')
if cur ~= tonumber(ARGV[1]) then return {0, cur} end
local v = tonumber(ARGV[2])
if v == 0 then v = cur + 1 end
if v <= cur then return {0, cur} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'v', v, 'doc', ARGV[3], 'by', ARGV[4], 'at', now, 'sum', ARGV[5])
redis.call('PUBLISH', KEYS[2], 'n:policy:' .. v)
return {1, v}
