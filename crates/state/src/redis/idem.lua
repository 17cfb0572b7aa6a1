-- An idempotency record. KEYS[1]: the record (hash: d digest, s "run"/"done", t runner token, r result).
-- ARGV[1]: op. claim: ARGV[2] digest, ARGV[3] token, ARGV[4] lease ms -> {"run"} | {"done", r} | {"running"} | {"mismatch"}
-- renew: ARGV[2] token, ARGV[3] lease ms -> 1 | 0. complete: ARGV[2] token, ARGV[3] result, ARGV[4] ttl ms -> 1 | 0.
-- release: ARGV[2] token -> 1 | 0.
local k = KEYS[1]
local op = ARGV[1]
if op == 'claim' then
  local cur = redis.call('HMGET', k, 'd', 's', 'r')
  if not cur[1] then
    redis.call('HSET', k, 'd', ARGV[2], 's', 'run', 't', ARGV[3])
    redis.call('PEXPIRE', k, ARGV[4])
    return {'run'}
  end
  if cur[1] ~= ARGV[2] then return {'mismatch'} end
  if cur[2] == 'done' then return {'done', cur[3]} end
  return {'running'}
end
local s = redis.call('HMGET', k, 's', 't')
if s[1] ~= 'run' or s[2] ~= ARGV[2] then return 0 end
if op == 'renew' then
  redis.call('PEXPIRE', k, ARGV[3])
elseif op == 'complete' then
  redis.call('HSET', k, 's', 'done', 'r', ARGV[3])
  redis.call('HDEL', k, 't')
  redis.call('PEXPIRE', k, ARGV[4])
elseif op == 'release' then
  redis.call('DEL', k)
end
return 1
