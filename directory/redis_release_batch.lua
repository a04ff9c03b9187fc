-- release_batch frees each listed placement its session still holds
-- (R-REG-3): a worker's batch of releases, RegisterBatch rows per call
-- (ReleaseBatch), or one (Release).
-- KEYS[1] the first row's placement key
-- ARGV: 1 prefix, then per row: 3k-1 session, 3k epoch ("0": any),
-- 3k+1 row "ns\0id".
-- Returns the rows freed.
local P = ARGV[1]
local freed = {}
for i = 2, #ARGV - 2, 3 do
  local sid, ep, row = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  if ep == '0' then
    ep = nil
  end
  if freerow(P, rowkey(P, row), row, sid, ep) then
    freed[#freed + 1] = row
  end
end
return freed
