-- Shared helpers, prepended to every directory script (redis_scripts.go).
-- Every key lives under one hash tag, so each script touches one slot
-- (docs/DIRECTORY.md). ARGV[1] is always the key prefix "{tag}:".
--
-- Times are integer microseconds since the Unix epoch, passed in by the
-- caller's clock. Lua numbers are doubles: exact for integers below 2^53
-- (year 2255 in microseconds), but tostring() and ".." print them with 14
-- significant digits, so every number written back goes through fmt().

local function fmt(x)
  return string.format('%.0f', x)
end

-- lease returns a session's lease expiry, 0 when the session is gone.
local function lease(P, sid)
  return tonumber(redis.call('GET', P .. 'l:' .. sid) or '0')
end

-- owner splits a placement row value "<sessionId> <epoch>".
local function owner(v)
  local sp = string.find(v, ' ', 1, true)
  return string.sub(v, 1, sp - 1), string.sub(v, sp + 1)
end

-- rowkey is the placement key of a row name "ns\0id".
local function rowkey(P, row)
  return P .. 'p:' .. row
end

-- mint returns the next placement epoch. A missing counter (first use, or
-- after a wipe) is seeded at now, so epochs never regress across a
-- FLUSHALL: workers fence on them (pinned hosting/_fencing.py). INCR keeps
-- the counter out of client tracking (no read-only command touches it).
local function mint(P, now)
  local e = redis.call('INCR', P .. 'epoch')
  if e == 1 then
    redis.call('SET', P .. 'epoch', now)
    e = redis.call('INCR', P .. 'epoch')
  end
  return fmt(e)
end

-- eligible: live, serving ns, not draining by its own flag or an operator
-- drain of its client id, not degraded, not excluded (R-PL-1, R-LS-3).
local function eligible(P, sid, ns, now, exclude)
  if sid == exclude or sid == '' then
    return false
  end
  if lease(P, sid) <= now then
    return false
  end
  if redis.call('SISMEMBER', P .. 'n:' .. ns, sid) == 0 then
    return false
  end
  local h = redis.call('HMGET', P .. 'h:' .. sid, 'dr', 'dg')
  if h[1] == '1' or (h[2] and h[2] ~= '0') then
    return false
  end
  local cid = redis.call('HGET', P .. 's:' .. sid, 'cid')
  if not cid or redis.call('EXISTS', P .. 'd:' .. cid) == 1 then
    return false
  end
  return true
end

-- setrow points a row at sid with a fresh epoch and moves it between the
-- sessions' row sets.
local function setrow(P, row, sid, now)
  local key = rowkey(P, row)
  local cur = redis.call('GET', key)
  if cur then
    local old = owner(cur)
    if old ~= sid then
      redis.call('SREM', P .. 'r:' .. old, row)
    end
  end
  local ep = mint(P, now)
  redis.call('SET', key, sid .. ' ' .. ep)
  redis.call('SADD', P .. 'r:' .. sid, row)
  return ep
end

-- droprows deletes every row still pointing at sid and returns their names.
local function droprows(P, sid, out)
  local rs = P .. 'r:' .. sid
  for _, row in ipairs(redis.call('SMEMBERS', rs)) do
    local key = rowkey(P, row)
    local v = redis.call('GET', key)
    if v and owner(v) == sid then
      redis.call('DEL', key)
      out[#out + 1] = row
    end
  end
  redis.call('DEL', rs)
  return out
end

-- dropsession removes a session, its rows and its indexes.
local function dropsession(P, sid, out)
  droprows(P, sid, out)
  local s = redis.call('HMGET', P .. 's:' .. sid, 'cid', 'ns')
  if s[2] then
    for ns in string.gmatch(s[2], '%S+') do
      redis.call('SREM', P .. 'n:' .. ns, sid)
    end
  end
  if s[1] then
    redis.call('SREM', P .. 'k:' .. s[1], sid)
  end
  redis.call('DEL', P .. 's:' .. sid, P .. 'l:' .. sid, P .. 'h:' .. sid, P .. 'q:' .. sid)
  redis.call('ZREM', P .. 'leases', sid)
  return out
end

-- caplease applies a timed drain: the lease never runs past the drain
-- deadline plus one lease (R-LS-5). dl is 0 for an untimed drain.
local function caplease(l, dl, ttl)
  if dl > 0 and l > dl + ttl then
    return dl + ttl
  end
  return l
end

-- setlease writes a lease and its sweep index.
local function setlease(P, sid, l)
  redis.call('SET', P .. 'l:' .. sid, fmt(l))
  redis.call('ZADD', P .. 'leases', fmt(l), sid)
end

-- info is a session as the registry sees it (decodeInfo in redis_decode.go
-- reads the same order), or nil when the record is gone.
local function info(P, sid)
  local s = redis.call('HMGET', P .. 's:' .. sid, 'cid', 'sub', 'sec', 'url', 'ns', 'host', 'env', 'rep', 'reg')
  if not s[1] then
    return nil
  end
  local h = redis.call('HMGET', P .. 'h:' .. sid, 'hr', 'dr', 'dg')
  local d = redis.call('HMGET', P .. 'd:' .. s[1], 'dl')
  local out = { sid }
  for i = 1, 9 do
    out[#out + 1] = s[i] or ''
  end
  out[#out + 1] = fmt(lease(P, sid))
  out[#out + 1] = h[1] or '0'
  out[#out + 1] = h[2] or '0'
  out[#out + 1] = h[3] or '0'
  out[#out + 1] = tostring(redis.call('SCARD', P .. 'r:' .. sid))
  out[#out + 1] = d[1] and '1' or '0'
  out[#out + 1] = d[1] or '0'
  return out
end
