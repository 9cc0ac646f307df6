"""``toolnexus worker gateway``: the wait gateway, a §10 ``waitFor`` over HTTP for agents in
any language (SPEC §10; the toolnexus toolkit's agents use it from their own environment).

An agent POSTs a §10 Request to ``/v1/requests`` with a bearer token that names it; the
gateway publishes it on the broker as that agent, signed with that agent's key
(``--agent-keys DIR``: ``DIR/NAME.key``, made by ``toolnexus keygen NAME``), and returns
the §10 Answer (see :mod:`toolnexus_workers.gateway.app`; ``GET /openapi.json``). Without
tokens it serves this machine only, everyone as ``--agent``. Needs
``pip install 'toolnexus-bridge[gateway]'``.

    toolnexus worker gateway --url redis://127.0.0.1:6379/0 --tokens tokens.toml \\
        --agent-keys /etc/toolnexus/agents --trusted-keys /etc/toolnexus/responders \\
        --require-signatures --host 0.0.0.0

Each agent is a broker of its own (``agent=NAME``): its Redis user, as the URL says, needs
the rights of every agent the gateway speaks for (deploy/README.md: ``toolnexus acl``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from toolnexus import Broker
from toolnexus.errors import ConfigurationError
from toolnexus.responders import check_listen
from toolnexus.security import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV, signatures_required

from ..options import add_listen_flags, broker_options, require_extra, run_checked, worker_parser
from .tokens import Tokens

_EXTRA = ("starlette", "uvicorn")


def parser() -> argparse.ArgumentParser:
    """The command line of ``toolnexus worker gateway``."""
    p = worker_parser(
        "gateway",
        "Wait for §10 requests that agents POST over HTTP; return their answers.",
        group="gateway",
        concurrency=None,
        queue="request queue the agents' requests are published to",
    )
    http = p.add_argument_group("gateway")
    add_listen_flags(http, port=8710)
    http.add_argument(
        "--tokens",
        type=Path,
        default=os.environ.get("TOOLNEXUS_GATEWAY_TOKENS_FILE") or None,
        help="TOML file: [agents] NAME = 'TOKEN' (default: $TOOLNEXUS_GATEWAY_TOKENS_FILE; "
        "or $TOOLNEXUS_GATEWAY_TOKENS='NAME=TOKEN ...')",
    )
    http.add_argument(
        "--agent-keys",
        type=Path,
        default=os.environ.get("TOOLNEXUS_GATEWAY_AGENT_KEYS") or None,
        help="directory of the agents' signing keys, NAME.key (toolnexus keygen NAME); "
        "(default: $TOOLNEXUS_GATEWAY_AGENT_KEYS)",
    )
    http.add_argument(
        "--agent",
        default=os.environ.get("TOOLNEXUS_AGENT") or "anon",
        help="without tokens, the agent every caller is (default: $TOOLNEXUS_AGENT, else anon)",
    )
    http.add_argument(
        "--keepalive-s",
        type=float,
        default=15.0,
        help="a long poll sends a space this often while it waits (15 s)",
    )
    http.add_argument(
        "--max-waits",
        type=int,
        default=10_000,
        help="requests open at once, over all agents; more are refused with 503 (10000)",
    )
    http.add_argument(
        "--keep-s",
        type=float,
        default=300.0,
        help="how long an answer can be fetched again after it came (300 s)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``toolnexus worker gateway``; return its exit status (2 for a bad configuration)."""
    args = parser().parse_args(argv)
    return run_checked(args, _check, _serve)


def load_tokens(args: argparse.Namespace) -> Tokens:
    """The tokens ``--tokens`` or ``TOOLNEXUS_GATEWAY_TOKENS`` give (none: empty).

    Raises:
        ConfigurationError: both are given, or either is malformed.
    """
    text = os.environ.get("TOOLNEXUS_GATEWAY_TOKENS", "")
    if args.tokens is not None and text.strip():
        raise ConfigurationError(
            "give agents' tokens by --tokens or TOOLNEXUS_GATEWAY_TOKENS, not both"
        )
    if args.tokens is not None:
        return Tokens.load(args.tokens)
    return Tokens.parse(text)


def agent_key(keys: Path | None, agent: str) -> Path | None:
    """The signing key file of ``agent`` in ``keys`` (None without a directory).

    Raises:
        ConfigurationError: the directory has no ``agent.key``.
    """
    if keys is None:
        return None
    path = keys / f"{agent}.key"
    if not path.is_file():
        raise ConfigurationError(
            f"no signing key for agent {agent!r}: {path} (make it with toolnexus keygen {agent} "
            f"--dir {keys})"
        )
    return path


def _check(args: argparse.Namespace) -> None:
    require_extra("gateway", _EXTRA)
    if args.signing_key is not None or os.environ.get(SIGNING_KEY_ENV):
        raise ConfigurationError(
            "the gateway signs with each agent's own key: give --agent-keys DIR, not "
            f"--signing-key or {SIGNING_KEY_ENV}"
        )
    _check_signatures(args)
    tokens = load_tokens(args)
    check_listen(
        args.host,
        guarded=bool(tokens),
        what="serve the gateway",
        how="give agents tokens (--tokens or TOOLNEXUS_GATEWAY_TOKENS)",
    )
    for agent in tokens.agents or {args.agent}:
        agent_key(args.agent_keys, agent)  # every agent's key is there before serving
    args.gateway_tokens = tokens


def _check_signatures(args: argparse.Namespace) -> None:
    """With signatures required (``--require-signatures`` or its variable), each agent's
    broker signs with that agent's key and verifies answers with the trusted keys; the
    process's shared broker (metrics only: it never waits nor answers) neither signs nor
    requires, so ``args.require_signatures`` is set to False for it and the agents'
    setting kept in ``args.agents_require_signatures``.

    Raises:
        ConfigurationError: signatures are required without ``--agent-keys`` or without
            trusted keys (the message names what was given: the flag or the variable).
    """
    given = "--require-signatures" if args.require_signatures else "TOOLNEXUS_REQUIRE_SIGNATURES=1"
    required = bool(args.require_signatures) or signatures_required()
    if required and args.agent_keys is None:
        raise ConfigurationError(
            f"{given}: the gateway signs each agent's requests with that agent's key: give "
            "--agent-keys DIR (DIR/NAME.key, made by toolnexus keygen NAME)"
        )
    if required and args.trusted_keys is None and not os.environ.get(TRUSTED_KEYS_ENV):
        raise ConfigurationError(
            f"{given}: the gateway verifies answers with the responders' public keys: give "
            f"--trusted-keys (or set {TRUSTED_KEYS_ENV})"
        )
    args.agents_require_signatures = required
    args.require_signatures = False


async def _serve(shared: Broker, args: argparse.Namespace) -> int:
    import toolnexus

    from .app import Agents, Gateway
    from .server import GatewayServer

    options = broker_options(args)
    options.pop("signing_key", None)
    options["require_signatures"] = args.agents_require_signatures

    def make(agent: str) -> Broker:
        key = agent_key(args.agent_keys, agent)
        return toolnexus.connect(args.url, agent=agent, signing_key=key, **options)

    gateway = Gateway(
        Agents(make),
        args.gateway_tokens,
        anonymous_agent=args.agent,
        keepalive_s=args.keepalive_s,
        keep_s=args.keep_s,
        max_waits=args.max_waits,
    )
    await GatewayServer(gateway, host=args.host, port=args.port).run()
    return 0


__all__ = ["main", "parser"]
