-- The hot path: one call checks ownership (the user is in the key name) and extends the idle TTL of the session,
-- its event log and its leases.
-- KEYS: session, events, leases
local v = redis.call('HMGET', KEYS[1], 'ttl', 'pv', 'caps', 'lvl')
if not v[1] then return false end
redis.call('PEXPIRE', KEYS[1], v[1])
redis.call('PEXPIRE', KEYS[2], v[1])
redis.call('PEXPIRE', KEYS[3], v[1])
return {v[2], v[3], v[4] or ''}
