"""MCP host configs for ``load_mcp``: every server of an ``mcpServers`` config, one toolset.

The format MCP hosts use (Claude Desktop, Cursor, ...)::

    {"mcpServers": {
        "calendar": {"command": "python", "args": ["calendar.py"], "env": {"TZ": "UTC"}},
        "crm": {"url": "https://crm.example.com/mcp", "headers": {"Authorization": "Bearer …"}}
    }}

A server is a stdio command (``command``, with optional ``args``, ``env`` merged over
the SDK's default environment, and ``cwd``) or a streamable-HTTP ``url`` (with optional
``headers``); ``"disabled": true`` leaves it out, ``type`` may say ``stdio``, ``http`` or
``streamable-http``, and other keys hosts use are ignored. Values are taken as written
(no ``${VAR}`` expansion).
"""

from __future__ import annotations

import json
import logging
import os
import string
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import anyio
from mcp.client.stdio import StdioServerParameters

from ..errors import ConfigurationError, ServerUnavailable, ToolnexusError
from ._errors import alone, translate

if TYPE_CHECKING:
    from ._client import McpTool, McpTools
    from ._transport import ServerSpec

log = logging.getLogger(__name__)

McpConfig: TypeAlias = "Mapping[str, Any] | os.PathLike[str]"
"""An MCP host config: the ``{"mcpServers": {...}}`` dict, or a path to its JSON file."""

_TYPES = frozenset({"stdio", "http", "streamable-http", "streamable_http", "streamableHttp"})


@dataclass(frozen=True)
class ServerEntry:
    """One server of a config: what to connect to, and the HTTP headers to send."""

    spec: ServerSpec
    headers: dict[str, str] = field(default_factory=dict)


Opener: TypeAlias = Callable[[str, ServerEntry], AbstractAsyncContextManager["McpTools"]]
"""Opens one named server of a config (``load_mcp`` for that server)."""


def load_config(source: McpConfig) -> dict[str, ServerEntry]:
    """The servers of an MCP host config, by name, in the config's order.

    Raises:
        ConfigurationError: the file cannot be read or is not JSON, there is no
            ``mcpServers`` object, or a server entry is malformed (the message names it).
    """
    if isinstance(source, os.PathLike):
        path = os.fspath(source)
        try:
            with open(path, encoding="utf-8") as file:
                source = json.load(file)
        except OSError as exc:
            raise ConfigurationError(f"cannot read the MCP config {path!r}: {exc}") from exc
        except ValueError as exc:
            raise ConfigurationError(f"the MCP config {path!r} is not JSON: {exc}") from exc
    servers = source.get("mcpServers") if isinstance(source, Mapping) else None
    if not isinstance(servers, Mapping):
        raise ConfigurationError('an MCP config is an object with an "mcpServers" object')
    entries: dict[str, ServerEntry] = {}
    for name, entry in servers.items():
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"MCP server names must be non-empty strings, got {name!r}")
        if not isinstance(entry, Mapping):
            raise ConfigurationError(f"MCP server {name!r}: the entry must be an object")
        if entry.get("disabled") is True:
            continue
        entries[name] = _entry(name, entry)
    return entries


def _entry(name: str, entry: Mapping[str, Any]) -> ServerEntry:
    kind = entry.get("type")
    if kind is not None and kind not in _TYPES:
        raise ConfigurationError(
            f"MCP server {name!r}: type {kind!r} is not supported (stdio or streamable http)"
        )
    command, url = entry.get("command"), entry.get("url")
    if (command is None) == (url is None):
        raise ConfigurationError(f'MCP server {name!r}: give either "command" or "url"')
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"MCP server {name!r}: url must be http(s)://, got {url!r}")
        return ServerEntry(url, _strings(name, "headers", entry.get("headers") or {}))
    args = entry.get("args") or []
    if not isinstance(command, str) or not command:
        raise ConfigurationError(f"MCP server {name!r}: command must be a non-empty string")
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise ConfigurationError(f"MCP server {name!r}: args must be a list of strings")
    cwd = entry.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise ConfigurationError(f"MCP server {name!r}: cwd must be a string")
    env = _strings(name, "env", entry.get("env") or {})
    return ServerEntry(StdioServerParameters(command=command, args=args, env=env, cwd=cwd))


def _strings(name: str, key: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ConfigurationError(f"MCP server {name!r}: {key} must map strings to strings")
    return dict(value)


def _check_tool_name(tool_name: str) -> None:
    fields = {part[1] for part in string.Formatter().parse(tool_name) if part[1] is not None}
    if "tool" not in fields or not fields <= {"server", "tool"}:
        raise ConfigurationError(
            f"tool_name must be a format with {{tool}} (and {{server}}), got {tool_name!r}"
        )


class McpToolset(Mapping[str, "McpTool"]):
    """The tools of several MCP servers, by ``tool_name`` (``"calendar.book"``), read-only;
    ``servers`` holds each connected server's :class:`~toolnexus.McpTools`, ``failures``
    the error of each server that could not be loaded."""

    def __init__(
        self,
        servers: Mapping[str, McpTools],
        failures: Mapping[str, ToolnexusError],
        tool_name: str = "{server}.{tool}",
    ) -> None:
        self.servers = dict(servers)
        self.failures = dict(failures)
        self._tools: dict[str, McpTool] = {}
        for server, tools in self.servers.items():
            for name, tool in tools.items():
                key = tool_name.format(server=server, tool=name)
                if key in self._tools:
                    raise ConfigurationError(
                        f"two tools are both named {key!r}: use a tool_name with {{server}}"
                    )
                self._tools[key] = tool

    @classmethod
    def open(
        cls,
        entries: Mapping[str, ServerEntry],
        opener: Opener,
        *,
        tool_name: str = "{server}.{tool}",
        require_all: bool = False,
    ) -> AbstractAsyncContextManager[McpToolset]:
        """Open every server concurrently and yield their tools; each server stays open until
        the toolset closes. A server that fails is logged and kept in ``failures``.

        Raises:
            ConfigurationError: a bad ``tool_name`` (at once), or two tools with one name.
            ToolnexusError: with ``require_all``, the first failing server's error.
        """
        _check_tool_name(tool_name)
        return cls._open(entries, opener, tool_name, require_all)

    @classmethod
    @asynccontextmanager
    async def _open(
        cls, entries: Mapping[str, ServerEntry], opener: Opener, tool_name: str, require_all: bool
    ) -> AsyncIterator[McpToolset]:
        opened: dict[str, McpTools] = {}
        failures: dict[str, ToolnexusError] = {}
        stop = anyio.Event()

        async def run(name: str, entry: ServerEntry, ready: anyio.Event) -> None:
            try:
                async with opener(name, entry) as tools:
                    opened[name] = tools
                    ready.set()
                    await stop.wait()
            except Exception as exc:
                error = translate(exc, name) or ServerUnavailable(name, f"{exc!r}")
                if name in opened:
                    log.warning("MCP server %r closed with an error: %s", name, error)
                else:
                    log.warning("MCP server %r could not be loaded: %s", name, error)
                    failures[name] = error
            finally:
                ready.set()

        failed: ToolnexusError | None = None
        raised: BaseException | None = None  # by the caller's block, raised as itself
        try:
            async with anyio.create_task_group() as tasks:
                readies = []
                for name, entry in entries.items():
                    readies.append(anyio.Event())
                    tasks.start_soon(run, name, entry, readies[-1])
                for ready in readies:
                    await ready.wait()
                try:
                    if require_all and failures:
                        failed = next(failures[name] for name in entries if name in failures)
                    else:
                        servers = {name: opened[name] for name in entries if name in opened}
                        broken = {name: failures[name] for name in entries if name in failures}
                        yield cls(servers, broken, tool_name)
                except BaseException as exc:
                    raised = exc
                    raise
                finally:
                    stop.set()
        except BaseExceptionGroup as group:
            itself = alone(group, raised)
            if itself is None:
                raise
        else:
            if failed is not None:
                raise failed
            return
        raise itself  # outside the except block: its context stays its own

    def __getitem__(self, name: str) -> McpTool:
        return self._tools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        broken = f"; failed: {', '.join(self.failures)}" if self.failures else ""
        return f"<McpToolset of {', '.join(self.servers) or 'no servers'}{broken}>"
