-- regress detects a directory that went back in time while keeping its era
-- key: a restart that loaded an older snapshot, or a promoted replica that
-- lagged. The placements made since are lost, and their workers still hold
-- the instances, so the id must not be placed anew before they
-- re-register: exactly the cold start's case (R-CS-1). A node that saw a
-- placement epoch above the epoch counter (which only grows otherwise)
-- starts a new era and clears the cold-start stamp: every node then
-- handles the directory as wiped, and the next placement attempt starts
-- the quarantine. The counter is raised to what the node saw, so the
-- other nodes' checks do not start yet another era.
-- KEYS[1] the era key
-- ARGV: 1 prefix, 2 highest epoch this node saw, 3 a new era value
-- Returns {era, "1" when this call started it, else "0"}.
local P, seen = ARGV[1], tonumber(ARGV[2])
local c = tonumber(redis.call('GET', P .. 'epoch') or '0')
local era = redis.call('GET', KEYS[1])
if c >= seen and era then
  return { era, '0' }
end
if c < seen then
  redis.call('SET', P .. 'epoch', fmt(seen))
end
redis.call('SET', KEYS[1], ARGV[3])
redis.call('DEL', P .. 'stamp')
return { ARGV[3], '1' }
