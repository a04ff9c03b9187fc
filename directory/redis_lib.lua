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

-- mint returns the next placement epoch: the counter plus one, but never
-- at or below now (µs). Epochs never regress, whatever happened to the
-- counter — a first use, a FLUSHALL, a restore from an older snapshot or a
-- promoted lagging replica: workers fence on them (pinned
-- hosting/_fencing.py). INCR keeps the counter out of client tracking (no
-- read-only command touches it).
local function mint(P, now)
  now = tonumber(now)
  local e = redis.call('INCR', P .. 'epoch')
  if e <= now then
    e = now + 1
    redis.call('SET', P .. 'epoch', fmt(e))
  end
  return fmt(e)
end

-- rotate starts a new era: the epoch counter raised to seen (so other
-- nodes' checks find nothing more), the era key set, the cold-start stamp
-- cleared (the next placement attempt starts the quarantine).
local function rotate(P, seen, era)
  if tonumber(redis.call('GET', P .. 'epoch') or '0') < seen then
    redis.call('SET', P .. 'epoch', fmt(seen))
  end
  redis.call('SET', P .. 'era', era)
  redis.call('DEL', P .. 'stamp')
end

-- regressed handles a directory that went back in time — a restart from an
-- older snapshot, a promoted replica that lagged: the caller read an epoch
-- (seen) that the counter, which only grows while Redis keeps its data,
-- never reached here. The placements made since are lost while their
-- workers still hold the instances, so it is a wipe (R-CS-1): rotate, and
-- every node drops its cache at its next check. Returns true when it did.
local function regressed(P, seen, era)
  seen = tonumber(seen) or 0
  if seen <= 0 or tonumber(redis.call('GET', P .. 'epoch') or '0') >= seen then
    return false
  end
  rotate(P, seen, era)
  return true
end

-- eligible: live, serving ns, not draining by its own flag or an operator
-- drain of its client id, not degraded, not excluded (R-PL-1, R-LS-3),
-- and no forced release of its rows under way (R-LS-5).
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
  -- Listed while live: a forced release (R-LS-5) still freeing its rows,
  -- which frees whatever r:<sid> holds, so an id placed on it now — its
  -- client undrained before the last batch — would be freed too.
  if redis.call('SISMEMBER', P .. 'dropped', sid) == 1 then
    return false
  end
  return true
end

-- setrow points a row at sid with a fresh epoch and moves it between the
-- sessions' row sets. The placement it replaces can no longer be wound
-- down: its timed wind-down, if any, leaves 'winddowns' (freerow).
local function setrow(P, row, sid, now)
  local key = rowkey(P, row)
  local cur = redis.call('GET', key)
  if cur then
    local old, oep = owner(cur)
    if old ~= sid then
      redis.call('SREM', P .. 'r:' .. old, row)
    end
    redis.call('ZREM', P .. 'winddowns', oep .. ' ' .. row)
  end
  local ep = mint(P, now)
  redis.call('SET', key, sid .. ' ' .. ep)
  redis.call('SADD', P .. 'r:' .. sid, row)
  return ep
end

-- freerow frees the placement row (at key) if its owner is still sid (nil:
-- any) at epoch ep (nil: any): the key is deleted and the row leaves its
-- owner's row set, and its timed wind-down, if any, leaves 'winddowns'
-- (it can no longer fire: a placement again has a new epoch; kept, it
-- stayed to its deadline, up to a week). Returns true when it was freed.
local function freerow(P, key, row, sid, ep)
  local cur = redis.call('GET', key)
  if not cur then
    return false
  end
  local osid, oep = owner(cur)
  if (sid and osid ~= sid) or (ep and oep ~= ep) then
    return false
  end
  redis.call('DEL', key)
  redis.call('SREM', P .. 'r:' .. osid, row)
  redis.call('ZREM', P .. 'winddowns', oep .. ' ' .. row)
  return true
end

-- DROPBATCH is the most rows one script call frees when sessions go or a
-- timed drain force-releases them: RegisterBatch (store.go;
-- TestRedisDropBatchIsRegisterBatch checks they agree). Redis serves
-- nobody while a script runs, so freeing a session's 100,000 rows in one
-- call stalled every node (docs/DIRECTORY.md).
local DROPBATCH = 256

-- freerows frees at most budget rows of a session that is gone (its
-- record already dropped) or whose rows a timed drain force-releases
-- (redis_sweep.lua): they leave r:<sid> and those still pointing at sid
-- are deleted, their names appended to out. A session with rows left
-- stays in the 'dropped' set, for its dropper's next call (redis_drop.lua)
-- or any node's sweep; one without leaves it. The timed wind-downs of the
-- rows freed leave 'winddowns' (freerow). Idempotent. Returns the budget
-- left.
local function freerows(P, sid, budget, out)
  local rs = P .. 'r:' .. sid
  if budget > 0 then
    local rows = redis.call('SPOP', rs, budget)
    local wd = #rows > 0 and redis.call('EXISTS', P .. 'winddowns') == 1
    for _, row in ipairs(rows) do
      local key = rowkey(P, row)
      local v = redis.call('GET', key)
      if v then
        local osid, oep = owner(v)
        if osid == sid then
          redis.call('DEL', key)
          if wd then
            redis.call('ZREM', P .. 'winddowns', oep .. ' ' .. row)
          end
          out[#out + 1] = row
        end
      end
    end
    budget = budget - #rows
  end
  if redis.call('EXISTS', rs) == 1 then
    redis.call('SADD', P .. 'dropped', sid)
  else
    redis.call('SREM', P .. 'dropped', sid)
  end
  return budget
end

-- dropsession removes a session's record and indexes at once — it is
-- gone: no heartbeat renews it, nothing is placed on it, and its rows
-- read as dead-owner rows that claims and registrations re-place — then
-- frees at most budget of its rows (freerows; the rest later, in calls of
-- their own). Returns the budget left.
local function dropsession(P, sid, out, budget)
  local s = redis.call('HMGET', P .. 's:' .. sid, 'cid', 'ns', 'host', 'url')
  if s[2] then
    for ns in string.gmatch(s[2], '[^ ]+') do
      redis.call('SREM', P .. 'n:' .. ns, sid)
      if s[3] and s[3] ~= '' then
        local hb, h = P .. 'hb:' .. ns, string.lower(s[3])
        if redis.call('HINCRBY', hb, h, -1) <= 0 then
          redis.call('HDEL', hb, h)
        end
      end
    end
  end
  if s[1] then
    local k, d = P .. 'k:' .. s[1], P .. 'd:' .. s[1]
    redis.call('SREM', k, sid)
    -- The client's last session: every node that ranked it read its drain
    -- record d:<cid> through its client cache, and Redis tracks the key
    -- for each until it is written. Absent (never drained), it never is:
    -- written and deleted here, so Redis pushes its invalidation (and
    -- forgets it) and each node's client cache drops its nil reply. An
    -- existing record is deleted by the sweep (redis_sweep.lua), which
    -- pushes the same.
    if redis.call('EXISTS', k) == 0 and redis.call('EXISTS', d) == 0 then
      redis.call('HSET', d, 'gone', '1')
      redis.call('DEL', d)
    end
  end
  if s[4] and redis.call('GET', P .. 'u:' .. s[4]) == sid then
    redis.call('DEL', P .. 'u:' .. s[4])
  end
  redis.call('DEL', P .. 's:' .. sid, P .. 'l:' .. sid, P .. 'h:' .. sid, P .. 'q:' .. sid)
  redis.call('ZREM', P .. 'leases', sid)
  return freerows(P, sid, budget, out)
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
  local s = redis.call('HMGET', P .. 's:' .. sid, 'cid', 'sub', 'sec', 'url', 'ns', 'host', 'env', 'rep', 'reg', 'envs')
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
  out[#out + 1] = s[10] or ''
  return out
end

-- Hostname-aware bindings (R-LS-4; rules in bindings.go). A binding is
-- the hash "b:<lower hostname>\0<ns>" {host, env, ep}; "hb:<ns>" counts
-- the sessions per lower-cased hostname serving ns, so placements only scan
-- for bound workers when some exist.

local function envof(env, envs, ns)
  if envs and envs ~= '' and envs ~= '{}' then
    local m = cjson.decode(envs)
    if type(m[ns]) == 'string' then
      return m[ns]
    end
  end
  return env
end

-- holds: a live session with this hostname, epoch and env for ns holds
-- the binding (bindings.go: holdsBinding).
local function holds(P, sid, host, ns, env, ep, now)
  if lease(P, sid) <= now then
    return false
  end
  local s = redis.call('HMGET', P .. 's:' .. sid, 'host', 'rep', 'env', 'envs')
  if not s[1] or string.lower(s[1]) ~= string.lower(host) or s[2] ~= ep then
    return false
  end
  return envof(s[3], s[4], ns) == env
end

-- binding returns the current binding of host/ns and whether a live
-- session holds it.
local function binding(P, host, ns, now)
  local b = redis.call('HMGET', P .. 'b:' .. string.lower(host) .. '\0' .. ns, 'host', 'env', 'ep')
  if not b[1] then
    return nil
  end
  local live = false
  for _, sid in ipairs(redis.call('SMEMBERS', P .. 'n:' .. ns)) do
    if holds(P, sid, b[1], ns, b[2], b[3], now) then
      live = true
      break
    end
  end
  return { host = b[1], env = b[2], ep = b[3], live = live }
end

-- decide applies DecideBinding (bindings.go): 'take', 'supersede' or
-- 'refuse'.
local function decide(cur, env, ep, takeover)
  if not cur or not cur.live then
    return 'take'
  end
  local cep, nep = tonumber(cur.ep), tonumber(ep)
  if nep > cep then
    return 'supersede'
  end
  if nep == cep and env == cur.env then
    return 'take'
  end
  if nep == cep and takeover == 'wind_down' then
    return 'supersede'
  end
  return 'refuse'
end

-- tomb remembers a superseded session for two leases, so its next
-- heartbeat is told why it is gone: "host\0ns\0env\0epoch\0clientId\0until".
local function tomb(P, sid, fields, till, ms)
  local k = P .. 't:' .. sid
  redis.call('SET', k, table.concat(fields, '\0') .. '\0' .. fmt(till), 'PX', ms)
end

-- gone explains a missing session: {"superseded", host, ns, env, epoch,
-- clientId} while its tomb lasts, else {"unknown"}.
local function gone(P, sid, now)
  local t = redis.call('GET', P .. 't:' .. sid)
  if t then
    local f = {}
    for part in string.gmatch(t .. '\0', '([^%z]*)%z') do
      f[#f + 1] = part
    end
    if #f >= 6 and tonumber(f[6]) >= now then
      return { 'superseded', f[1], f[2], f[3], f[4], f[5] }
    end
  end
  return { 'unknown' }
end
