-- release frees one placement if the session still holds it (R-REG-3).
-- KEYS[1] placement key
-- ARGV: 1 prefix, 2 session, 3 epoch ("0": any), 4 row "ns\0id".
-- Returns 1 when the row was freed, else 0.
local P, sid, ep, row = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local cur = redis.call('GET', KEYS[1])
if not cur then
  return 0
end
local osid, oep = owner(cur)
if osid ~= sid or (ep ~= '0' and oep ~= ep) then
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('SREM', P .. 'r:' .. sid, row)
return 1
