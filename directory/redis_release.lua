-- release frees one placement if the session still holds it (R-REG-3).
-- KEYS[1] placement key
-- ARGV: 1 prefix, 2 session, 3 epoch ("0": any), 4 row "ns\0id".
-- Returns 1 when the row was freed, else 0.
local P, sid, ep, row = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if ep == '0' then
  ep = nil
end
if freerow(P, KEYS[1], row, sid, ep) then
  return 1
end
return 0
