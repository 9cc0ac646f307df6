"""redis-py's internals are used in one module, ``toolnexus.redis_broker._redispy``, and
the public-API-only mode uses none of them (SPEC-free: the architecture's rule, issue 32).

The check reads the source: no other module imports a redis-py module outside its
documented API (``redis.connection``, ``redis.asyncio.connection``, ``redis._parsers``,
any ``redis._private`` module, ``hiredis``), names redis-py's connection internals
(``send_packed_command``, ``read_response``, ``pack_command``, ``connection_pool``,
``get_connection``, ``connection_class``, ``nodes_manager``...), subclasses a redis-py
class, or reads a private attribute (``x._name``) of anything but its own ``self``/``cls``
whose name redis-py's own code uses and toolnexus's does not define.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import re
from pathlib import Path

import pytest
import redis

import toolnexus
from toolnexus import ConfigurationError
from toolnexus.redis_broker import RedisBroker

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(
    [*(ROOT / "bridge" / "toolnexus").rglob("*.py"), *(ROOT / "workers").rglob("*.py")]
)
HOME = ROOT / "bridge" / "toolnexus" / "redis_broker" / "_redispy.py"

INTERNAL_MODULES = ("redis.connection", "redis.asyncio.connection", "redis._parsers", "hiredis")
INTERNAL_NAMES = frozenset(
    {
        "send_packed_command",
        "send_command",
        "read_response",
        "pack_command",
        "pack_commands",
        "connection_pool",
        "get_connection",
        "connection_class",
        "nodes_manager",
        "can_read_destructive",
        "SentinelConnectionPool",
    }
)
"""Connection-level names: documented as classes, but not as an API toolnexus may build on."""


def _is_internal_module(name: str) -> bool:
    parts = name.split(".")
    return name.startswith(INTERNAL_MODULES) or (
        parts[0] == "redis" and any(p.startswith("_") for p in parts[1:])
    )


@functools.cache
def _redis_private_names() -> frozenset[str]:
    """Every private attribute name (``x._name``, not dunder) redis-py's own code reads."""
    names: set[str] = set()
    for path in Path(redis.__file__).parent.rglob("*.py"):
        names.update(re.findall(r"\.(_[A-Za-z]\w*)", path.read_text(encoding="utf-8")))
    return frozenset(n for n in names if not n.startswith("__"))


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _own_private_names() -> frozenset[str]:
    """Private names toolnexus defines itself: its functions, classes and attributes."""
    names = set()
    for path in SOURCES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and _root(node.value) in ("self", "cls"):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)  # __slots__
    return frozenset(n for n in names if n.startswith("_"))


def _redis_aliases(tree: ast.Module) -> set[str]:
    """The local names bound to redis-py modules or classes in one module."""
    aliases = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "redis":
                    aliases.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            aliases.update(alias.asname or alias.name for alias in node.names)
    return aliases


def _root(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def problems_in(path: Path, private: frozenset[str]) -> list[str]:
    tree = _tree(path)
    aliases = _redis_aliases(tree)
    found = []
    name = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom | ast.Attribute | ast.ClassDef):
            continue
        where = f"{name}:{node.lineno}"
        if isinstance(node, ast.Import):
            found += [
                f"{where} imports {a.name}" for a in node.names if _is_internal_module(a.name)
            ]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _is_internal_module(node.module):
                found.append(f"{where} imports from {node.module}")
            found += [f"{where} imports {a.name}" for a in node.names if a.name in INTERNAL_NAMES]
        elif isinstance(node, ast.Attribute):
            if node.attr in INTERNAL_NAMES:
                found.append(f"{where} uses .{node.attr}")
            elif node.attr in private and _root(node.value) not in ("self", "cls"):
                found.append(f"{where} reads ._{node.attr.lstrip('_')}, a redis-py name")
        elif isinstance(node, ast.ClassDef):
            found += [
                f"{where} subclasses {ast.unparse(base)}"
                for base in node.bases
                if _root(base) in aliases
            ]
    return found


@pytest.mark.slow
def test_only_one_module_uses_redis_py_internals() -> None:
    private = _redis_private_names() - _own_private_names()
    found = [p for path in SOURCES if path != HOME for p in problems_in(path, private)]
    assert found == []


def test_the_check_finds_what_it_looks_for() -> None:
    """The check is not vacuous: the module it exempts is caught by it."""
    found = problems_in(HOME, _redis_private_names())
    assert any("send_packed_command" in p for p in found)
    assert any("connection_pool" in p for p in found)
    assert any("subclasses RedisCluster" in p for p in found)
    assert any("imports from hiredis" in p for p in found)


@pytest.mark.redis
@pytest.mark.parametrize("public_api", [False, True])
async def test_a_round_trip_in_either_mode(
    redis_url: str, namespace: str, public_api: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The option, or else ``TOOLNEXUS_REDIS_PUBLIC_API``, chooses the mode; either way an
    answer reaches its waiter."""
    monkeypatch.setenv("TOOLNEXUS_REDIS_PUBLIC_API", "0" if public_api else "1")
    options = {"namespace": namespace, "block_ms": 100, "lease_ms": 600}
    async with toolnexus.connect(redis_url, redis_public_api=public_api, **options) as broker:
        assert isinstance(broker, RedisBroker)
        assert broker.core.public_api is public_api
        request = toolnexus.Request(id=toolnexus.new_id(), kind="approval", prompt="ok?")
        async with broker.responder("bot") as responder:

            async def answer() -> None:
                pending = await anext(responder)
                await pending.accept()

            task = asyncio.create_task(answer())
            got = await broker.wait_for(request, timeout_s=10)
            await task
        assert got.ok is True
    monkeypatch.setenv("TOOLNEXUS_REDIS_PUBLIC_API", "1" if public_api else "0")
    async with toolnexus.connect(redis_url, **options) as broker:
        assert isinstance(broker, RedisBroker) and broker.core.public_api is public_api


def test_the_option_takes_only_true_or_false() -> None:
    with pytest.raises(ConfigurationError, match="redis_public_api"):
        RedisBroker("redis://127.0.0.1:6379", redis_public_api="yes")
