-- reset_idle_stream.lua: Reset for a `queue` limit's stream: deletes it only while no entry waits in it, in one script
-- so that an entry appended between the check and the delete is never lost.
-- KEYS[1]: the stream. ARGV: none.
-- Returns: 1 when an empty stream was deleted, 0 when the key did not exist, -1 when entries wait (nothing written).

if redis.call('XLEN', KEYS[1]) > 0 then
  return -1
end
return redis.call('DEL', KEYS[1])
