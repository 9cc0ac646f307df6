"""Who may use the gateway: bearer tokens, each naming the agent it speaks for.

A tokens file is TOML, one agent per key, one token or a list of them (rotation)::

    [agents]
    agent-7 = "kq3…"                 # at least 16 characters
    ci-runner = ["old…", "new…"]

or ``TOOLNEXUS_GATEWAY_TOKENS="agent-7=kq3… ci-runner=new…"`` (pairs separated by spaces
or commas). Tokens are kept as SHA-256 digests and looked up by digest.
"""

from __future__ import annotations

import hashlib
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

from toolnexus.errors import ConfigurationError
from toolnexus.keys import agent_problem
from toolnexus.responders import check_token


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class Tokens:
    """Bearer tokens and the agent each names (:meth:`agent`); empty: no tokens at all.

    Raises:
        ConfigurationError: a token shorter than 16 characters, used twice, or an agent name
            the broker refuses.
    """

    def __init__(self, pairs: Iterable[tuple[str, str]] = ()) -> None:
        self._agents: dict[bytes, str] = {}
        for agent, token in pairs:
            problem = agent_problem(agent)
            if problem is not None:
                raise ConfigurationError(f"gateway tokens: agent name {agent!r} {problem}")
            check_token(token, f"the gateway token of {agent!r}")
            digest = _digest(token)
            if self._agents.get(digest, agent) != agent:
                raise ConfigurationError(f"gateway tokens: one token names two agents ({agent!r})")
            self._agents[digest] = agent

    def __bool__(self) -> bool:
        return bool(self._agents)

    @property
    def agents(self) -> set[str]:
        """Every agent a token names."""
        return set(self._agents.values())

    def agent(self, token: str) -> str | None:
        """The agent ``token`` names, or None."""
        return self._agents.get(_digest(token))

    @classmethod
    def from_mapping(cls, agents: Mapping[str, object], where: str) -> Tokens:
        """Tokens from ``{agent: token or [tokens]}``; ``where`` names the source in errors.

        Raises:
            ConfigurationError: a value that is neither a string nor a list of strings.
        """
        pairs = []
        for agent, value in agents.items():
            values = value if isinstance(value, list) else [value]
            for token in values:
                if not isinstance(token, str):
                    raise ConfigurationError(
                        f"{where}: the token of {agent!r} must be a string or a list of strings"
                    )
                pairs.append((agent, token))
        return cls(pairs)

    @classmethod
    def load(cls, path: Path) -> Tokens:
        """The tokens of a TOML file with an ``[agents]`` table.

        Raises:
            ConfigurationError: the file cannot be read or has no ``[agents]`` table.
        """
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"gateway tokens file {path}: {exc}") from exc
        agents = document.get("agents")
        if not isinstance(agents, dict) or not agents:
            raise ConfigurationError(
                f'gateway tokens file {path}: no [agents] table (agent-7 = "TOKEN")'
            )
        return cls.from_mapping(agents, f"gateway tokens file {path}")

    @classmethod
    def parse(cls, text: str) -> Tokens:
        """Tokens from ``"agent-7=TOKEN ci-runner=TOKEN"`` (spaces or commas between pairs).

        Raises:
            ConfigurationError: a pair without ``=``.
        """
        pairs = []
        for item in text.replace(",", " ").split():
            agent, equals, token = item.partition("=")
            if not equals:
                raise ConfigurationError(
                    f"TOOLNEXUS_GATEWAY_TOKENS: {item[:20]!r}… is not AGENT=TOKEN"
                )
            pairs.append((agent, token))
        return cls(pairs)
