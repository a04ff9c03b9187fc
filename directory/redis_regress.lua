-- regress runs regressed (redis_lib.lua) after a reconnect that kept the
-- era key, for a node whose claims may not come soon enough to find it;
-- with force, it starts a new era at once: the node found an era older than
-- the one it knew (an old dump loaded after a wipe), whose cold-start stamp
-- would otherwise let placements through.
-- KEYS[1] the era key
-- ARGV: 1 prefix, 2 highest epoch this node read, 3 a new era value,
--       4 force ("1") or not ("0")
-- Returns {era ("" when missing), "1" when this call started it, else "0"}.
if ARGV[4] == '1' then
  rotate(ARGV[1], tonumber(ARGV[2]) or 0, ARGV[3])
  return { ARGV[3], '1' }
end
if regressed(ARGV[1], ARGV[2], ARGV[3]) then
  return { ARGV[3], '1' }
end
return { redis.call('GET', KEYS[1]) or '', '0' }
