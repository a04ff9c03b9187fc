-- workers lists live sessions (R-REG-4; read-only).
-- KEYS[1] the lease index
-- ARGV: 1 prefix, 2 now.
-- Returns one info tuple (lib: info) per live session.
local P, now = ARGV[1], tonumber(ARGV[2])
local out = {}
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[2], '+inf')) do
  local i = info(P, sid)
  if i then
    out[#out + 1] = i
  end
end
return out
