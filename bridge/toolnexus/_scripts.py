"""The Lua scripts of the Redis broker. Each runs on one Redis Cluster slot and takes a
*batch*: the items that one event-loop turn produced for the same slot (see
:meth:`toolnexus._pipeliner.Pipeliner.batch`), laid out as

    KEYS = shared keys ++ keys of item 1 ++ keys of item 2 ++ ...
    ARGV = shared args ++ args of item 1 ++ args of item 2 ++ ...

and returns one reply per item. A thousand concurrent publishes or answers cost a
few commands, not thousands.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BatchScript:
    """A batch-form Lua script: ``source``, and how many keys and args each item has."""

    name: str
    source: str
    keys_per_item: int
    args_per_item: int
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


OPEN = BatchScript(
    "open",
    """
-- On a waiter's slot. Shared: KEYS reply stream (names the slot).
-- Item: KEYS state; ARGV deadline_ms, request, ttl_ms.
-- Opens each request's state unless it exists: a publish retried after an answer
-- must not reopen the request.
local opened = {}
for i = 2, #KEYS do
  local a = (i - 2) * 3
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('HSET', KEYS[i], 's', 'open', 'x', ARGV[a + 1], 'req', ARGV[a + 2])
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 3])
    opened[i - 1] = 1
  else
    opened[i - 1] = 0
  end
end
return opened
""",
    keys_per_item=1,
    args_per_item=3,
)

PUBLISH = BatchScript(
    "publish",
    """
-- On a queue's slot. Shared: KEYS request stream; ARGV min_id, waiter.
-- Item: KEYS route; ARGV request, ttl_ms. Adds each request to the stream (trimmed
-- by age, never by length) and records which waiter it belongs to.
local ids = {}
for i = 2, #KEYS do
  local a = 2 + (i - 2) * 2
  ids[i - 1] = redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], '*', 'r', ARGV[a + 1])
  redis.call('SET', KEYS[i], ARGV[2], 'PX', ARGV[a + 2])
end
return ids
""",
    keys_per_item=1,
    args_per_item=2,
)

STATUS = BatchScript(
    "status",
    """
-- On a waiter's slot. Shared: KEYS reply stream (names the slot).
-- Item: KEYS state. The status of each request (nil if unknown).
local statuses = {}
for i = 2, #KEYS do
  statuses[i - 1] = redis.call('HGET', KEYS[i], 's')
end
return statuses
""",
    keys_per_item=1,
    args_per_item=0,
)

RESOLVE = BatchScript(
    "resolve",
    """
-- On a waiter's slot. Shared: KEYS reply stream; ARGV retention_ms.
-- Item: KEYS state; ARGV status, answer, request id.
-- The first resolution of a request wins: it is recorded and sent to the waiter.
-- Each reply: {'ok'} | {'unknown'} | {'late'} (past the deadline) | {status, answer}.
local replies = {}
local now = nil
for i = 2, #KEYS do
  local a = 1 + (i - 2) * 3
  local status, answer, id = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local st = redis.call('HMGET', KEYS[i], 's', 'x')
  if not st[1] then
    replies[i - 1] = {'unknown'}
  elseif st[1] ~= 'open' then
    replies[i - 1] = {st[1], redis.call('HGET', KEYS[i], 'a')}
  else
    if status == 'answered' and not now then
      local t = redis.call('TIME')
      now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    end
    if status == 'answered' and now >= tonumber(st[2]) then
      replies[i - 1] = {'late'}
    else
      redis.call('HSET', KEYS[i], 's', status, 'a', answer)
      redis.call('PEXPIRE', KEYS[i], ARGV[1])
      redis.call('XADD', KEYS[1], '*', 'id', id, 'a', answer)
      replies[i - 1] = {'ok'}
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return replies
""",
    keys_per_item=1,
    args_per_item=3,
)

SETTLE = BatchScript(
    "settle",
    """
-- On a queue's slot. Shared: KEYS events stream, request stream.
-- Item: ARGV event, group, entry to acknowledge, entry to delete ('' for none).
-- Publishes events, acknowledges the entries of resolved requests, and deletes the
-- entries of resolved requests so that groups that have not read them yet never do.
local n = 0
for a = 1, #ARGV, 4 do
  if ARGV[a] ~= '' then
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', 10000, '*', 'e', ARGV[a])
  end
  if ARGV[a + 2] ~= '' then
    redis.call('XACK', KEYS[2], ARGV[a + 1], ARGV[a + 2])
  end
  if ARGV[a + 3] ~= '' then
    redis.call('XDEL', KEYS[2], ARGV[a + 3])
  end
  n = n + 1
end
return n
""",
    keys_per_item=0,
    args_per_item=4,
)


SCRIPTS = (OPEN, PUBLISH, STATUS, RESOLVE, SETTLE)
