-- register creates a session (R-REG-1) and reclaims the rows the worker
-- still hosts; rows another live session owns come back as duplicates.
-- KEYS[1] the new session's record
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 session, 5 clientId, 6 sub, 7 secret,
--       8 advertiseUrl, 9 namespaces (space separated), 10 hostname,
--       11 env, 12 registration epoch, 13 headroom, 14 draining (0/1),
--       15 previous session ("" for none), 16.. instance rows "ns\0id".
-- Returns {lease, draining (0/1), drain deadline (0: untimed), duplicates,
-- reclaimed rows, rows freed with the previous session, previous dropped
-- (0/1)}.
local P, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local sid, cid, sub, prev = ARGV[4], ARGV[5], ARGV[6], ARGV[15]

-- Process continuity: the previous session of the same client and account
-- hands its rows over; whatever it held that the worker no longer lists is
-- freed with it.
local prevok = false
if prev ~= '' then
  local p = redis.call('HMGET', P .. 's:' .. prev, 'cid', 'sub')
  prevok = p[1] == cid and p[2] == sub
end

redis.call('HSET', KEYS[1], 'cid', cid, 'sub', sub, 'sec', ARGV[7], 'url', ARGV[8],
  'ns', ARGV[9], 'host', ARGV[10], 'env', ARGV[11], 'rep', ARGV[12], 'reg', ARGV[2])
redis.call('HSET', P .. 'h:' .. sid, 'hr', ARGV[13], 'dr', ARGV[14], 'dg', '0')
local serves = {}
for ns in string.gmatch(ARGV[9], '%S+') do
  serves[ns] = true
  redis.call('SADD', P .. 'n:' .. ns, sid)
end
redis.call('SADD', P .. 'k:' .. cid, sid)

local dups, written = {}, {}
for i = 16, #ARGV do
  local row = ARGV[i]
  local ns = string.sub(row, 1, string.find(row, '\0', 1, true) - 1)
  local taken = false
  local cur = redis.call('GET', rowkey(P, row))
  if cur then
    local osid = owner(cur)
    taken = lease(P, osid) > now and not (prevok and osid == prev)
  end
  if not serves[ns] or taken then
    dups[#dups + 1] = row
  else
    setrow(P, row, sid, ARGV[2])
    written[#written + 1] = row
  end
end

local freed = {}
if prevok then
  dropsession(P, prev, freed)
end

local l, draining, dl = now + ttl, '0', '0'
local d = P .. 'd:' .. cid
if redis.call('EXISTS', d) == 1 then
  draining = '1'
  dl = redis.call('HGET', d, 'dl') or '0'
  redis.call('HSET', d, 'seen', ARGV[2])
  l = caplease(l, tonumber(dl), ttl)
end
setlease(P, sid, l)
return { fmt(l), draining, dl, dups, written, freed, prevok and '1' or '0' }
