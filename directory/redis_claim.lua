-- claim resolves or claims one id (R-PL-1..3, R-CS-1).
-- KEYS[1] placement key
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 row "ns\0id", 5 ns, 6 excluded session
--       ("" for none; "<sid> <epoch>": only its row at that epoch is
--       placed anew, a live row at another is returned), 7 request host (lower case, "" for none), 8 the
--       highest epoch the calling node read (0: none), 9.. the policy's
--       ranking, best first.
-- Returns {"owner", sid, epoch, lease} for a live owner, {"placed", sid,
-- epoch, lease, "1" when it replaced an earlier owner's row else "0"} for a
-- new placement, {"quarantine", stamp, "1" when this
-- call found the directory went back in time, else "0"}, {"unknown"} (no
-- live worker serves ns) or {"noeligible"}.
local P, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local row, ns, exclude, host = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local xep = ''
local xsp = string.find(exclude, ' ', 1, true)
if xsp then
  exclude, xep = string.sub(exclude, 1, xsp - 1), string.sub(exclude, xsp + 1)
end

local cur = redis.call('GET', KEYS[1])
if cur then
  local sid, ep = owner(cur)
  local l = lease(P, sid)
  if l > now and (sid ~= exclude or (xep ~= '' and ep ~= xep)) then
    return { 'owner', sid, ep, fmt(l) }
  end
end

-- A new placement after Redis went back in time would place lost ids a
-- second time: checked before anything is minted, since a mint raises the
-- counter past what any node read (regressed in redis_lib.lua).
local back = regressed(P, ARGV[8], ARGV[2] .. '-r' .. ARGV[8])

-- Cold start: the first placement attempt stamps the bucket and every
-- placement waits one lease from there, so workers that outlived a wipe
-- re-register and reclaim their ids before anything is placed twice.
local stamp = redis.call('GET', P .. 'stamp')
if not stamp then
  redis.call('SET', P .. 'stamp', ARGV[2])
  stamp = ARGV[2]
end
if now < tonumber(stamp) + ttl then
  return { 'quarantine', stamp, back and '1' or '0' }
end

-- When live workers bound to the request's host serve ns, only they are
-- candidates (R-LS-4).
local bound = false
if host ~= '' and tonumber(redis.call('HGET', P .. 'hb:' .. ns, host) or '0') > 0 then
  for _, sid in ipairs(redis.call('SMEMBERS', P .. 'n:' .. ns)) do
    if lease(P, sid) > now and string.lower(redis.call('HGET', P .. 's:' .. sid, 'host') or '') == host then
      bound = true
      break
    end
  end
end
local function candidate(sid)
  if bound and string.lower(redis.call('HGET', P .. 's:' .. sid, 'host') or '') ~= host then
    return false
  end
  return eligible(P, sid, ns, now, exclude)
end

-- The first ranked candidate that is still eligible wins.
local pick
for i = 9, #ARGV do
  if candidate(ARGV[i]) then
    pick = ARGV[i]
    break
  end
end

-- The node's view was stale (or empty): decide here, most headroom first
-- (ties: the lowest session id, not the set's order), and tell an unknown
-- namespace from one whose workers cannot take more.
if not pick then
  local live, best = false, -math.huge
  for _, sid in ipairs(redis.call('SMEMBERS', P .. 'n:' .. ns)) do
    if lease(P, sid) > now then
      live = true
      if candidate(sid) then
        local hr = tonumber(redis.call('HGET', P .. 'h:' .. sid, 'hr') or '0')
        if not pick or hr > best or (hr == best and sid < pick) then
          pick, best = sid, hr
        end
      end
    end
  end
  if not live then
    return { 'unknown' }
  end
  if not pick then
    return { 'noeligible' }
  end
end

local ep = setrow(P, row, pick, ARGV[2])
-- Each placement spends one unit until the next heartbeat replaces the
-- value (R-PL-3). In Lua's doubles, written back exactly ('%.17g'), as
-- the memory store's float64: HINCRBYFLOAT computes in long double, and
-- 1.1 less one was 0.1 here but 0.10000000000000009 there
-- (FractionalHeadroomDecrement_RPL3_RREG4).
local hk = P .. 'h:' .. pick
local hr = tonumber(redis.call('HGET', hk, 'hr') or '0') or 0
redis.call('HSET', hk, 'hr', string.format('%.17g', hr - 1))
return { 'placed', pick, ep, fmt(lease(P, pick)), cur and '1' or '0' }
