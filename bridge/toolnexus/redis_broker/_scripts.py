"""The Lua scripts of the Redis broker. Each runs on one Redis Cluster slot and takes a
*batch*: the items that one event-loop turn produced for the same slot (see
:meth:`Pipeliner.batch <toolnexus.redis_broker._pipeliner.Pipeliner.batch>`), laid out as

    KEYS = shared keys ++ keys of item 1 ++ keys of item 2 ++ ...
    ARGV = shared args ++ args of item 1 ++ args of item 2 ++ ...

and returns one reply per item. A thousand concurrent publishes or answers cost a
few commands, not thousands.

Scripts on a waiter's slot take the waiter's reply stream and liveness mark as shared
keys; scripts on a queue's slot take the queue's streams.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Final

from ..lifecycle import Outcome
from ._layout import LUA_FIELDS


@dataclass(frozen=True)
class BatchScript:
    """A batch-form Lua script: ``source``, and how many keys and args each item has."""

    name: str
    source: str
    keys_per_item: int
    args_per_item: int
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        # every script starts with the names of the state layout (layout.LUA_FIELDS)
        object.__setattr__(self, "source", LUA_FIELDS + self.source)
        object.__setattr__(self, "sha", hashlib.sha1(self.source.encode()).hexdigest())


OUTCOMES: Final = frozenset(Outcome) - {Outcome.COUNTED}
"""What the resolve script says of one item (see :class:`~toolnexus.lifecycle.Outcome`):
``ok`` (this resolution won), ``unknown`` (no such request), ``late`` (an answer after the
signed deadline), ``gone`` (an answer to a request whose waiter is no longer alive),
``contested`` (an answer before the deadline to a request whose state holds another
answer or is missing: sent to the waiter, which decides), ``early`` (a responder's expiry
before the deadline), or the status of a request already resolved."""

ADMIT = """
-- The admission rule (toolnexus.lifecycle.admit says the same, line by line): what an
-- item finds in a request's state. ``item`` is 'answer' (contests another stored answer,
-- S4), 'vote' (a quorum's: the waiter checks its slots instead, S7), 'expiry' (a
-- responder ending the request at its deadline) or 'end' (the waiter's own end, or a
-- responder's withdrawal); deadline_arg the signed request's deadline in ms ('0' for
-- none: then the state's). Redis time is the only judge of a deadline here. Returns the
-- reply, or false to admit the item (open, in time, its waiter alive). A stored answer is
-- shown to the waiter again whenever an answer or vote finds the request resolved: if it
-- never took it (an edited state), it checks it.
local now, alive, state_protocol = nil, nil, nil
-- A reply entry: an answer to request id (contested: '1'), in the protocol of the state
-- admit read last (field F_PROTOCOL; none in protocol 1, or with no state).
local function send_reply(stream, id, answer, contested)
  local fields = {R_ID, id, R_ANSWER, answer}
  if contested then
    table.insert(fields, R_CONTESTED)
    table.insert(fields, '1')
  end
  if state_protocol then
    table.insert(fields, F_PROTOCOL)
    table.insert(fields, state_protocol)
  end
  redis.call('XADD', stream, '*', unpack(fields))
end
local function admit(key, item, id, answer, deadline_arg, answers)
  local st = redis.call('HMGET', key, F_STATUS, F_DEADLINE, F_DURABLE, F_PROTOCOL)
  state_protocol = st[4]
  if item ~= 'end' and not now then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    alive = redis.call('EXISTS', answers[2])
  end
  local deadline = tonumber(deadline_arg) or 0
  if deadline == 0 then
    deadline = tonumber(st[2]) or 0
  end
  local answering = item == 'answer' or item == 'vote'
  local contests = item == 'answer'
  local before = now and now < deadline
  if not st[1] then
    if contests and before then
      send_reply(answers[1], id, answer, true)
      return {'contested'}
    end
    return {'unknown'}
  end
  if st[1] ~= S_OPEN then
    local stored = redis.call('HGET', key, F_ANSWER)
    if answering and stored then
      send_reply(answers[1], id, stored, false)
    end
    if contests and stored ~= answer and before then
      send_reply(answers[1], id, answer, true)
      if redis.call('HLEN', key) < 16 then
        redis.call('HSET', key, F_CONTESTED .. redis.sha1hex(answer), answer)
      end
      return {'contested', stored}
    end
    return {st[1], stored}
  end
  if item == 'expiry' and before then
    return {'early'}
  end
  if answering and not before then
    return {'late'}
  end
  if answering and alive == 0 and not st[3] then
    return {'gone'}
  end
  return false
end
"""

OPEN_STATE = """
-- Opens a request's state: open, its deadline, for a durable request the request ('req')
-- and 'd', and from protocol 2 on its protocol ('p').
local function open_state(key, deadline_ms, request, durable, protocol)
  local fields = {F_STATUS, S_OPEN, F_DEADLINE, deadline_ms}
  if durable == '1' then
    fields[5], fields[6], fields[7], fields[8] = F_REQUEST, request, F_DURABLE, '1'
  end
  if protocol ~= '1' then
    table.insert(fields, F_PROTOCOL)
    table.insert(fields, protocol)
  end
  redis.call('HSET', key, unpack(fields))
end
"""

OPEN = BatchScript(
    "open",
    OPEN_STATE
    + """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark; ARGV liveness_ms (0 for
-- the durable waiter, which has no liveness mark), the mark's value, protocol ('1' or
-- '2': the state's).
-- Item: KEYS state; ARGV deadline_ms, request, ttl_ms, durable ('1' or '0').
-- Marks the waiter alive and opens each request's state unless it exists: a publish
-- retried after an answer must not reopen the request. Only a durable state holds the
-- request ('req', for the next attach); a plain request's one home while it is open is
-- its entry in the request stream, which its route names. A durable state ('d') counts
-- as alive whatever the mark says. Each reply: 1 opened; 0 it existed; for a durable
-- item that existed, {status, deadline_ms, request, answer, queues reached} as stored
-- (an attach).
if ARGV[1] ~= '0' then
  redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[1])
end
local opened = {}
for i = 3, #KEYS do
  local a = 3 + (i - 3) * 4
  if redis.call('EXISTS', KEYS[i]) == 0 then
    open_state(KEYS[i], ARGV[a + 1], ARGV[a + 2], ARGV[a + 4], ARGV[3])
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 3])
    opened[i - 2] = 1
  elseif ARGV[a + 4] == '1' then
    opened[i - 2] = redis.call(
      'HMGET', KEYS[i], F_STATUS, F_DEADLINE, F_REQUEST, F_ANSWER, F_QUEUES)
  else
    opened[i - 2] = 0
  end
end
return opened
""",
    keys_per_item=1,
    args_per_item=4,
)

PUBLISH = BatchScript(
    "publish",
    """
-- On a queue's slot. Shared: KEYS request stream; ARGV min_id, waiter, protocol ('1' or
-- '2': the routes').
-- Item: KEYS route; ARGV request, ttl_ms, once ('0', '1' or an entry id). Adds each
-- request to the stream (trimmed by age, never by length) and records in its route which
-- waiter it belongs to and its entry id (route_of). A route is set only if absent or this
-- waiter's already (a publish retried, a durable request published again): a request whose
-- id another waiter owns is neither added nor routed (reply 0; a route that is not a
-- string counts as another's). A request published ``once`` is published already, and
-- not added again (reply false), so that processes attaching to it at the same time
-- publish it once between them: with '1' (a hop) if its route is this waiter's, with an
-- entry id (a durable request, as its state recorded it) if its route is this waiter's
-- and names that entry. Any other route of this waiter's (set by someone else before the
-- request was asked, say) is replaced.
local ids = {}
for i = 2, #KEYS do
  local a = 3 + (i - 2) * 3
  local owner = redis.pcall('GET', KEYS[i])
  if type(owner) == 'table' then
    owner = ''
  end
  if owner then
    owner = route_waiter(owner)
  end
  if owner and owner ~= ARGV[2] then
    ids[i - 1] = 0
  elseif owner and (ARGV[a + 3] == '1' or (ARGV[a + 3] ~= '0'
      and route_entry(redis.call('GET', KEYS[i])) == ARGV[a + 3])) then
    ids[i - 1] = false
  else
    ids[i - 1] = redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], '*', E_REQUEST, ARGV[a + 1])
    redis.call('SET', KEYS[i], route_of(ARGV[2], ids[i - 1], ARGV[3]), 'PX', ARGV[a + 2])
  end
end
return ids
""",
    keys_per_item=1,
    args_per_item=3,
)

OPEN_PUBLISH = BatchScript(
    "open_publish",
    OPEN_STATE
    + """
-- One server only (it writes keys of a waiter's slot and of a queue's): OPEN and PUBLISH
-- of the same requests in one script, as they would run one after the other (only a
-- durable state holds the request, and the entry it was added as: F_ENTRY; a route names
-- the waiter and the entry).
-- Shared: KEYS reply stream, liveness mark, request stream; ARGV liveness_ms (0 for the
-- durable waiter), min_id, waiter, the mark's value, protocol ('1' or '2').
-- Item: KEYS state, route; ARGV deadline_ms, request, ttl_ms, durable ('1' or '0'), once
-- ('1' or '0'). Each reply: the request's entry id;
-- false for a request published ``once`` whose route is this waiter's and names the entry
-- its state recorded (published already: anybody may set a route, before the request is
-- asked too, but only this agent and the responders may write its state); 0 for a request
-- whose id another waiter owns, whose state is then not opened either (see PUBLISH).
if ARGV[1] ~= '0' then
  redis.call('SET', KEYS[2], ARGV[4], 'PX', ARGV[1])
end
local ids = {}
for j = 1, (#KEYS - 3) / 2 do
  local state, route = KEYS[2 + 2 * j], KEYS[3 + 2 * j]
  local a = 5 + (j - 1) * 5
  local request, ttl_ms = ARGV[a + 2], ARGV[a + 3]
  local owner = redis.pcall('GET', route)
  if type(owner) == 'table' then
    owner = ''
  end
  if owner then
    owner = route_waiter(owner)
  end
  if owner and owner ~= ARGV[3] then
    ids[j] = 0
  else
    if redis.call('EXISTS', state) == 0 then
      open_state(state, ARGV[a + 1], request, ARGV[a + 4], ARGV[5])
      redis.call('PEXPIRE', state, ttl_ms)
    end
    if owner and ARGV[a + 5] == '1'
        and route_entry(redis.call('GET', route)) == redis.call('HGET', state, F_ENTRY) then
      ids[j] = false
    else
      ids[j] = redis.call('XADD', KEYS[3], 'MINID', '~', ARGV[2], '*', E_REQUEST, request)
      redis.call('SET', route, route_of(ARGV[3], ids[j], ARGV[5]), 'PX', ttl_ms)
      if ARGV[a + 4] == '1' then
        redis.call('HSET', state, F_ENTRY, ids[j])
      end
    end
  end
end
return ids
""",
    keys_per_item=2,
    args_per_item=5,
)

RENEW = BatchScript(
    "renew",
    """
-- On a waiter's slot (a queue's durable waiter). Shared: KEYS reply stream, liveness mark;
-- ARGV protocol ('1' or '2': a renewed state's, field 'p' from 2 on).
-- Item: KEYS state; ARGV request seen, status seen, request, deadline_ms, ttl_ms, fresh
-- ('1' or '0'). An attaching waiter judged a durable state by its signed request (see
-- durable.py): stale, past its deadline and retention (with fresh: written anew, open,
-- with ``request``), or ended without an outcome before its signed deadline (opened
-- again, its deadline the signed one, its votes and hop record kept). Only if the state
-- still holds the request and status seen, so that nothing recorded meanwhile is lost:
-- 1 if renewed, else 0.
local renewed = {}
for i = 3, #KEYS do
  local a = 1 + (i - 3) * 6
  local st = redis.call('HMGET', KEYS[i], F_REQUEST, F_STATUS)
  if st[1] == ARGV[a + 1] and st[2] == ARGV[a + 2] then
    if ARGV[a + 6] == '1' then
      local fields = redis.call('HGETALL', KEYS[i])  -- (an agent's rights have no DEL)
      for f = 1, #fields, 2 do
        redis.call('HDEL', KEYS[i], fields[f])
      end
    else
      redis.call('HDEL', KEYS[i], F_ANSWER)
    end
    redis.call(
      'HSET', KEYS[i], F_STATUS, S_OPEN, F_DEADLINE, ARGV[a + 4], F_REQUEST, ARGV[a + 3],
      F_DURABLE, '1')
    if ARGV[1] ~= '1' then
      redis.call('HSET', KEYS[i], F_PROTOCOL, ARGV[1])
    else
      redis.call('HDEL', KEYS[i], F_PROTOCOL)
    end
    redis.call('PEXPIRE', KEYS[i], ARGV[a + 5])
    renewed[i - 2] = 1
  else
    renewed[i - 2] = 0
  end
end
return renewed
""",
    keys_per_item=1,
    args_per_item=6,
)

STATUS = BatchScript(
    "status",
    """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark.
-- Item: KEYS state. Each reply: {status or false, 1 if the waiter is alive else 0, Redis
-- time in ms}; a durable request's waiter always counts as alive. A responder judges a
-- deadline by this time, never by its own clock.
local alive = redis.call('EXISTS', KEYS[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local statuses = {}
for i = 3, #KEYS do
  local st = redis.call('HMGET', KEYS[i], F_STATUS, F_DURABLE)
  statuses[i - 2] = {st[1], st[2] and 1 or alive, now}
end
return statuses
""",
    keys_per_item=1,
    args_per_item=0,
)

_ENTRIES = """
-- Entries of a stream to settle at the end of a batch: acknowledged in one XACK per group,
-- deleted in one XDEL, however many items the batch has.
local acks, groups, deletes = {}, {}, {}
local function ack(group, entry)
  if not acks[group] then
    acks[group] = {}
    table.insert(groups, group)  -- in order: the script's writes are the same every run
  end
  table.insert(acks[group], entry)
end
local function settle_entries(stream)
  for _, group in ipairs(groups) do
    redis.call('XACK', stream, group, unpack(acks[group]))
  end
  if #deletes > 0 then
    redis.call('XDEL', stream, unpack(deletes))
  end
end
"""

RESOLVE = BatchScript(
    "resolve",
    _ENTRIES
    + ADMIT
    + """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark, and with settle '1' the
-- request stream (one server only: it is on the queue's slot); ARGV retention_ms, settle.
-- Item: KEYS state; ARGV status, answer, request id, group, entry ('' for none), deadline_ms
-- (the signed request's deadline; '0' for none: then the state's, for unsigned callers;
-- an expiry with one is a responder's, judged by Redis time: 'early' before it).
-- The first resolution of a request wins: it is recorded and sent to the waiter. An
-- answer '' is the waiter's own plain end of a plain request (a withdrawal, an expiry
-- with no default, unsigned): the status says it all, so the state stores no answer and
-- the waiter's reply stream gets no entry (it learns the outcome from this reply).
-- What an item may do is the admission rule (ADMIT): an answer needs the request open,
-- before its deadline (by Redis time), and its waiter alive (a durable request's waiter
-- always counts as alive: it outlives its process). Redis is untrusted: the state may be
-- forged or lost. So an answer before the deadline to a request whose state is resolved
-- with another answer, or missing, is *contested*: it is sent to the waiter after the
-- stored answer and kept in the state (field 'c:<sha1>', a few at most), and the waiter,
-- which checks both, takes the valid one.
-- With settle, an item's entry is acknowledged for its group and deleted if the request
-- is no longer open (resolved, contested, or forgotten), so that no group reads it from
-- now on; an open one is left alone. Each reply: {settled (1 or 0), outcome, stored
-- answer}, the outcome 'ok' | 'unknown' | 'late' | 'gone' | 'contested' | 'early' | the
-- status resolved before (with the answer stored then).
local settle = ARGV[2] == '1'
local first = settle and 4 or 3
local replies = {}
for i = first, #KEYS do
  local a = 2 + (i - first) * 6
  local status, answer, id = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local item = 'end'
  if status == 'answered' then
    item = 'answer'
  elseif status == 'expired' and ARGV[a + 6] ~= '0' then
    item = 'expiry'
  end
  local reply = admit(KEYS[i], item, id, answer, ARGV[a + 6], KEYS)
  if not reply then
    if answer == '' then
      redis.call('HSET', KEYS[i], F_STATUS, status)
    else
      redis.call('HSET', KEYS[i], F_STATUS, status, F_ANSWER, answer)
      send_reply(KEYS[1], id, answer, false)
    end
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
    reply = {'ok'}
  end
  local group, entry = ARGV[a + 4], ARGV[a + 5]
  local settled = 0
  local open = reply[1] == 'late' or reply[1] == 'gone' or reply[1] == 'early'
  if settle and entry ~= '' and not open then
    ack(group, entry)
    table.insert(deletes, entry)
    settled = 1
  end
  replies[#replies + 1] = {settled, reply[1], reply[2]}
end
if settle then
  settle_entries(KEYS[3])
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return replies
""",
    keys_per_item=1,
    args_per_item=6,
)

SETTLE = BatchScript(
    "settle",
    _ENTRIES
    + """
-- On a queue's slot. Shared: KEYS events stream, request stream, audit stream; ARGV min
-- event id, retention_ms, min audit id, audit max entries. Item: ARGV event, group, entry
-- to acknowledge, entry to delete, audit record ('' for none of each). Publishes events
-- (the stream trimmed by age, and gone once idle for the retention), acknowledges the
-- entries of resolved requests, deletes them so that groups that have not read them yet
-- never do, and adds audit records (the stream trimmed by length and by age).
local n = 0
local published = false
local audited = false
for a = 5, #ARGV, 5 do
  if ARGV[a] ~= '' then
    redis.call('XADD', KEYS[1], 'MINID', '~', ARGV[1], '*', E_EVENT, ARGV[a])
    published = true
  end
  if ARGV[a + 2] ~= '' then
    ack(ARGV[a + 1], ARGV[a + 2])
  end
  if ARGV[a + 3] ~= '' then
    table.insert(deletes, ARGV[a + 3])
  end
  if ARGV[a + 4] ~= '' then
    redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[4], '*', E_REQUEST, ARGV[a + 4])
    audited = true
  end
  n = n + 1
end
if audited then
  redis.call('XTRIM', KEYS[3], 'MINID', '~', ARGV[3])
end
settle_entries(KEYS[2])
if published then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return n
""",
    keys_per_item=0,
    args_per_item=5,
)

RECORD = BatchScript(
    "record",
    """
-- On an agent's waiter slot (Keys.agent_audit): the agent's own audit stream, which only
-- its user may write. Shared: KEYS audit stream; ARGV min audit id, audit max entries.
-- Item: ARGV audit record. Adds the records of the waits that ended, the stream trimmed
-- by length and by age (each writer caps its own stream: threat-model line S8).
for a = 3, #ARGV do
  redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[2], '*', E_REQUEST, ARGV[a])
end
redis.call('XTRIM', KEYS[1], 'MINID', '~', ARGV[1])
return #ARGV - 2
""",
    keys_per_item=0,
    args_per_item=1,
)

DEAD_LETTER = BatchScript(
    "dead_letter",
    """
-- On a queue's slot. Shared: KEYS dead-letter stream, the stream read (by a consumer
-- group); ARGV max entries, protocol ('1' or '2': from 2 on, field 'p' of the dead letter).
-- Item: ARGV entry id, group, error, original bytes (bounded).
-- A group that cannot or will not take an entry settles it for itself only: it
-- acknowledges it, and the first of its consumers to do so (XACK says the entry was
-- still pending for the group) adds its dead letter, which names the group: one dead
-- letter per group that refused the entry, however often its consumers read it. The
-- entry is never deleted here: it stays in the stream for every other group, until the
-- stream's age rule trims it (MINID at each publish, see PUBLISH) or its request is
-- resolved. Each reply: 1 if this item added the group's dead letter, else 0.
local added = {}
for a = 3, #ARGV, 4 do
  local id, group = ARGV[a], ARGV[a + 1]
  if redis.call('XACK', KEYS[2], group, id) == 1 then
    local fields = {D_ERROR, ARGV[a + 2], D_STREAM, KEYS[2], D_ENTRY, id, D_GROUP, group,
      D_RAW, ARGV[a + 3]}
    if ARGV[2] ~= '1' then
      fields[11], fields[12] = F_PROTOCOL, ARGV[2]
    end
    redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[1], '*', unpack(fields))
    added[#added + 1] = 1
  else
    added[#added + 1] = 0
  end
end
return added
""",
    keys_per_item=0,
    args_per_item=4,
)


REOPEN = BatchScript(
    "reopen",
    """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark.
-- Item: KEYS state; ARGV refused answer, why. Opens the request again if its state still
-- holds exactly the answer the waiter refused (a forgery), recording why in field 'w' (for
-- whoever sent it: toolnexus answer): 1 if reopened, else 0.
local reopened = {}
for i = 3, #KEYS do
  local a = (i - 3) * 2
  if redis.call('HGET', KEYS[i], F_ANSWER) == ARGV[a + 1] then
    redis.call('HSET', KEYS[i], F_STATUS, S_OPEN, F_WHY, ARGV[a + 2])
    redis.call('HDEL', KEYS[i], F_ANSWER)
    reopened[i - 2] = 1
  else
    reopened[i - 2] = 0
  end
end
return reopened
""",
    keys_per_item=1,
    args_per_item=2,
)

VOTE = BatchScript(
    "vote",
    ADMIT
    + """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark; ARGV retention_ms.
-- Item: KEYS state; ARGV answer, request id, voter, '1' accepts or '0' declines, need,
-- decline mode ('veto' or 'count'), replaces ('' for none), deadline_ms (the signed
-- request's; '0' for none: then the state's). A quorum vote (SPEC §14): stored once per
-- voter (the person it claims; see toolnexus.voting) as field 'y:<voter>' or
-- 'n:<voter>'. Admitted by the same rule as RESOLVE's answers (ADMIT): the request
-- open, before its deadline (by Redis time), its waiter alive (or the request durable);
-- a vote is not contested with a stored resolution (the waiter checks every vote instead).
-- A vote whose voter has the same vote stored already (a retry) counts as before. A vote
-- whose voter has another vote stored is *contested*: the stored one may be a forgery
-- (anyone who can write the state can fill a voter's slot), so the vote is sent to the
-- waiter, which checks both and casts it itself, with ``replaces`` the stored vote it
-- refused (removed first, if it is still there), when the stored one is not genuine.
-- The vote that decides (the need-th accept; a decline that vetoes, or the need-th
-- decline) resolves the request and is sent to the waiter, which reads every vote from
-- the state and checks each before it takes the outcome.
-- Each reply: {'ok'} | {'unknown'} | {'late'} | {'gone'} | {status, stored answer} |
-- {'contested', the vote stored} | {'counted', accepts, declines, accepting voter...}.
local replies = {}
for i = 3, #KEYS do
  local a = 1 + (i - 3) * 8
  local answer, id, voter = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local yes, need, mode = ARGV[a + 4] == '1', tonumber(ARGV[a + 5]), ARGV[a + 6]
  local replaces = ARGV[a + 7]
  local refused = admit(KEYS[i], 'vote', id, answer, ARGV[a + 8], KEYS)
  if refused then
    replies[i - 2] = refused
  else
    local slots = {F_YES .. voter, F_NO .. voter}
    if replaces ~= '' then
      for _, slot in ipairs(slots) do
        if redis.call('HGET', KEYS[i], slot) == replaces then
          redis.call('HDEL', KEYS[i], slot)
        end
      end
    end
    local mine = redis.call('HGET', KEYS[i], slots[1]) or redis.call('HGET', KEYS[i], slots[2])
    if mine and mine ~= answer then
      send_reply(KEYS[1], id, answer, false)
      replies[i - 2] = {'contested', mine}
    else
      if not mine then
        redis.call('HSET', KEYS[i], yes and slots[1] or slots[2], answer)
      end
      local accepts, declines, approvers = 0, 0, {}
      for _, name in ipairs(redis.call('HKEYS', KEYS[i])) do
        local prefix = string.sub(name, 1, 2)
        if prefix == F_YES then
          accepts = accepts + 1
          approvers[#approvers + 1] = string.sub(name, 3)
        elseif prefix == F_NO then
          declines = declines + 1
        end
      end
      if not mine and (
          (yes and accepts >= need) or (not yes and (mode == 'veto' or declines >= need))) then
        redis.call('HSET', KEYS[i], F_STATUS, 'answered', F_ANSWER, answer)
        redis.call('PEXPIRE', KEYS[i], ARGV[1])
        send_reply(KEYS[1], id, answer, false)
        replies[i - 2] = {'ok'}
      else
        replies[i - 2] = {'counted', accepts, declines, unpack(approvers)}
      end
    end
  end
end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return replies
""",
    keys_per_item=1,
    args_per_item=8,
)

UNVOTE = BatchScript(
    "unvote",
    """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark.
-- Item: KEYS state; ARGV vote field ('' for none), refused vote, deciding answer ('' for
-- none). The waiter refused stored votes of a quorum (SPEC §14): each is removed if the
-- state still holds exactly it, and the request is opened again if it is still resolved
-- by the deciding answer the waiter refused: 1 if reopened, else 0.
local reopened = {}
for i = 3, #KEYS do
  local a = (i - 3) * 3
  local field, refused, decided = ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  if field ~= '' and redis.call('HGET', KEYS[i], field) == refused then
    redis.call('HDEL', KEYS[i], field)
  end
  if decided ~= '' and redis.call('HGET', KEYS[i], F_STATUS) == 'answered'
      and redis.call('HGET', KEYS[i], F_ANSWER) == decided then
    redis.call('HSET', KEYS[i], F_STATUS, S_OPEN)
    redis.call('HDEL', KEYS[i], F_ANSWER)
    reopened[i - 2] = 1
  else
    reopened[i - 2] = 0
  end
end
return reopened
""",
    keys_per_item=1,
    args_per_item=3,
)

TAKE = BatchScript(
    "take",
    """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark; ARGV retention_ms.
-- Item: KEYS state; ARGV answer. The waiter took a contested answer (see RESOLVE) after
-- refusing the one the state held: the state records it, so that later answers are refused
-- as answered and an attach finds it. Each reply: 1.
local taken = {}
for i = 3, #KEYS do
  redis.call('HSET', KEYS[i], F_STATUS, 'answered', F_ANSWER, ARGV[i - 1])
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
  taken[i - 2] = 1
end
return taken
""",
    keys_per_item=1,
    args_per_item=1,
)

REACHED = BatchScript(
    "reached",
    """
-- On a waiter's slot. Shared: KEYS reply stream, liveness mark.
-- Item: KEYS state; ARGV queues reached. Records, in field 'q' of a state that still
-- exists, the queues a request was published to and its entries there (an escalating
-- or a durable request, SPEC §14): 1 if recorded.
local recorded = {}
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('HSET', KEYS[i], F_QUEUES, ARGV[i - 2])
    recorded[i - 2] = 1
  else
    recorded[i - 2] = 0
  end
end
return recorded
""",
    keys_per_item=1,
    args_per_item=1,
)

REPLACE = BatchScript(
    "replace",
    """
-- On a store's slot (toolnexus.Store.replace). Shared: KEYS the store's hash; ARGV its TTL
-- in whole seconds. Item: ARGV field, old value, new value. Compare-and-set: the field
-- takes the new value only if it holds exactly the old one, and the store gets the TTL as
-- a write gives it (a new store gets it, an existing one is only ever extended). Each
-- reply: 1 if the field holds the new value after it (this item, or the same one retried
-- after its reply was lost), else 0 (it held something else, or nothing: no write).
local replaced = {}
for i = 2, #ARGV, 3 do
  local held = redis.call('HGET', KEYS[1], ARGV[i])
  if held == ARGV[i + 1] and held ~= ARGV[i + 2] then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 2])
    redis.call('EXPIRE', KEYS[1], ARGV[1], 'NX')
    redis.call('EXPIRE', KEYS[1], ARGV[1], 'GT')
    held = ARGV[i + 2]
  end
  if held == ARGV[i + 2] then
    replaced[#replaced + 1] = 1
  else
    replaced[#replaced + 1] = 0
  end
end
return replaced
""",
    keys_per_item=0,
    args_per_item=3,
)

SCRIPTS = (
    OPEN,
    PUBLISH,
    OPEN_PUBLISH,
    STATUS,
    RESOLVE,
    SETTLE,
    RECORD,
    DEAD_LETTER,
    REOPEN,
    TAKE,
    REACHED,
    RENEW,
    VOTE,
    UNVOTE,
    REPLACE,
)
