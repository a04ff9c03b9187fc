-- register_batch reclaims one batch of the instances a registration
-- lists (R-REG-1) for its session, opened by redis_register.lua: rows
-- another live session holds come back as duplicates. The batch is
-- RegisterBatch rows at most (store.go), so no call holds Redis for long.
-- KEYS[1] the session's record
-- ARGV: 1 prefix, 2 now, 3 session, 4 number n of earlier sessions,
--       5..4+n the earlier sessions of this process (their rows are the
--       session's own), then the rows "ns\0id" of the batch.
-- Returns {"ok", duplicates, reclaimed rows}, or gone()'s reply when the
-- session ended since it was opened (superseded, or dropped by a later
-- registration of the same process): nothing is written for a session
-- that is gone, so no row is left pointing at it.
local P, now, sid = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return gone(P, sid, now)
end
local n = tonumber(ARGV[4])
local earlier = {}
for i = 5, 4 + n do
  earlier[ARGV[i]] = true
end
local dups, written = {}, {}
reclaim(P, sid, now, earlier, {}, 5 + n, dups, written)
return { 'ok', dups, written }
