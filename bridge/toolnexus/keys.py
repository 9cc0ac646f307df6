"""Every Redis key and stream name toolnexus uses, built here and nowhere else.

Keys carry Redis Cluster hash tags (the ``{...}`` part) so that the keys one atomic
step touches share a slot, while queues and waiters spread over slots:

- ``{ns:q:<queue>}:requests``   request stream of a queue (consumer groups read it)
- ``{ns:q:<queue>}:events``     answered / expired / withdrawn / completed events
- ``{ns:q:<queue>}:dead``       dead letters: entries that could not be read, with the error
- ``{ns:q:<queue>}:audit``      audit records: how each request was resolved, and by whom
- ``{ns:w:<waiter>}:answers``   reply stream of one waiting process (its reader blocks on it)
- ``{ns:w:<waiter>}:r:<id>``    state of one request: status, deadline, request, answer
- ``{ns:w:<waiter>}:alive``     liveness mark of one waiting process (a key with a TTL)
- ``{ns:w:<durable>}:...``      the same for the queue's durable requests, under the waiter
                               id :meth:`Keys.durable_waiter` names (no liveness mark)
- ``{ns:q:<queue>}:route:<id>`` which waiter a request belongs to (answering by id alone):
                               set only if absent or already that waiter's, so an id
                               is owned by the waiter that published it first
- ``{ns:q:<queue>}:workers``    heartbeats of the queue's responder workers (``group/consumer``)
- ``{ns:q:<queue>}:chat:<name>`` a chat worker's messages: request id -> where its message is

The resolve script touches requests' states, their waiter's reply stream and liveness
mark: all are tagged by the waiter, so it runs on one slot. The publish script adds requests
to the stream and records their routes: all tagged by the queue.
"""

from __future__ import annotations

import hashlib
import re

from .errors import ConfigurationError

WAITER_ID = re.compile(r"[0-9a-f]{16}")
"""What a waiter id looks like (it is part of key names, so nothing else is accepted)."""

MAX_REQUEST_ID_CHARS = 200


def check_request_id(request_id: str) -> str | None:
    """Why ``request_id`` cannot be part of a key name, or None if it can."""
    if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
        return f"a request id must have 1 to {MAX_REQUEST_ID_CHARS} characters"
    if not request_id.isprintable() or " " in request_id:
        return "a request id must be printable, without spaces"
    return None


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

    def durable_waiter(self) -> str:
        """The waiter id under which the queue's durable requests live (their states and
        reply stream): 16 hex digits of a digest of namespace and queue, so that any process
        finds a durable request by its id alone (SPEC §14)."""
        return hashlib.sha256(f"{self.namespace}\0{self.queue}".encode()).hexdigest()[:16]

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
        """The key naming the waiter of ``request_id`` (in the queue's slot)."""
        return f"{self._tag}:route:{request_id}"

    def heartbeats(self) -> str:
        """The hash of the queue's worker heartbeats: field ``group/consumer``, value a
        :class:`~toolnexus.models.Heartbeat` (in the queue's slot)."""
        return f"{self._tag}:workers"

    def alive_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for every waiter's liveness mark in this namespace."""
        return f"{{{_glob_escape(self.namespace)}:w:*}}:alive"

    def durable_states_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for the state of every durable request of this queue."""
        return f"{{{_glob_escape(self.namespace)}:w:{self.durable_waiter()}}}:r:*"

    def requests_pattern(self) -> str:
        """A ``SCAN MATCH`` pattern for the request stream of every queue in this namespace."""
        return f"{{{_glob_escape(self.namespace)}:q:*}}:requests"

    def queue_of(self, requests_key: str) -> str | None:
        """The queue whose request stream is ``requests_key`` (a key
        :meth:`requests_pattern` matched), or None if it is not one of this namespace's."""
        head, tail = f"{{{self.namespace}:q:", "}:requests"
        if requests_key.startswith(head) and requests_key.endswith(tail):
            queue = requests_key[len(head) : -len(tail)]
            if queue and not any(c in queue for c in "{}: \n"):
                return queue
        return None

    def chat(self, name: str) -> str:
        """The hash of chat worker ``name``'s messages (``slack``, ``telegram``): field a
        request id, value where that request's message is (in the queue's slot).

        Raises:
            ConfigurationError: ``name`` is empty or has braces, colons or whitespace.
        """
        return f"{self._tag}:chat:{_check_name('chat worker name', name)}"

    def __repr__(self) -> str:
        return f"Keys(namespace={self.namespace!r}, queue={self.queue!r})"
