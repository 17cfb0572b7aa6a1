-- The fleet's registry of revocations and its announcement (crate::revocation): KEYS[1] `{fleet}:revoked`, KEYS[2]
-- the fleet's notice channel (same slot); ARGV[1] the registry field (`<user>` or `<user>:<field>`), ARGV[2] the
-- record (JSON), or '' to remove it, ARGV[3] the user. Rings `revoke:<user>`.
if ARGV[2] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
redis.call('PUBLISH', KEYS[2], 'n:revoke:' .. ARGV[3])
return 1
