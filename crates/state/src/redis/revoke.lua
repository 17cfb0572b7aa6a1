-- A revocation of a principal or one of its tokens (crate::revocation), in the principal's own hash, which
-- admit.lua reads: KEYS[1] `{u:<user>}:rv`; ARGV[1] the field ('*' or 'j:<jti>'), ARGV[2] when it ends (ms), or
-- '' to lift it. The hash lives as long as its longest revocation. Returns 1 if the field was set before.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local had = redis.call('HEXISTS', KEYS[1], ARGV[1])
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return had
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local life = tonumber(ARGV[2]) - now
if life > redis.call('PTTL', KEYS[1]) then redis.call('PEXPIRE', KEYS[1], math.max(life, 1)) end
return had
