-- Takes up to COUNT entries for a consumer: new ones, then entries a consumer took more than STALE ms ago and never
-- settled (its replica died between taking and starting them).
-- KEYS: stream ; ARGV: consumer, count, stale ms
-- Reply: flat {entry id, user, task id, generation, ...}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
local n = tonumber(ARGV[2])
local ok, r = pcall(redis.call, 'XREADGROUP', 'GROUP', 'w', ARGV[1], 'COUNT', n, 'STREAMS', KEYS[1], '>')
if not ok then
  -- A stream without its group (Redis lost it): make it again, and read from the start.
  redis.call('XGROUP', 'CREATE', KEYS[1], 'w', '0')
  r = redis.call('XREADGROUP', 'GROUP', 'w', ARGV[1], 'COUNT', n, 'STREAMS', KEYS[1], '>')
end
local out = {}
local function take(entries)
  for _, e in ipairs(entries) do
    local f, u, tk, g = e[2], '', '', ''
    if f then
      for i = 1, #f, 2 do
        if f[i] == 'u' then u = f[i + 1] elseif f[i] == 't' then tk = f[i + 1] elseif f[i] == 'g' then g = f[i + 1] end
      end
      out[#out + 1] = e[1]; out[#out + 1] = u; out[#out + 1] = tk; out[#out + 1] = g
    end
  end
end
if r and r[1] then take(r[1][2]) end
local got = #out / 4
if got < n then
  local c = redis.call('XAUTOCLAIM', KEYS[1], 'w', ARGV[1], ARGV[3], '0-0', 'COUNT', n - got)
  take(c[2])
end
return out
