"""Which generation of the MCP SDK is installed: ``load_mcp`` needs 2.x, the rest runs on 1.x too.

Read from the distribution's metadata, so asking never imports the SDK.
"""

from __future__ import annotations

import functools
import importlib.metadata
import re

from ..errors import ConfigurationError

LOAD_MCP_NEEDS = (2, 3)
"""The oldest mcp release whose client ``load_mcp`` (and ``toolnexus demo``) is built on."""


@functools.cache
def mcp_version() -> str | None:
    """The installed ``mcp`` distribution's version, or None when it is not installed."""
    try:
        return importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        return None


def mcp_release() -> tuple[int, int]:
    """The installed mcp's (major, minor); (0, 0) when it is missing or unreadable."""
    found = re.match(r"(\d+)\.(\d+)", mcp_version() or "")
    return (int(found[1]), int(found[2])) if found else (0, 0)


def require_mcp2(what: str) -> None:
    """Refuse ``what`` (a feature's name) unless mcp >= 2.3 is installed.

    Raises:
        ConfigurationError: naming the installed version and the fix.
    """
    if mcp_release() >= LOAD_MCP_NEEDS:
        return
    need = ".".join(map(str, LOAD_MCP_NEEDS))
    installed = f"mcp {mcp_version()} is installed" if mcp_version() else "mcp is not installed"
    raise ConfigurationError(
        f"{what} needs the MCP SDK 2.x (mcp>={need},<3), but {installed}: "
        f"pip install 'toolnexus-bridge[mcp2]' (or 'mcp>={need},<3'). Beside a framework that "
        "pins mcp 1.x, give its MCP client toolnexus.elicitation_callback(...) instead"
    )
