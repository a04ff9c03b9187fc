-- drop ends a session at once: voided registration (R-LS-3) or plain
-- shutdown (R-REG-3). Unknown sessions are not an error.
-- KEYS[1] the session's record
-- ARGV: 1 prefix, 2 session.
-- Returns the names of the rows freed.
local P, sid = ARGV[1], ARGV[2]
if redis.call('EXISTS', KEYS[1]) == 0 then
  return {}
end
return dropsession(P, sid, {})
