-- winddown queues a control message for the live owner of an id (R-CM-1).
-- KEYS[1] placement key
-- ARGV: 1 prefix, 2 now, 3 message (16 hex id first), 4 queue expiry (ms).
-- Returns the owning session, or false when nothing live owns the id.
local P, now = ARGV[1], tonumber(ARGV[2])
local cur = redis.call('GET', KEYS[1])
if not cur then
  return false
end
local sid = owner(cur)
if lease(P, sid) <= now then
  return false
end
local q = P .. 'q:' .. sid
redis.call('RPUSH', q, ARGV[3])
redis.call('PEXPIRE', q, ARGV[4])
return sid
