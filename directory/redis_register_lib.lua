-- Helpers of the register scripts, prepended after redis_lib.lua
-- (redis_scripts.go). A registration is opened by redis_register.lua; the
-- instances it lists are reclaimed in that call when they fit one batch
-- (RegisterBatch in store.go), else in batches by
-- redis_register_batch.lua, and redis_register_done.lua then hands the
-- earlier sessions over. Redis serves nobody while a script runs, so no
-- single call may grow with the instance list (docs/DIRECTORY.md).

-- reclaim points the listed rows ARGV[from..] at sid. A row is the
-- session's own unless a live session holds it that is neither sid nor
-- one of the earlier sessions of this process (earlier[osid]), or it is
-- in taken (rows the sessions this registration displaced held while
-- live, or still hold: taken names those sessions too): those are
-- duplicates. Each own row not yet sid's is listed in written: one an
-- earlier session of the process holds keeps its epoch (nothing placed it
-- elsewhere since, and the worker's instance releases at that epoch:
-- pinned RegistrationClient.release), any other gets a fresh one. The
-- caller passes only rows of namespaces the session serves.
local function reclaim(P, sid, now, earlier, taken, from, dups, written)
  for i = from, #ARGV do
    local row = ARGV[i]
    local own, mine, kept = not taken[row], false, nil
    if own then
      local cur = redis.call('GET', rowkey(P, row))
      if cur then
        local osid, ep = owner(cur)
        mine = osid == sid
        if earlier[osid] then
          kept = ep
          redis.call('SREM', P .. 'r:' .. osid, row)
        end
        own = mine or earlier[osid] or (not taken[osid] and lease(P, osid) <= now)
      end
    end
    if not own then
      dups[#dups + 1] = row
    elseif kept then
      redis.call('SET', rowkey(P, row), sid .. ' ' .. kept)
      redis.call('SADD', P .. 'r:' .. sid, row)
      written[#written + 1] = row
    elseif not mine then
      setrow(P, row, sid, now)
      written[#written + 1] = row
    end
  end
end

-- handover ends the earlier sessions of a registration once its listed
-- instances are reclaimed: control messages for rows sid now holds move
-- to its queue (R-CM-1: delivered until acked; memory_register.go handOverQueues),
-- and each earlier session is dropped with what it still holds (rows the
-- worker no longer lists): DROPBATCH rows at most in all, their names
-- appended to freed; the caller frees the rest in batches (redis_drop.lua).
local function handover(P, sid, ttl, earlier, freed)
  local q, budget = P .. 'q:' .. sid, DROPBATCH
  local moved = {}
  for _, o in ipairs(earlier) do
    local pq = P .. 'q:' .. o
    if redis.call('EXISTS', pq) == 1 then
      for _, m in ipairs(redis.call('LRANGE', pq, 0, -1)) do
        -- "<msgId> <deadline> <ns>\0<id>" (redis_decode.go encodeMessage)
        local sp = string.find(m, ' ', 18, true)
        local cur = sp and redis.call('GET', rowkey(P, string.sub(m, sp + 1)))
        if cur and owner(cur) == sid then
          moved[#moved + 1] = m
        end
      end
    end
    budget = dropsession(P, o, freed, budget)
  end
  -- Ahead of what sid's queue got between the batches: a message for an
  -- id was queued on an earlier session while it held the id, before any
  -- queued on sid once sid reclaimed it, and the worker applies them in
  -- order (a revoke after its wind-down; memory_register.go handOverQueues).
  for i = #moved, 1, -1 do
    redis.call('LPUSH', q, moved[i])
  end
  if #earlier > 0 and redis.call('EXISTS', q) == 1 then
    redis.call('PEXPIRE', q, fmt(2 * ttl / 1000))
  end
end
