-- reset_idle_stream.lua: Reset for a `queue` limit's stream. Deletes the stream only while no entry waits in it;
-- checking and deleting in one script means an entry appended between the two can never be lost.
--
-- KEYS[1]: the stream.
-- ARGV: none.
-- Returns: 1 when an empty stream was deleted, 0 when the key did not exist, -1 when entries wait (nothing written).
-- Invariants: a stream that holds an entry is never written.

if redis.call('XLEN', KEYS[1]) > 0 then
  return -1
end
return redis.call('DEL', KEYS[1])
