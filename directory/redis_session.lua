-- session reads one session that is still inside its lease (read-only).
-- KEYS[1] the session's record
-- ARGV: 1 prefix, 2 now, 3 session.
-- Returns {"ok", info tuple...} (lib: info), {"superseded", …} or
-- {"unknown"} (lib: gone).
local P, now, sid = ARGV[1], tonumber(ARGV[2]), ARGV[3]
local i = lease(P, sid) > now and info(P, sid)
if not i then
  return gone(P, sid, now)
end
table.insert(i, 1, 'ok')
return i
