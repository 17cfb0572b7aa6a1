-- A grant's compare-and-delete (crate::grants): KEYS[1] the grant `{u:<user>}:dg:<downstream>` or its lock
-- `{u:<user>}:dgl:<downstream>`; ARGV[1] the value it must still hold, or '' for any. Returns 1 if it was deleted.
if ARGV[1] ~= '' and redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])
