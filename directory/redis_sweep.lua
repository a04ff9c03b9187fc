-- sweep removes sessions one lease past their expiry and frees their
-- rows, DROPBATCH rows per call at most, continuing the drops that have
-- rows left (the 'dropped' set: a drop cut short by a failure, a session
-- dropped here beyond the budget, or the live sessions of a forced
-- release), force-releases the placements of timed drains past their
-- deadline (R-LS-5) within the same budget, frees the placements of timed
-- wind-downs past their deadline (R-CM-1), and frees hostname bindings
-- nobody holds (R-LS-4). Safe on many nodes at once: each step is
-- idempotent.
-- KEYS[1] the lease index
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 most sessions to drop per call.
-- Returns {freed rows, dropped sessions, 1 while sessions in 'dropped'
-- have rows left to free or wind-downs may be left else 0}: the caller
-- calls again.
local P, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local freed, dropped, budget = {}, {}, DROPBATCH
-- Sessions a registration superseded or voided are its own to free
-- (redis_register.lua: displace) for one lease; one still there after
-- that was cut short, and any node's sweep finishes it.
for _, sid in ipairs(redis.call('ZRANGEBYSCORE', P .. 'displacing', '-inf', '(' .. ARGV[2], 'LIMIT', 0, 64)) do
  redis.call('ZREM', P .. 'displacing', sid)
  if redis.call('EXISTS', P .. 'r:' .. sid) == 1 then
    redis.call('SADD', P .. 'dropped', sid)
  end
end
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. fmt(now - ttl), 'LIMIT', 0, tonumber(ARGV[4]))
for _, sid in ipairs(dead) do
  budget = dropsession(P, sid, freed, budget)
  dropped[#dropped + 1] = sid
end
-- Sessions dropped earlier with rows left: each freerows either spends
-- the whole budget or empties (and unlists) its session.
for _ = 1, 64 do
  if budget <= 0 then
    break
  end
  local sid = redis.call('SRANDMEMBER', P .. 'dropped')
  if not sid then
    break
  end
  budget = freerows(P, sid, budget, freed)
end

-- Timed wind-downs past their deadline free their placement, if it is
-- still the one wound down ("<epoch> <row>", redis_winddown.lua): the
-- worker releases what it had loaded itself when it aborts it, and this
-- frees a placement it holds with nothing loaded (R-CM-1). At most
-- DROPBATCH per call; more: the caller calls again.
local wd = redis.call('ZRANGEBYSCORE', P .. 'winddowns', '-inf', ARGV[2], 'LIMIT', 0, DROPBATCH)
for _, m in ipairs(wd) do
  redis.call('ZREM', P .. 'winddowns', m)
  local sp = string.find(m, ' ', 1, true)
  if sp then
    local row = string.sub(m, sp + 1)
    if freerow(P, rowkey(P, row), row, nil, string.sub(m, 1, sp - 1)) then
      freed[#freed + 1] = row
    end
  end
end

for _, cid in ipairs(redis.call('SMEMBERS', P .. 'drains')) do
  local d = P .. 'd:' .. cid
  local v = redis.call('HMGET', d, 'dl', 'rel', 'seen')
  if not v[1] then
    redis.call('SREM', P .. 'drains', cid)
  else
    local dl = tonumber(v[1])
    if dl > 0 and v[2] ~= '1' and now >= dl then
      -- The forced release: flagged done in the same call that lists the
      -- client's sessions with rows left in 'dropped' (freerows), so what
      -- this call's budget leaves is freed by the next calls of any node,
      -- as a drop's rows are; the sessions themselves stay, drained, until
      -- their capped lease passes.
      redis.call('HSET', d, 'rel', '1')
      for _, sid in ipairs(redis.call('SMEMBERS', P .. 'k:' .. cid)) do
        budget = freerows(P, sid, budget, freed)
      end
    end
    if now - tonumber(v[3]) > 2 * ttl then
      local live = false
      for _, sid in ipairs(redis.call('SMEMBERS', P .. 'k:' .. cid)) do
        if lease(P, sid) > now then
          live = true
        end
      end
      if not live then
        redis.call('DEL', d)
        redis.call('SREM', P .. 'drains', cid)
      end
    end
  end
end
-- Bindings no live session holds any more are free (R-LS-4). A binding
-- key is P .. 'b:' .. lower(host) .. '\0' .. ns (redis_register.lua).
-- What the live sessions of a namespace hold is read once per sweep —
-- lower(host) → epoch → env, as holds() compares them — not once per
-- binding: per binding (binding()), the sweep was quadratic in the bound
-- workers sharing a namespace, and 1,000 of them held Redis for seconds
-- every time any node swept.
local held = {}
local function holders(ns)
  local h = held[ns]
  if h then
    return h
  end
  h = {}
  for _, sid in ipairs(redis.call('SMEMBERS', P .. 'n:' .. ns)) do
    if lease(P, sid) > now then
      local s = redis.call('HMGET', P .. 's:' .. sid, 'host', 'rep', 'env', 'envs')
      local env = s[1] and s[2] and envof(s[3], s[4], ns)
      if env then
        local host = string.lower(s[1])
        h[host] = h[host] or {}
        h[host][s[2]] = h[host][s[2]] or {}
        h[host][s[2]][env] = true
      end
    end
  end
  held[ns] = h
  return h
end
for _, bkey in ipairs(redis.call('SMEMBERS', P .. 'bindings')) do
  local sep = string.find(bkey, '\0', 1, true)
  local live = false
  if sep then
    local b = redis.call('HMGET', bkey, 'host', 'env', 'ep')
    local h = b[1] and b[2] and b[3] and holders(string.sub(bkey, sep + 1))[string.lower(b[1])]
    live = h and h[b[3]] and h[b[3]][b[2]] or false
  end
  if not live then
    redis.call('DEL', bkey)
    redis.call('SREM', P .. 'bindings', bkey)
  end
end
local more = redis.call('EXISTS', P .. 'dropped')
if #wd == DROPBATCH then
  more = 1
end
return { freed, dropped, more }
