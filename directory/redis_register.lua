-- register opens a session (R-REG-1): it decides every hostname binding
-- (R-LS-4) before anything changes, creates the session, takes its
-- bindings and supersedes the sessions they displace, applies an operator
-- drain's lease cap, and names the earlier sessions of this process.
-- When the registration lists at most one batch of instances (ARGV[18] is
-- '1') this call also reclaims them and hands the earlier sessions over,
-- as one script; otherwise the caller reclaims them in batches
-- (redis_register_batch.lua) and then hands over (redis_register_done.lua),
-- so that Redis serves other clients in between (docs/DIRECTORY.md).
-- KEYS[1] the new session's record
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 session, 5 clientId, 6 sub, 7 secret,
--       8 advertiseUrl, 9 namespaces (space separated), 10 hostname,
--       11 env, 12 registration epoch, 13 headroom, 14 draining (0/1),
--       15 previous session ("" for none), 16 envs (JSON object),
--       17 takeover, 18 complete (1: the rows follow, 0: batches follow),
--       19.. instance rows "ns\0id" of namespaces the worker serves.
-- Returns {"superseded", host, ns, env, epoch} when a binding refuses the
-- registration (nothing changed), else {lease, draining (0/1), drain
-- deadline (0: untimed), duplicates, reclaimed rows, freed rows, earlier
-- sessions of this process (dropped when complete, else still to hand
-- over), superseded sessions (and voided ones), voided sessions as
-- session, clientId pairs}. Without complete, the freed rows are those
-- the superseded sessions held: listed ones are duplicates.
local P, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local sid, cid, sub, prev = ARGV[4], ARGV[5], ARGV[6], ARGV[15]
local host, env, rep, envs, takeover = ARGV[10], ARGV[11], ARGV[12], ARGV[16], ARGV[17]

-- Bindings are decided before anything changes: a refused registration
-- leaves no trace.
local plans = {}
if host ~= '' then
  for ns in string.gmatch(ARGV[9], '[^ ]+') do
    local e = envof(env, envs, ns)
    local cur = binding(P, host, ns, now)
    local v = decide(cur, e, rep, takeover)
    if v == 'refuse' then
      return { 'superseded', host, ns, cur.env, cur.ep }
    end
    plans[#plans + 1] = { ns = ns, env = e, v = v }
  end
end

-- Process continuity: the earlier sessions of this process hand their rows
-- over; whatever they held that the worker no longer lists is freed with
-- them. clientId is minted per process, so every session of this client
-- and account is the process's: the one it names as previous, and any
-- other — a registration whose reply was lost (the worker's timeout, a
-- connection cut after this script ran) left a session the worker never
-- learnt, whose rows would otherwise come back as duplicates of its own
-- instances (memory.go earlierSessions).
local earlier, elist = {}, {}
local function adopt(o)
  if o ~= sid and not earlier[o] then
    local p = redis.call('HMGET', P .. 's:' .. o, 'cid', 'sub')
    if p[1] == cid and p[2] == sub then
      earlier[o] = true
      elist[#elist + 1] = o
    end
  end
end
if prev ~= '' then
  adopt(prev)
end
-- The others by registration, oldest first (then by id), after the one
-- named as previous: handover passes their control messages on in this
-- order (memory.go earlierSessions). SMEMBERS has none of its own.
local others = {}
for _, o in ipairs(redis.call('SMEMBERS', P .. 'k:' .. cid)) do
  if o ~= prev then
    others[#others + 1] = { o, tonumber(redis.call('HGET', P .. 's:' .. o, 'reg') or '0') or 0 }
  end
end
table.sort(others, function(a, b)
  if a[2] ~= b[2] then
    return a[2] < b[2]
  end
  return a[1] < b[1]
end)
for _, o in ipairs(others) do
  adopt(o[1])
end

redis.call('HSET', KEYS[1], 'cid', cid, 'sub', sub, 'sec', ARGV[7], 'url', ARGV[8],
  'ns', ARGV[9], 'host', host, 'env', env, 'rep', rep, 'reg', ARGV[2], 'envs', envs)
redis.call('HSET', P .. 'h:' .. sid, 'hr', ARGV[13], 'dr', ARGV[14], 'dg', '0')
for ns in string.gmatch(ARGV[9], '[^ ]+') do
  redis.call('SADD', P .. 'n:' .. ns, sid)
  if host ~= '' then
    redis.call('HINCRBY', P .. 'hb:' .. ns, string.lower(host), 1)
  end
end
redis.call('SADD', P .. 'k:' .. cid, sid)

-- The new session takes its bindings and displaces the sessions that
-- held them: their records go at once, a tomb tells their next heartbeat.
-- The rows they held are freed, and listed ones are duplicates (taken):
-- they belonged to another live session when this registration came.
-- Earlier sessions of this process are handed over instead. Their
-- records go here; their rows one batch here, the rest in batches after
-- (redis_drop.lua), so taken holds the rows freed here and the displaced
-- sessions themselves (row names hold a '\0', session ids never do).
local freed, displaced, taken, budget = {}, {}, {}, DROPBATCH
-- displace drops session o and takes what it held: the rows freed here
-- and the rows it still holds beyond the budget (the caller frees them in
-- batches; reclaim checks their owner), named by o itself.
local function displace(o)
  local from = #freed + 1
  budget = dropsession(P, o, freed, budget)
  -- Batches follow: the rows o has left are this registration's to free
  -- (redis_drop.lua, displacer), so that it learns every one — listed,
  -- another node's sweep could free some first, and the batches would
  -- claim those ids instead of answering them as duplicates. Kept in
  -- 'displacing' instead, which the sweep lists again one lease from now:
  -- a registration cut short still leaves them to any node's sweep.
  if ARGV[18] ~= '1' and redis.call('SREM', P .. 'dropped', o) == 1 then
    redis.call('ZADD', P .. 'displacing', fmt(now + ttl), o)
  end
  for i = from, #freed do
    taken[freed[i]] = true
  end
  taken[o] = true
  displaced[#displaced + 1] = o
end
for _, p in ipairs(plans) do
  local bkey = P .. 'b:' .. string.lower(host) .. '\0' .. p.ns
  redis.call('HSET', bkey, 'host', host, 'env', p.env, 'ep', rep)
  redis.call('SADD', P .. 'bindings', bkey)
  if p.v == 'supersede' then
    for _, o in ipairs(redis.call('SMEMBERS', P .. 'n:' .. p.ns)) do
      if o ~= sid and not earlier[o] and lease(P, o) > now then
        local oh = redis.call('HMGET', P .. 's:' .. o, 'host', 'cid')
        if oh[1] and string.lower(oh[1]) == string.lower(host) and not holds(P, o, host, p.ns, p.env, rep, now) then
          tomb(P, o, { host, p.ns, p.env, rep, oh[2] or '' }, now + 2 * ttl, fmt(2 * ttl / 1000))
          displace(o)
        end
      end
    end
  end
end

-- The advertise URL's last registration: the session of another process
-- found there is void (R-LS-3, memory_register.go takeURL). This
-- registration's probe was answered at the URL with the new secret, so
-- the URL no longer reaches it. Its rows are taken, as a superseded
-- session's are.
local ukey, voided = P .. 'u:' .. ARGV[8], {}
local o = redis.call('GET', ukey)
redis.call('SET', ukey, sid)
if o and o ~= sid and not earlier[o] and not taken[o] then
  local ocid = redis.call('HGET', P .. 's:' .. o, 'cid')
  if ocid then
    displace(o)
    voided[#voided + 1] = o
    voided[#voided + 1] = ocid
  end
end

local l, draining, dl = now + ttl, '0', '0'
local d = P .. 'd:' .. cid
if redis.call('EXISTS', d) == 1 then
  draining = '1'
  dl = redis.call('HGET', d, 'dl') or '0'
  -- A timed drain whose cap (deadline + one lease) has passed is spent:
  -- it stays a drain, untimed, and the new session gets a normal lease
  -- (memory.go spendTimedDrain).
  if tonumber(dl) > 0 and now >= tonumber(dl) + ttl then
    dl = '0'
    redis.call('HSET', d, 'dl', '0')
  end
  redis.call('HSET', d, 'seen', ARGV[2])
  l = caplease(l, tonumber(dl), ttl)
end
setlease(P, sid, l)

local dups, written = {}, {}
if ARGV[18] == '1' then
  reclaim(P, sid, now, earlier, taken, 19, dups, written)
  handover(P, sid, ttl, elist, freed)
end
return { fmt(l), draining, dl, dups, written, freed, elist, displaced, voided }
