-- KEYS: session, events, leases, cancellations, doorbell, session index ; ARGV: session id
-- Returns 0 when there was no such session, else {how long it lasted in ms (-1 when its start is not recorded:
-- a session of a build before `at`), its protocol version}.
local r = redis.call('HMGET', KEYS[1], 'at', 'pv')
local n = redis.call('DEL', KEYS[1])
if n == 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4])
redis.call('ZREM', KEYS[6], ARGV[1])
redis.call('PUBLISH', KEYS[5], 'x')
local lasted = -1
if r[1] then
  local t = redis.call('TIME')
  lasted = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(r[1])
  if lasted < 0 then lasted = 0 end
end
return {lasted, r[2] or ''}
