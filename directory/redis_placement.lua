-- placement reports who owns an id, live or not (read-only).
-- KEYS[1] placement key
-- ARGV: 1 prefix.
-- Returns {session, epoch, clientId, advertiseUrl, lease} or false.
local P = ARGV[1]
local cur = redis.call('GET', KEYS[1])
if not cur then
  return false
end
local sid, ep = owner(cur)
local s = redis.call('HMGET', P .. 's:' .. sid, 'cid', 'url')
return { sid, ep, s[1] or '', s[2] or '', fmt(lease(P, sid)) }
