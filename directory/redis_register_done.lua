-- register_done finishes a registration whose instances were reclaimed
-- in batches (redis_register_batch.lua): the earlier sessions of the
-- process hand their control messages over and are dropped with whatever
-- they still hold (lib: handover).
-- KEYS[1] the new session's record
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 session, 5.. earlier sessions.
-- Returns {"ok", freed rows}, or gone()'s reply when the session ended
-- meanwhile: the earlier sessions are then left to whoever ended it (a
-- later registration of the same process hands them over itself) or to
-- their leases.
local P, now, ttl, sid = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return gone(P, sid, now)
end
local earlier = {}
for i = 5, #ARGV do
  earlier[#earlier + 1] = ARGV[i]
end
local freed = {}
handover(P, sid, ttl, earlier, freed)
return { 'ok', freed }
