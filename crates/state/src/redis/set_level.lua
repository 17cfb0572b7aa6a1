-- KEYS: session ; ARGV: level
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'lvl', ARGV[1])
return 1
