-- KEYS: session ; ARGV: idle_ttl_ms, protocol_version, client_capabilities, client_info
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'ttl', ARGV[1], 'pv', ARGV[2], 'caps', ARGV[3], 'info', ARGV[4], 'created', t[1], 'n', 0)
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
