-- drain sets or clears the operator drain on a client id (R-REG-6); a
-- timed drain caps the leases of its live sessions at the deadline plus one
-- lease (R-LS-5).
-- KEYS[1] the client's session set
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 clientId, 5 draining (0/1),
--       6 deadline (0: untimed).
-- Returns {found (0/1), session, capped lease, ...}.
local P, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local cid, draining, dl = ARGV[4], ARGV[5] == '1', tonumber(ARGV[6])
local out = { '0' }
for _, sid in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local l = lease(P, sid)
  if l > now then
    out[1] = '1'
    if draining then
      local c = caplease(l, dl, ttl)
      if c ~= l then
        setlease(P, sid, c)
        out[#out + 1] = sid
        out[#out + 1] = fmt(c)
      end
    end
  end
end
local d = P .. 'd:' .. cid
if out[1] == '0' then
  -- Undrain clears the record even when no session is live (memory.go).
  if not draining and redis.call('EXISTS', d) == 1 then
    redis.call('DEL', d)
    redis.call('SREM', P .. 'drains', cid)
    out[1] = '1'
  end
  return out
end
redis.call('DEL', d)
if draining then
  redis.call('HSET', d, 'dl', ARGV[6], 'rel', '0', 'seen', ARGV[2])
  redis.call('SADD', P .. 'drains', cid)
else
  redis.call('SREM', P .. 'drains', cid)
end
return out
