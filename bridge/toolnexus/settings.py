"""How a process reaches its broker: the default URL, the Redis broker's typed settings,
and the command-line flags every command and worker takes for them.

One default, stated once: :data:`DEFAULT_URL` (Redis on this machine). ``connect()``
without a URL, every ``toolnexus`` command and every worker read ``TOOLNEXUS_URL``, else
use it. The embedded ``memory://`` broker is one URL away (``toolnexus demo`` runs on it
unless ``--url`` says otherwise: a demo needs nothing but this package).

    broker = toolnexus.connect(
        "redis://127.0.0.1:6379/0",
        settings=RedisSettings(namespace="ops", lease_ms=60_000, block_ms=500),
    )
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from ._numeric import MAX_COUNT, MAX_SECONDS, check_number
from .errors import ConfigurationError
from .keys import agent_problem
from .protocol import WRITE_PROTOCOL_VARIABLE, check_write_protocol, default_write_protocol
from .security._signatures import SIGNING_KEY_ENV, SIGNING_OPTIONS, TRUSTED_KEYS_ENV

__all__ = [
    "DEFAULT_URL",
    "DURABILITY",
    "EMBEDDED_URL",
    "REDIS_OPTIONS",
    "SENTINEL_OPTIONS",
    "URL_VARIABLE",
    "RedisSettings",
    "connection_options",
    "connection_parser",
    "default_url",
]

DEFAULT_URL = "redis://127.0.0.1:6379/0"
"""The broker of ``connect()`` without a URL, of every command and of every worker, when
``TOOLNEXUS_URL`` is not set: a Redis server on this machine. A wait on an in-process
broker that nobody else can reach would never be answered, so ``memory://`` is never
taken silently: give it as the URL."""

URL_VARIABLE = "TOOLNEXUS_URL"
"""The environment variable that names the broker URL when none is given."""


def default_url() -> str:
    """``TOOLNEXUS_URL``, else :data:`DEFAULT_URL`."""
    return os.environ.get(URL_VARIABLE) or DEFAULT_URL


SENTINEL_OPTIONS = frozenset({"sentinel_username", "sentinel_password"})
"""Options of the Sentinels themselves (not passed to the master's connections)."""

REDIS_OPTIONS = frozenset(
    {
        "username",
        "password",
        "db",
        "credential_provider",
        "client_name",
        "lib_name",
        "lib_version",
        "driver_info",
        "protocol",
        "health_check_interval",
        "socket_keepalive",
        "socket_keepalive_options",
        "socket_read_size",
        "retry",
        "retry_on_error",
        "retry_on_timeout",
        "redis_connect_func",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_include_verify_flags",
        "ssl_exclude_verify_flags",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_min_version",
        "ssl_ciphers",
        "ssl_password",
        *SENTINEL_OPTIONS,
    }
)
"""redis-py connection options :attr:`RedisSettings.redis_options` passes through (ACL
credentials, TLS files, ...; for ``redis+sentinel://`` also the Sentinels' own
``sentinel_username`` and ``sentinel_password``)."""

DURABILITY = ("none", "wait")
"""``none``: a write counts once its master took it. ``wait``: every pipeline of writes
also waits (``WAIT``) for ``wait_replicas`` replicas of each master it wrote to, at most
``wait_timeout_ms``; it narrows what a failover can lose, never closes it."""


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """The Redis broker's settings, validated when made: every number finite and in range
    (a duration at most ten years), units in the names (``_ms``, ``_s``).

    ``connect(url, settings=RedisSettings(...))``; the same names are accepted as keyword
    arguments of :func:`~toolnexus.connect` (``connect(url, lease_ms=60_000)``). The
    embedded ``memory://`` broker honours ``namespace``, ``queue``, ``default_timeout_s``,
    ``retention_s`` and ``write_protocol`` (checked), and refuses any other field set to
    other than its default.

    Raises:
        ConfigurationError: a value out of range or of the wrong type, naming the field.
    """

    namespace: str = "toolnexus"
    """Prefix of every Redis key (see :mod:`toolnexus.keys`)."""
    queue: str = "default"
    """The request queue this broker publishes to and responders read."""
    agent: str | None = None
    """Who waits: it starts the names of the reply streams, states and durable requests,
    so that the ACL ``toolnexus acl`` writes gives each agent's Redis user its own. None:
    ``TOOLNEXUS_AGENT``, else the Redis user it logs in as, else ``anon``."""
    lease_ms: int = 30_000
    """How long a responder holds a request without renewing; a dead consumer's requests
    are reclaimed after it. A responder renews its leases every third of it, and reads the
    state of everything it holds every ten leases (the backstop for the events stream,
    which tells it of resolutions elsewhere)."""
    liveness_ms: int = 15_000
    """How long a waiting process's liveness mark lasts unrenewed (at least twice
    ``block_ms``): a dead process's open requests are withdrawn within about
    ``liveness_ms + min(liveness_ms, lease_ms) / 3`` (its responders look for waiters
    without a mark that often, one ``EXISTS`` per waiter). An idle waiting process renews
    it every third of ``liveness_ms``, its answer reader blocking in between: two Redis
    commands per ``liveness_ms / 3`` are all an idle agent costs."""
    default_timeout_s: float = 600.0
    """A wait's deadline when neither the call nor the request gives one."""
    retention_s: float = 24 * 3600.0
    """How long resolved state is kept, so that late answers are refused by name."""
    stream_retention_s: float = 7 * 24 * 3600.0
    """Requests older than this are trimmed from the request stream (never by length);
    also the longest a wait may last. Entries that no group took (each group that could
    not settled them for itself only) leave the stream by this rule."""
    max_connections: int = 16
    """Size of the command connection pool."""
    block_ms: int = 1000
    """How long a responder's or an event follower's blocking read waits before looking
    around (an agent's answer reader blocks until its liveness mark is due instead)."""
    connect_timeout_s: float = 5.0
    """Bound on connecting."""
    command_timeout_s: float = 10.0
    """Bound on every command (a blocking read may take ``block_ms`` longer)."""
    answer_patience_s: float = 5.0
    """How long an answer is retried while Redis is away."""
    dead_letter_max_entries: int = 10_000
    """Length bound of the dead-letter stream."""
    dead_letter_max_bytes: int = 8192
    """How much of each bad entry's original bytes a dead letter keeps."""
    audit_retention_s: float = 30 * 24 * 3600.0
    """Age bound of each audit stream (each writer caps its own)."""
    audit_max_entries: int = 100_000
    """Length bound of each audit stream (approximate: Redis trims whole nodes)."""
    durability: str = "none"
    """``"none"`` or ``"wait"``: see :data:`DURABILITY`."""
    wait_replicas: int = 1
    """With ``durability="wait"``: replicas each write waits for."""
    wait_timeout_ms: int = 100
    """With ``durability="wait"``: how long each write waits for them."""
    write_protocol: int = field(default_factory=default_write_protocol)
    """The protocol this process writes on its own initiative (its requests, their states
    and routes, its heartbeats, liveness marks and dead letters): 2, the current one, or 1,
    the previous release's, until every process that reads them has been upgraded (see
    :mod:`toolnexus.protocol`). What it writes about a request (an answer, a refusal, an
    event) is in that request's protocol whatever this says. Default:
    ``TOOLNEXUS_WRITE_PROTOCOL``, else 2."""
    redis_public_api: bool | None = None
    """Use only redis-py's documented API, none of the internals that make a round trip
    cheaper (see :mod:`toolnexus.redis_broker._redispy`); ``None``:
    ``TOOLNEXUS_REDIS_PUBLIC_API=1`` turns it on, else off."""
    redis_options: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), repr=False
    )
    """redis-py connection options passed through: ``username``, ``password``,
    ``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``, ... (:data:`REDIS_OPTIONS`); left out
    of the repr, as they may hold a password."""

    @classmethod
    def names(cls) -> list[str]:
        """The fields that are settings of their own (not :attr:`redis_options`)."""
        return [f.name for f in fields(cls) if f.name != "redis_options"]

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.type in ("int", "float") and f.name != "write_protocol":  # ms or counts; s
                integer = f.type == "int"
                maximum = MAX_COUNT if integer else MAX_SECONDS
                check_number(
                    f"option {f.name}", getattr(self, f.name), integer=integer, maximum=maximum
                )
        object.__setattr__(self, "write_protocol", check_write_protocol(self.write_protocol))
        if self.agent is not None:
            problem = agent_problem(self.agent) if isinstance(self.agent, str) else "must be text"
            if problem is not None:
                raise ConfigurationError(f"option agent={self.agent!r} {problem}")
        if self.redis_public_api not in (None, True, False):
            raise ConfigurationError(
                f"option redis_public_api={self.redis_public_api!r} must be True or False"
            )
        if self.durability not in DURABILITY:
            raise ConfigurationError(
                f"option durability={self.durability!r} must be one of {', '.join(DURABILITY)}"
            )
        if self.block_ms * 2 > self.liveness_ms:
            raise ConfigurationError(
                f"liveness_ms={self.liveness_ms} must be at least twice block_ms={self.block_ms}: "
                "the answer reader renews the liveness mark between blocking reads"
            )
        unknown = sorted(set(self.redis_options) - REDIS_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown redis_options {', '.join(unknown)}: redis-py connection options "
                "are username, password, db, ssl_ca_certs, ssl_certfile, ssl_keyfile, ..."
            )
        object.__setattr__(self, "redis_options", MappingProxyType(dict(self.redis_options)))

    @property
    def retention_ms(self) -> int:
        """:attr:`retention_s` in milliseconds."""
        return int(self.retention_s * 1000)

    @property
    def stream_retention_ms(self) -> int:
        """:attr:`stream_retention_s` in milliseconds."""
        return int(self.stream_retention_s * 1000)

    @classmethod
    def of(cls, settings: RedisSettings | None, options: Mapping[str, Any]) -> RedisSettings:
        """``settings`` (else the defaults) with ``options``, the keyword form of its fields
        and of redis-py's connection options (:func:`~toolnexus.connect`'s ``**options``).

        Raises:
            ConfigurationError: an option neither a field nor a redis-py connection option,
                a field set in ``settings`` (to other than its default) and given as a
                keyword too, or a bad value.
        """
        names = set(cls.names())
        unknown = sorted(set(options) - names - REDIS_OPTIONS)
        if unknown:
            raise ConfigurationError(
                f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for the "
                f"Redis broker; its options are {', '.join(sorted(names | {'codec'}))}, "
                f"{', '.join(SIGNING_OPTIONS)}, and redis-py connection options such as "
                "username, password, ssl_ca_certs"
            )
        own = {k: v for k, v in options.items() if k in names}
        passed = {k: v for k, v in options.items() if k in REDIS_OPTIONS}
        if settings is None:
            try:
                return cls(**own, redis_options=passed)
            except TypeError as exc:
                raise ConfigurationError(f"bad option for the Redis broker: {exc}") from exc
        if not isinstance(settings, RedisSettings):
            raise ConfigurationError(
                f"settings must be a RedisSettings, not {type(settings).__name__}"
            )
        twice = sorted(
            (set(own) & set(settings.changed())) | (set(passed) & set(settings.redis_options))
        )
        if twice:
            raise ConfigurationError(
                f"{', '.join(twice)}: given both in settings= and as a keyword; give each once"
            )
        if not (own or passed):
            return settings
        return replace(settings, **own, redis_options={**settings.redis_options, **passed})

    def changed(self) -> list[str]:
        """The fields set to other than their defaults (``redis_options`` when any is)."""
        default = RedisSettings()
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(default, f.name)]


EMBEDDED_URL = "memory://"
"""The embedded broker: in this process only. ``toolnexus demo``'s broker when neither
``--url`` nor ``TOOLNEXUS_URL`` says (a demo needs nothing but this package)."""


def connection_parser(
    *,
    queue: str | None = "request queue",
    queue_default: str = "default",
    keys: bool = True,
    embedded: bool = False,
) -> argparse.ArgumentParser:
    """The parent parser of every command and worker that talks to a broker (use it as
    ``ArgumentParser(parents=[connection_parser()])``): ``--url``, ``--namespace``, with
    ``queue`` (its help text) ``--queue`` (else ``queue_default``), ``--write-protocol``
    (see :mod:`toolnexus.protocol`), with ``keys`` the
    signature flags ``--signing-key``, ``--trusted-keys`` and ``--require-signatures``.
    Each falls back to its ``TOOLNEXUS_*`` variable (the signature flags:
    :func:`~toolnexus.connect` reads those itself), ``--url`` then to
    :data:`DEFAULT_URL` (with ``embedded``, to :data:`EMBEDDED_URL`).
    :func:`connection_options` turns them into ``connect()``'s options. TLS files and ACL
    credentials come with the URL (``rediss://user:password@...``) or the environment."""
    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("broker")
    fallback = EMBEDDED_URL if embedded else DEFAULT_URL
    group.add_argument(
        "--url",
        default=os.environ.get(URL_VARIABLE) or fallback,
        help=f"broker URL (default: ${URL_VARIABLE}, else {fallback})",
    )
    group.add_argument(
        "--namespace",
        default=os.environ.get("TOOLNEXUS_NAMESPACE") or "toolnexus",
        help="Redis key namespace (default: $TOOLNEXUS_NAMESPACE, else toolnexus)",
    )
    if queue is not None:
        group.add_argument(
            "--queue",
            default=os.environ.get("TOOLNEXUS_QUEUE") or queue_default,
            help=f"{queue} (default: $TOOLNEXUS_QUEUE, else {queue_default})",
        )
    group.add_argument(
        "--write-protocol",
        type=_write_protocol_flag,
        default=None,
        metavar="{1,2}",
        help=f"the protocol this process writes: 2, the current one, or 1, the previous "
        f"release's, until every reader is upgraded (default: ${WRITE_PROTOCOL_VARIABLE}, "
        "else 2)",
    )
    if keys:
        group.add_argument(
            "--signing-key",
            default=None,
            help="this process's private key file: what it sends is signed "
            "(default: $TOOLNEXUS_SIGNING_KEY; toolnexus keygen makes one)",
        )
        group.add_argument(
            "--trusted-keys",
            default=None,
            help="the other side's public keys, a directory of .pub files or a file of "
            "NAME KEY lines (default: $TOOLNEXUS_TRUSTED_KEYS)",
        )
        group.add_argument(
            "--require-signatures",
            action="store_true",
            default=None,
            help="refuse anything not signed by a trusted key "
            "(default: $TOOLNEXUS_REQUIRE_SIGNATURES)",
        )
    return parser


def _write_protocol_flag(value: str) -> int:
    """``--write-protocol``'s value, checked (argparse shows the error, no traceback)."""
    try:
        return check_write_protocol(value, what="--write-protocol")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def connection_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options of :func:`~toolnexus.connect` that :func:`connection_parser`'s flags
    ask for (a signature flag not given is left to ``connect()``'s environment).

    Raises:
        ConfigurationError: ``--require-signatures`` was given, and neither its flag nor
            its variable gives this process a signing key or trusted keys (the message
            names the flag, which is what was given).
    """
    if getattr(args, "require_signatures", None):
        for flag, name, variable in (
            ("--signing-key", "signing_key", SIGNING_KEY_ENV),
            ("--trusted-keys", "trusted_keys", TRUSTED_KEYS_ENV),
        ):
            if getattr(args, name, None) is None and not os.environ.get(variable):
                what = "no signing key" if name == "signing_key" else "no trusted keys"
                raise ConfigurationError(
                    f"--require-signatures was given but this process has {what}: give "
                    f"{flag} (or set {variable}; toolnexus keygen makes keys)"
                )
    options: dict[str, Any] = {"namespace": args.namespace}
    if getattr(args, "write_protocol", None) is not None:
        options["write_protocol"] = args.write_protocol
    if isinstance(getattr(args, "queue", None), str):
        options["queue"] = args.queue
    for name in SIGNING_OPTIONS:
        if getattr(args, name, None) is not None:
            options[name] = getattr(args, name)
    return options
