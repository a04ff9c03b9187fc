-- winddown queues a control message for the live owner of an id (R-CM-1)
-- and, for a timed one, lists the placement in 'winddowns' to be freed at
-- the deadline (the sweep; the heartbeat reference: "seconds from now
-- until the placement is freed"), as "<epoch> <row>": the placement at
-- that epoch, which a re-registration reclaiming it keeps. A later
-- wind-down of the placement replaces its deadline; a revoke unlists it.
-- KEYS[1] placement key
-- ARGV: 1 prefix, 2 now, 3 message (16 hex id first), 4 queue expiry (ms),
-- 5 deadline (µs; "" revokes), 6 row "ns\0id", 7 the owner the caller
-- checked ("" for any).
-- Returns the owning session, or false when nothing live owns the id;
-- queues nothing when another session than ARGV[7] owns it.
local P, now = ARGV[1], tonumber(ARGV[2])
local cur = redis.call('GET', KEYS[1])
if not cur then
  return false
end
local sid, ep = owner(cur)
if lease(P, sid) <= now then
  return false
end
if ARGV[7] ~= '' and ARGV[7] ~= sid then
  return sid
end
local q = P .. 'q:' .. sid
redis.call('RPUSH', q, ARGV[3])
redis.call('PEXPIRE', q, ARGV[4])
if ARGV[5] ~= '' then
  redis.call('ZADD', P .. 'winddowns', ARGV[5], ep .. ' ' .. ARGV[6])
else
  redis.call('ZREM', P .. 'winddowns', ep .. ' ' .. ARGV[6])
end
return sid
