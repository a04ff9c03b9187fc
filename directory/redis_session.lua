-- session reads one session that is still inside its lease (read-only).
-- KEYS[1] the session's record
-- ARGV: 1 prefix, 2 now, 3 session.
-- Returns the info tuple (lib: info) or false.
local P, now, sid = ARGV[1], tonumber(ARGV[2]), ARGV[3]
if lease(P, sid) <= now then
  return false
end
return info(P, sid) or false
