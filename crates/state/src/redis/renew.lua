-- Renews a stream's lease. A live stream is activity: it extends the session's idle TTL (and its log's, leases'
-- and entry in the user's session index, if it has one) too, so a session in use never expires under a running
-- call or an open GET stream. Its TTLs are pushed out as admit.lua's touch pushes them: to the idle TTL and a
-- sixteenth, and only once less than the idle TTL is left, so that most renewals write the lease alone (an open
-- stream's cost at rest is its renewals: issue 32).
-- KEYS: session, events, leases, session index ; ARGV: stream, lease_ms, token, session id, and optionally a log
-- position (ms-seq): then the reply says whether the log holds an entry after it (2) or not (1), so that a polling
-- holder reads the log only when it may have missed a ring (SessionStore::renew_and_peek). 0: not renewed.
local v = redis.call('HMGET', KEYS[1], 'ttl', 'g')
if not v[1] then return 0 end
if ARGV[1] == '0' and v[2] ~= ARGV[3] then return 0 end
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], 'XX', now + tonumber(ARGV[2]), ARGV[1])
local ttl = tonumber(v[1])
if redis.call('PTTL', KEYS[1]) < ttl then
  local life = ttl + math.floor(ttl / 16)
  redis.call('PEXPIRE', KEYS[1], life)
  redis.call('PEXPIRE', KEYS[2], life)
  redis.call('PEXPIRE', KEYS[3], life)
  -- The index entry only if the session has one (its owner's sessions are counted for a cap): XX adds nothing.
  -- Its score is the session's end in whole seconds, rounded up (admit.lua).
  local indexed = redis.call('ZADD', KEYS[4], 'XX', 'CH', math.ceil((now + life) / 1000), ARGV[4]) == 1
  if indexed and redis.call('PTTL', KEYS[4]) < life then redis.call('PEXPIRE', KEYS[4], life) end
end
if ARGV[5] and #redis.call('XRANGE', KEYS[2], '(' .. ARGV[5], '+', 'COUNT', 1) > 0 then return 2 end
return 1
