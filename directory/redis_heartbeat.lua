-- heartbeat renews a lease (R-LS-1), replaces headroom and the own drain
-- flag, records the probe outcome (R-LS-3), trims acked control messages
-- and returns the pending ones (R-CM-1).
-- KEYS[1] the session's record
-- ARGV: 1 prefix, 2 now, 3 ttl, 4 session, 5 sub, 6 headroom,
--       7 draining (0/1), 8 degraded (0/1), 9 queue expiry (ms),
--       10.. acked message ids.
-- Returns {"unknown"} or {"superseded", …} (lib: gone), {"forbidden"} or
-- {"ok", lease, draining (0/1), operator drain (0/1), drain deadline,
-- own drain flag before (0/1), degraded before (0/1), messages...}.
local P, now, ttl = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local sid = ARGV[4]
local s = redis.call('HMGET', KEYS[1], 'cid', 'sub')
if not s[1] or lease(P, sid) <= now then
  return gone(P, sid, now)
end
if s[2] ~= ARGV[5] then
  return { 'forbidden' }
end

local l, op, dl = now + ttl, '0', '0'
local d = P .. 'd:' .. s[1]
if redis.call('EXISTS', d) == 1 then
  op = '1'
  dl = redis.call('HGET', d, 'dl') or '0'
  redis.call('HSET', d, 'seen', ARGV[2])
  l = caplease(l, tonumber(dl), ttl)
end
setlease(P, sid, l)

local h = P .. 'h:' .. sid
local was = redis.call('HMGET', h, 'dr', 'dg')
local wasdr, wasdg = was[1] == '1' and '1' or '0', (was[2] and was[2] ~= '0') and '1' or '0'
local dg = '0'
if ARGV[8] == '1' then
  dg = was[2] or '0'
  if dg == '0' then
    dg = ARGV[2]
  end
end
redis.call('HSET', h, 'hr', ARGV[6], 'dr', ARGV[7], 'dg', dg)

local out = { 'ok', fmt(l), (ARGV[7] == '1' or op == '1') and '1' or '0', op, dl, wasdr, wasdg }
local q = P .. 'q:' .. sid
if redis.call('EXISTS', q) == 1 then
  local msgs = redis.call('LRANGE', q, 0, -1)
  if #ARGV >= 10 then
    -- The queue is rewritten once, without the acked messages: an LREM
    -- per ack scanned the list from its head each time, quadratic when
    -- unacked messages lead (10,000 acks behind 10,000 held Redis 3.8 s,
    -- past every node's staleness budget;
    -- TestRedisHeartbeatAcksLinear_RCM1).
    local acked, kept = {}, {}
    for i = 10, #ARGV do
      acked[ARGV[i]] = true
    end
    for _, m in ipairs(msgs) do
      if not acked[string.sub(m, 1, 16)] then
        kept[#kept + 1] = m
      end
    end
    if #kept < #msgs then
      redis.call('DEL', q)
      -- RPUSH in chunks: unpack is bounded by Lua's C stack (8,000).
      for i = 1, #kept, 1000 do
        redis.call('RPUSH', q, unpack(kept, i, math.min(i + 999, #kept)))
      end
      msgs = kept
    end
  end
  -- The queue expires two leases after its last write or read (R-CM-1).
  redis.call('PEXPIRE', q, ARGV[9])
  for _, m in ipairs(msgs) do
    out[#out + 1] = m
  end
end
return out
