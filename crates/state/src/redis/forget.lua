-- Stops waiting for a server→client request: a later answer is refused, an unread one dropped.
-- KEYS: session ; ARGV: request_id
return redis.call('HDEL', KEYS[1], 'pq:' .. ARGV[1], 'rsp:' .. ARGV[1])
