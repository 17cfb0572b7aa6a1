-- Gives back one use of a fixed window (a call admitted, then refused before it ran).
-- KEYS: window
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n > 0 then redis.call('DECR', KEYS[1]) end
return 1
