"""Every Redis key and stream name toolnexus uses, built here and nowhere else.

Keys carry Redis Cluster hash tags (the ``{...}`` part) so that the keys one atomic
step touches share a slot, while queues and waiters spread over slots:

- ``{ns:q:<queue>}:requests``   request stream of a queue (consumer groups read it)
- ``{ns:q:<queue>}:events``     answered / expired / withdrawn / completed events
- ``{ns:q:<queue>}:dead``       dead letters: entries that could not be read, with the error
- ``{ns:q:<queue>}:audit:responders`` audit records responders write: the ends they
                               resolved themselves (an expiry or withdrawal of a request
                               whose waiter could not); written and capped by responders only
- ``{ns:w:<durable>}:audit``    audit records of one agent's waits on a queue: how each ended
                               (the answer it returned, who answered, how it was verified),
                               under that agent's own waiter keys (:meth:`Keys.agent_audit`),
                               so only that agent's user writes or caps it: no responder can
                               trim or delete the record of what it answered
- ``{ns:q:<queue>}:audit``      the audit stream of releases before the two above: written
                               only by their processes during a rolling upgrade, and
                               still read by ``toolnexus audit``
- ``{ns:w:<waiter>}:answers``   reply stream of one waiting process (its reader blocks on it)
- ``{ns:w:<waiter>}:r:<id>``    state of one request: status, deadline, answer (and a durable
                               request itself: a plain one lives in its stream entry)
- ``{ns:w:<waiter>}:alive``     liveness mark of one waiting process (a key with a TTL),
                               ``"2 <version>"`` (protocol 1: ``"1"``)
- ``{ns:w:<durable>}:...``      the same for an agent's durable requests on a queue, under
                               the waiter id :meth:`Keys.durable_waiter` names (no liveness mark)
- ``{ns:q:<queue>}:route:<id>`` which waiter a request belongs to and its entry id in the
                               queue's request stream, ``"<waiter> <entry id> 2"`` (protocol
                               1: ``"<waiter> <entry id>"``; answering
                               by id alone reads the request there): set only if absent or
                               already that waiter's, so an id is owned by the waiter that
                               published it first
- ``{ns:q:<queue>}:workers``    heartbeats of the queue's responder workers (``group/consumer``)
- ``{ns:q:<queue>}:store:<name>`` a worker's store (:meth:`toolnexus.Broker.store`): a hash
                               that expires as a whole (a chat bot's messages: request
                               id -> where its message is)
- ``{ns:w:<durable>}:store:<name>`` a store of one agent alone (``broker.store(name,
                               agent=True)``: durable MCP tasks' records, tool-call
                               ledgers), under that agent's own waiter keys

A waiter id is ``<agent>.<16 hex digits>``: the agent that waits (the broker option
``agent``, see :func:`agent_problem`) comes first, so that one ACL key pattern,
``{ns:w:<agent>.*}:*`` (:func:`waiter_tag_pattern`), gives an agent's Redis user its own
reply streams, states and durable requests and nobody else's (``toolnexus acl``,
:mod:`toolnexus.cli._acl`).

The resolve script touches requests' states, their waiter's reply stream and liveness
mark: all are tagged by the waiter, so it runs on one slot. The publish script adds requests
to the stream and records their routes: all tagged by the queue.

One of the three files that tell the architecture: the waiter side
(:mod:`toolnexus.redis_broker._waiter`), the responder side
(:mod:`toolnexus.redis_broker._responder`) and the key names (:mod:`toolnexus.keys`).
"""

from __future__ import annotations

import hashlib
import re
import uuid

from .errors import ConfigurationError

AGENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What an agent's name looks like: it starts its waiter ids, so it is part of key names
and of ACL key patterns (no dot, which ends it, and nothing a glob pattern treats
specially)."""

DEFAULT_AGENT = "anon"
"""The agent name of a broker that is given none and logs in as no Redis user."""

WAITER_ID = re.compile(rf"(?P<agent>{AGENT_NAME.pattern})\.[0-9a-f]{{16}}")
"""What a waiter id looks like, ``<agent>.<16 hex digits>`` (it is part of key names, so
nothing else is accepted)."""

MAX_REQUEST_ID_CHARS = 200

MCP_TASKS_STORE = "mcp-tasks"
"""The agent store (:meth:`Keys.agent_store`) that keeps durable MCP tasks' records: one of
the two stores an agent's Redis user may write (``toolnexus acl``)."""

TOOL_CALLS_STORE = "tool-calls"
"""The agent store (:meth:`Keys.agent_store`) that keeps the tool-call ledger of the
framework adapters (:class:`toolnexus.frameworks.Ledger`: each call's digests and the claim
of its single run): the other store an agent's Redis user may write, and no responder
(``toolnexus acl``)."""


def check_request_id(request_id: str) -> str | None:
    """Why ``request_id`` cannot be part of a key name, or None if it can."""
    if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
        return f"a request id must have 1 to {MAX_REQUEST_ID_CHARS} characters"
    if not request_id.isprintable() or " " in request_id:
        return "a request id must be printable, without spaces"
    return None


def agent_problem(name: str) -> str | None:
    """Why ``name`` cannot name an agent (see :data:`AGENT_NAME`), or None if it can."""
    if not AGENT_NAME.fullmatch(name):
        return "must be 1 to 64 letters, digits, '_' or '-'"
    return None


def new_waiter_id(agent: str) -> str:
    """A fresh waiter id of agent ``agent`` (a name :func:`agent_problem` accepts)."""
    return f"{agent}.{uuid.uuid4().hex[:16]}"


def name_problem(value: str) -> str | None:
    """Why ``value`` cannot be a namespace or queue name (part of key names), or None."""
    if not value or any(c in value for c in "{}: \n"):
        return "must be non-empty without braces, colons or whitespace"
    return None


def _check_name(what: str, value: str) -> str:
    problem = name_problem(value)
    if problem is not None:
        raise ConfigurationError(f"{what} {value!r} {problem}")
    return value


def _glob_escape(text: str) -> str:
    """``text`` matched literally by a Redis glob pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def waiter_tag_pattern(namespace: str, agent: str | None = None) -> str:
    """An ACL key pattern's hash-tag part matching the waiter keys of agent ``agent``, or
    of every waiter (None): ``{ns:w:<agent>.*}``. No other agent's keys match it, since an
    agent name has no dot."""
    waiters = "*" if agent is None else f"{agent}.*"
    return f"{{{_glob_escape(namespace)}:w:{waiters}}}"


def queue_tag_pattern(namespace: str) -> str:
    """An ACL key pattern's hash-tag part matching the keys of every queue: ``{ns:q:*}``."""
    return f"{{{_glob_escape(namespace)}:q:*}}"


WORKERS_PATTERN = "{*:q:*}:workers"
"""A ``SCAN MATCH`` pattern for the heartbeats of every queue of every namespace."""


def queue_of_workers(key: str) -> tuple[str, str] | None:
    """The namespace and queue whose heartbeats are ``key`` (a key :data:`WORKERS_PATTERN`
    matched), or None if it is not such a key."""
    if not (key.startswith("{") and key.endswith("}:workers")):
        return None
    namespace, q, queue = key[1 : -len("}:workers")].partition(":q:")
    if not q or name_problem(namespace) is not None or name_problem(queue) is not None:
        return None
    return namespace, queue


class Keys:
    """Key names for one namespace and queue."""

    def __init__(self, namespace: str = "toolnexus", queue: str = "default") -> None:
        self.namespace = _check_name("namespace", namespace)
        self.queue = _check_name("queue", queue)
        self._tag = tag = f"{{{namespace}:q:{queue}}}"
        self.requests = f"{tag}:requests"
        self.events = f"{tag}:events"
        self.dead = f"{tag}:dead"
        self.audit = f"{tag}:audit"
        self.responder_audit = f"{tag}:audit:responders"
        self._durable = hashlib.sha256(f"{namespace}\0{queue}".encode()).hexdigest()[:16]

    def durable_waiter(self, agent: str) -> str:
        """The waiter id under which agent ``agent``'s durable requests on this queue live
        (their states and reply stream): the agent's name and 16 hex digits of a digest of
        namespace and queue, so that any process of that agent finds a durable request by
        its id alone (SPEC §14), and no other agent's does."""
        return f"{agent}.{self._durable}"

    def agent_audit(self, agent: str) -> str:
        """The audit stream of agent ``agent``'s waits on this queue: under its durable
        waiter id (:meth:`durable_waiter`), so the ACL key pattern of its waiter keys covers
        it, and no responder's or other agent's does."""
        return f"{{{self.namespace}:w:{self.durable_waiter(agent)}}}:audit"

    def agent_audits_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for the audit stream of every agent on this queue (it
        may match other keys too: see :meth:`is_agent_audit`)."""
        return f"{{{_glob_escape(self.namespace)}:w:*.{self._durable}}}:audit"

    def is_agent_audit(self, key: str) -> bool:
        """Whether ``key`` is the audit stream of an agent on this queue (any agent)."""
        head, tail = f"{{{self.namespace}:w:", "}:audit"
        found = WAITER_ID.fullmatch(key[len(head) : -len(tail)])
        return (
            key.startswith(head)
            and key.endswith(tail)
            and found is not None
            and key == self.agent_audit(found["agent"])
        )

    def answers(self, waiter: str) -> str:
        """The reply stream of waiter ``waiter``."""
        return f"{{{self.namespace}:w:{waiter}}}:answers"

    def alive(self, waiter: str) -> str:
        """The liveness mark of waiter ``waiter``: present while it is alive."""
        return f"{{{self.namespace}:w:{waiter}}}:alive"

    def state(self, waiter: str, request_id: str) -> str:
        """The state hash of request ``request_id`` of waiter ``waiter``."""
        return f"{{{self.namespace}:w:{waiter}}}:r:{request_id}"

    def route(self, request_id: str) -> str:
        """The key naming the waiter of ``request_id`` and its entry in the queue's request
        stream (in the queue's slot; its value: ``redis_broker._layout.route_value``)."""
        return f"{self._tag}:route:{request_id}"

    def heartbeats(self) -> str:
        """The hash of the queue's worker heartbeats: field ``group/consumer``, value a
        :class:`~toolnexus.models.Heartbeat` (in the queue's slot)."""
        return f"{self._tag}:workers"

    def alive_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for every waiter's liveness mark in this namespace."""
        return f"{waiter_tag_pattern(self.namespace)}:alive"

    def durable_states_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for the state of every durable request of this queue,
        of every agent (it may match other keys too: see :meth:`is_durable_state`)."""
        return f"{{{_glob_escape(self.namespace)}:w:*.{self._durable}}}:r:*"

    def is_durable_state(self, key: str) -> bool:
        """Whether ``key`` is the state of a durable request of this queue (of any agent)."""
        head = f"{{{self.namespace}:w:"
        waiter, tail = key[len(head) :].partition("}:r:")[::2]
        found = WAITER_ID.fullmatch(waiter)
        return (
            key.startswith(head)
            and found is not None
            and waiter == self.durable_waiter(found["agent"])
            and check_request_id(tail) is None
        )

    def requests_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for the request stream of every queue in this namespace."""
        return f"{queue_tag_pattern(self.namespace)}:requests"

    def queue_of(self, requests_key: str) -> str | None:
        """The queue whose request stream is ``requests_key`` (a key
        :meth:`requests_pattern` matched), or None if it is not one of this namespace's."""
        head, tail = f"{{{self.namespace}:q:", "}:requests"
        if requests_key.startswith(head) and requests_key.endswith(tail):
            queue = requests_key[len(head) : -len(tail)]
            if queue and not any(c in queue for c in "{}: \n"):
                return queue
        return None

    def store(self, name: str) -> str:
        """The hash of the worker store ``name`` (:meth:`toolnexus.Broker.store`; the chat
        bots' ``slack``, ``telegram``): field a key, value bytes (in the queue's slot).

        Raises:
            ConfigurationError: ``name`` is empty or has braces, colons or whitespace.
        """
        return f"{self._tag}:store:{_check_name('store name', name)}"

    def agent_store(self, agent: str, name: str) -> str:
        """The hash of agent ``agent``'s own store ``name`` on this queue
        (``broker.store(name, agent=True)``): under the agent's durable waiter id
        (:meth:`durable_waiter`), so the ACL key pattern of its waiter keys covers it and no
        other agent's does.

        Raises:
            ConfigurationError: ``name`` is empty or has braces, colons or whitespace.
        """
        waiter = self.durable_waiter(agent)
        return f"{{{self.namespace}:w:{waiter}}}:store:{_check_name('store name', name)}"

    def __repr__(self) -> str:
        return f"Keys(namespace={self.namespace!r}, queue={self.queue!r})"


__all__ = [
    "AGENT_NAME",
    "DEFAULT_AGENT",
    "MAX_REQUEST_ID_CHARS",
    "MCP_TASKS_STORE",
    "TOOL_CALLS_STORE",
    "WAITER_ID",
    "WORKERS_PATTERN",
    "Keys",
    "agent_problem",
    "check_request_id",
    "name_problem",
    "new_waiter_id",
    "queue_of_workers",
    "queue_tag_pattern",
    "waiter_tag_pattern",
]
