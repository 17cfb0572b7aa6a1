-- Whether a live cancellation marker exists for this request.
-- KEYS: cancellations ; ARGV: request_id
local sc = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not sc then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if tonumber(sc) > now then return 1 end
return 0
