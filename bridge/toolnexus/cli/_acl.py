"""``toolnexus acl``: the Redis ACL file of a fleet, from the names of its agents,
responders and operators (``deploy/redis/users.acl`` is its output for the example fleet).

Each user gets only the commands its role needs, each with the key patterns it needs
(Redis 7 selectors, ``%R~``/``%W~`` for read-only and write-only keys):

- an **agent** publishes requests, reads its own reply streams, keeps its own states,
  liveness marks and durable requests, records its expiries and withdrawals, writes
  its own audit records (``<w>:audit``) and dead letters, reads heartbeats (to warn when
  nobody reads a queue), and keeps its durable MCP tasks' records and its tool-call
  ledger (its own stores ``mcp-tasks`` and ``tool-calls``,
  :meth:`toolnexus.keys.Keys.agent_store`: a ledger claims a call's single run with
  ``HSETNX`` and replaces a forged claim with a script, so no responder, which writes
  queue stores, can delete or write a claim). Its
  waiter keys are ``{ns:w:<agent>.*}:...`` (:func:`toolnexus.keys.waiter_tag_pattern`):
  a broker waits as the agent named by its option ``agent`` (by default its Redis user),
  so no agent user can read, write or attach to another agent's answers, states, durable
  requests or stores.
- a **responder** reads and acknowledges its consumer group's requests, answers (writes
  any waiter's state and reply stream, never reads a reply stream), dead-letters garbage,
  follows events, reads liveness marks and routes, keeps heartbeats and workers' stores
  (chat message maps).
- **ops** reads every key of the namespace and may only clear dead letters and requeue
  the requests they hold.

The ``default`` user is off. No line holds a password: ``deploy/redis/set-passwords.sh``
adds each user's as a hash, from ``REDIS_<USER>_PASSWORD`` (:func:`password_variable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import ConfigurationError
from ..keys import (
    MCP_TASKS_STORE,
    TOOL_CALLS_STORE,
    agent_problem,
    name_problem,
    queue_tag_pattern,
    waiter_tag_pattern,
)

AGENT_RULES = (
    "+ping +hello +auth +select +client|setname +script|load +time +multi +exec +discard "
    "+evalsha "
    "~<q>:requests ~<q>:route:* ~<q>:events ~<q>:audit ~<q>:audit:responders ~<w>:answers "
    "~<w>:r:* ~<w>:alive ~<w>:audit "
    "(%W~<q>:requests %W~<q>:events %W~<q>:dead %W~<q>:audit %W~<w>:answers %W~<w>:audit "
    "+xadd) "
    "(%W~<q>:requests +xdel) "
    "(~<q>:route:* +set +get) "
    "(~<w>:r:* %W~<w>:answers +exists +hexists +hget +hmget +hgetall +hlen +hset +hdel +pexpire) "
    "(%R~<w>:answers +xread +xrevrange) "
    "(%W~<w>:answers %W~<q>:audit %W~<w>:audit +xtrim) "
    "(~<w>:alive +set +pexpire +del) "
    "(~<q>:events +pexpire) "
    "(%R~<q>:workers +hgetall) "
    f"(~<w>:store:{MCP_TASKS_STORE} +hget +hset +hdel +expire) "
    f"(~<w>:store:{TOOL_CALLS_STORE} +hget +hset +hsetnx +hdel +expire +evalsha)"
)
"""An agent's rules: ``<w>`` is the hash tag of its own waiter keys alone. Its waits'
audit records go to its own ``<w>:audit`` (which it caps). The responders' audit stream
``<q>:audit:responders`` is in the first selector only because the settle script its
waiters run names it (and never writes it for them): no selector lets an agent add to it
or trim it. ``<q>:audit`` (``XADD``, ``XTRIM``) is the previous release's audit stream,
which that release's agents write during a rolling upgrade."""

RESPONDER_RULES = (
    "+ping +hello +auth +select +client|setname +script|load +time +multi +exec +discard "
    "+evalsha ~<q>:requests ~<q>:events ~<w>:answers ~<w>:r:* ~<w>:alive ~<q>:dead ~<q>:audit "
    "~<q>:audit:responders "
    "(~<q>:requests +xgroup|create +xgroup|delconsumer +xinfo|consumers +xreadgroup +xack "
    "+xclaim +xautoclaim +xpending +xdel) "
    "(%W~<q>:events %W~<q>:dead %W~<q>:audit %W~<q>:audit:responders %W~<w>:answers +xadd) "
    "(%W~<q>:audit %W~<q>:audit:responders +xtrim) "
    "(%R~<q>:events +xread) "
    "(%R~<q>:route:* +get) "
    "(~<w>:r:* %W~<w>:answers +hget +hmget +hkeys +hlen +hset +pexpire) "
    "(%R~<w>:alive +get +exists +pttl) "
    "(~<q>:workers +hset +hdel +hgetall +pexpire) "
    "(%R~<q>:requests %R~<q>:dead +xlen) "
    "(%R~<q>:requests +xrange) "
    "(~<q>:events +xdel +pexpire) "
    "(~<q>:store:* +hget +hset +hsetnx +hdel +hgetall +expire)"
)
"""A responder's rules: ``<w>`` is the hash tag of every waiter's keys. ``XRANGE`` of the
request stream is answering by id's: it reads the one entry a route names (a plain
request's state does not hold it); nothing a consumer group would not deliver anyway.
A responder writes and caps the responders' audit stream ``<q>:audit:responders`` (and
``<q>:audit``, the previous release's, during a rolling upgrade), and no key under
``<w>:audit``: no responder can trim or delete an agent's record of what it answered."""

OPS_RULES = (
    "+ping +hello +auth +select +client|setname +info +scan +type +ttl +pttl +exists +get "
    "+hget +hgetall +hkeys +hmget +hlen +hscan +xlen +xrange +xrevrange +xread +xinfo|stream "
    "+xinfo|groups +xinfo|consumers +xpending %R~<q>:* %R~<w>:* "
    "(~<q>:dead +xdel +xtrim) "
    "(%W~<q>:requests +xadd +xdel) "
    "(~<q>:route:* +set) "
    "(~<q>:dead ~<q>:requests ~<q>:route:* +evalsha +script|load)"
)
"""An operator's rules: ``<w>`` is the hash tag of every waiter's keys. The last three
selectors are ``toolnexus dead-letters requeue``'s: a script that deletes a dead letter and adds the
request it held back to its stream (the request's original bytes, which responders verify
again: an operator can add requests, never answer one), deleting its old entry if it is
still there (moved, not copied: a group that has not read it yet reads it once), and
points the request's route at its new entry (which answering by id reads: a route names
the waiter and the entry)."""

DEFAULT_USER = "user default off resetchannels -@all"


def password_variable(user: str) -> str:
    """The variable ``set-passwords.sh`` reads user ``user``'s password from:
    ``REDIS_<USER>_PASSWORD``, upper case, ``-`` as ``_``."""
    return f"REDIS_{user.upper().replace('-', '_')}_PASSWORD"


def _check_users(roles: dict[str, Sequence[str]]) -> None:
    seen: dict[str, str] = {}  # password variable -> user
    for role, users in roles.items():
        for user in users:
            problem = agent_problem(user)
            if problem is not None:
                raise ConfigurationError(f"{role} user {user!r} {problem}")
            if user == "default":
                raise ConfigurationError(f"{role} user 'default': that user stays off")
            variable = password_variable(user)
            if variable in seen:
                raise ConfigurationError(
                    f"{role} user {user!r}: named twice, or its password variable {variable} "
                    f"is also user {seen[variable]!r}'s"
                )
            seen[variable] = user


def users_acl(
    agents: Sequence[str],
    responders: Sequence[str],
    ops: Sequence[str] = (),
    namespace: str = "toolnexus",
) -> str:
    """The ACL file (``users.acl``, without passwords) of a fleet: the ``default`` user
    off, then one line per agent, responder and ops user, for key namespace ``namespace``.

    Raises:
        ConfigurationError: a name that cannot be a user or an agent (1 to 64 letters,
            digits, ``_`` or ``-``), ``default``, a name given twice (or two names sharing
            a password variable), or a bad namespace.
    """
    problem = name_problem(namespace)
    if problem is not None:
        raise ConfigurationError(f"namespace {namespace!r} {problem}")
    _check_users({"agent": agents, "responder": responders, "ops": ops})
    q, every_waiter = queue_tag_pattern(namespace), waiter_tag_pattern(namespace)

    def line(user: str, rules: str, w: str) -> str:
        return f"user {user} on resetchannels -@all " + rules.replace("<q>", q).replace("<w>", w)

    lines = [DEFAULT_USER]
    lines += [line(a, AGENT_RULES, waiter_tag_pattern(namespace, a)) for a in agents]
    lines += [line(r, RESPONDER_RULES, every_waiter) for r in responders]
    lines += [line(o, OPS_RULES, every_waiter) for o in ops]
    return "\n".join(lines) + "\n"


def add_parser(commands: Any) -> None:
    """Add the ``acl`` subcommand's parser to ``commands`` (argparse's subparsers)."""
    parser = commands.add_parser(
        "acl",
        help="print the Redis ACL file (users.acl) of a fleet of agents, responders and ops",
        description=(
            "Print the Redis ACL file of a fleet: each agent user may read and write only its "
            "own reply streams, states and durable requests, each responder may answer any "
            "waiter, each ops user may read everything. Agents must wait as the agent their "
            "user names (the default: the broker option agent, else TOOLNEXUS_AGENT, else "
            "the Redis user). Passwords are added by deploy/redis/set-passwords.sh."
        ),
    )
    parser.add_argument(
        "--agent", action="append", required=True, metavar="NAME", help="an agent user"
    )
    parser.add_argument(
        "--responder", action="append", required=True, metavar="NAME", help="a responder user"
    )
    parser.add_argument(
        "--ops", action="append", default=[], metavar="NAME", help="an operator (read-only) user"
    )
    parser.add_argument(
        "--namespace", default="toolnexus", help="Redis key namespace (default: toolnexus)"
    )
