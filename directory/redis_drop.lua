-- drop ends a session: voided registration (R-LS-3) or plain shutdown
-- (R-REG-3). The first call drops its record (dropsession: it is gone from
-- then on) and frees one batch of its rows; the caller repeats the call
-- while rows remain, so no call holds Redis for more than DROPBATCH rows
-- (docs/DIRECTORY.md). A call for a session already gone frees its next
-- batch: repeating a drop, or finishing one a failure cut short, is
-- harmless. Unknown sessions are not an error.
-- The registration that superseded or voided a session (redis_register.lua:
-- displace) frees its rows as displacer: while the session is in
-- 'displacing', it stays out of 'dropped', and no sweep or other drop
-- frees its rows unseen by that registration.
-- KEYS[1] the session's record
-- ARGV: 1 prefix, 2 session, 3 displacer ("1") or not ("0").
-- Returns {rows freed, 1 while rows remain to be freed else 0}.
local P, sid = ARGV[1], ARGV[2]
local freed = {}
if ARGV[3] ~= '1' and redis.call('ZSCORE', P .. 'displacing', sid) then
  -- Another caller (a void, a deregister, a later registration of the
  -- same process) finds the session gone; its rows are the displacing
  -- registration's to free, or the sweep's one lease on.
  return { freed, 0 }
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  dropsession(P, sid, freed, DROPBATCH)
else
  freerows(P, sid, DROPBATCH, freed)
end
local left = redis.call('EXISTS', P .. 'r:' .. sid)
if ARGV[3] == '1' and redis.call('ZSCORE', P .. 'displacing', sid) then
  if left == 1 then
    redis.call('SREM', P .. 'dropped', sid)
  else
    redis.call('ZREM', P .. 'displacing', sid)
  end
end
return { freed, left }
