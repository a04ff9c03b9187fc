-- regress runs regressed (redis_lib.lua) after a reconnect that kept the
-- era key, for a node whose claims may not come soon enough to find it.
-- KEYS[1] the era key
-- ARGV: 1 prefix, 2 highest epoch this node read, 3 a new era value
-- Returns {era ("" when missing), "1" when this call started it, else "0"}.
if regressed(ARGV[1], ARGV[2], ARGV[3]) then
  return { ARGV[3], '1' }
end
return { redis.call('GET', KEYS[1]) or '', '0' }
