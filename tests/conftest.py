"""Shared fixtures: brokers on memory and on real Redis, and private redis-servers."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hypothesis  # noqa: F401  (imported early: CPython 3.11.7 fails importing it at session end)
import pytest
import redis
import redis.asyncio as aioredis

import toolnexus
from toolnexus import Broker
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import Keyring, SigningKey
from waiting_agents import agents  # noqa: F401 (a fixture: agents in other processes)

if TYPE_CHECKING:
    from redis_topologies import LocalCluster

REDIS_URL = "redis://127.0.0.1:6379/0"


def _redis_is_up(url: str, **options: Any) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=0.5, **options) as client:
            client.ping()
    except redis.exceptions.ConnectionError:
        return False
    return True


@pytest.fixture(scope="session")
def redis_url() -> str:
    """The shared Redis server (127.0.0.1:6379); tests isolate themselves by namespace."""
    if not _redis_is_up(REDIS_URL):
        pytest.fail(f"no Redis at {REDIS_URL}: start one (.ci/run does) to run these tests")
    return REDIS_URL


@pytest.fixture
async def namespace(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """A namespace of its own for one test; its keys are deleted afterwards."""
    ns = f"t{uuid.uuid4().hex[:10]}"
    yield ns
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("broker") == "memory":
        return  # nothing of this test is in Redis
    if _redis_is_up(REDIS_URL):
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=f"*{ns}*", count=10_000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


FAST = {"block_ms": 100, "lease_ms": 600}
"""Broker options that keep tests quick: short blocking reads and leases."""


@pytest.fixture(params=["memory", "redis", "cluster"])
async def broker(request: pytest.FixtureRequest, namespace: str) -> AsyncIterator[Broker]:
    """The same behaviour tests run against the embedded broker, the Redis broker on one
    server, and (for tests/test_broker_behaviour.py, or everywhere with
    ``TOOLNEXUS_CLUSTER=all``) on a local Redis Cluster."""
    options: dict[str, int] = {}  # the embedded broker has no leases or blocking reads
    if request.param == "memory":
        url = "memory://"
    elif request.param == "redis":
        url, options = request.getfixturevalue("redis_url"), FAST
    else:
        url, options = request.getfixturevalue("redis_cluster").url, FAST
    async with toolnexus.connect(url, namespace=namespace, **options) as b:
        yield b


CLUSTER_EVERYWHERE = os.environ.get("TOOLNEXUS_CLUSTER") == "all"


SLOW_FIXTURES = frozenset({"agents", "browser", "redis_cluster"})
"""Fixtures that make a test ``slow`` (``./run quick`` skips it): agent processes,
chromium, a local Redis Cluster. Other slow tests carry the mark themselves."""


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks set here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` the tests that use a slow fixture (the ``broker`` fixture's "cluster"
    case too); run that case only for the behaviour suite, unless ``TOOLNEXUS_CLUSTER=all``
    asks for it everywhere (it keeps CI time in check)."""
    kept, dropped = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_cluster = callspec is not None and callspec.params.get("broker") == "cluster"
        if on_cluster or SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if on_cluster and not CLUSTER_EVERYWHERE and item.path.name != "test_broker_behaviour.py":
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A local Redis Cluster: 3 masters with one replica each, for the whole session."""
    from redis_topologies import LocalCluster  # it builds on RedisServer, defined here

    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def free_cluster_port() -> int:
    """A free port whose Cluster bus port (the port + 10000) is free too."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + 10000))
                except OSError:
                    continue
            return port


class _ExitedAtStart(RuntimeError):
    """redis-server exited before it answered (a port taken, for one)."""


class RedisServer:
    """A private redis-server on a free loopback port, which a test may stop and restart.

    With ``tls``, the port speaks only TLS (``rediss://``; ``args`` name the certificates).
    ``client_options`` (credentials, certificates) are what a client needs to ping it.
    """

    def __init__(
        self,
        directory: Path,
        *args: str,
        tls: bool = False,
        port: int | None = None,
        pick_port: Callable[[], int] = free_port,
        **client_options: Any,
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed (.ci/run installs it)")
        self.binary, self.directory, self.args = binary, directory, args
        # a port picked here may be taken by another process before the server binds it
        # (other test runs on the machine): its first start then tries a new one
        self._pick = None if port else pick_port
        self.port = port or pick_port()
        self.tls = tls
        self.url = f"{'rediss' if tls else 'redis'}://127.0.0.1:{self.port}/0"
        self.client_options = client_options
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        for _ in range(5 if self._pick is not None else 1):
            try:
                self._start()
            except _ExitedAtStart:
                if self._pick is None:
                    raise
                self.port = self._pick()
                self.url = f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"
            else:
                self._pick = None  # started: a restart keeps this port
                return
        raise RuntimeError("redis-server exited at start on five free ports in a row")

    def _start(self) -> None:
        ports = ("--port", "0", "--tls-port") if self.tls else ("--port",)
        self.process = subprocess.Popen(
            [
                self.binary,
                *ports,
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.directory),
                "--save",
                "",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _redis_is_up(self.url, **self.client_options):
            if self.process.poll() is not None:
                raise _ExitedAtStart(f"redis-server exited with status {self.process.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A started private redis-server with AOF on (``appendfsync always``)."""
    server = RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always")
    server.start()
    try:
        yield server
    finally:
        with contextlib.suppress(Exception):
            server.kill()


@dataclass
class Fleet:
    """A signed fleet on one private redis-server: an agent key and two responder keys."""

    url: str
    agent_key: SigningKey
    bot_key: SigningKey
    intern_key: SigningKey

    def agent(self) -> RedisBroker:
        """The waiting side: trusts the responders' keys, requires signatures."""
        broker = toolnexus.connect(
            self.url,
            namespace="sec",
            signing_key=self.agent_key,
            trusted_keys=Keyring.of(self.bot_key, self.intern_key),
            require_signatures=True,
            **FAST,
        )
        assert isinstance(broker, RedisBroker)
        return broker

    def responder(
        self,
        key: SigningKey | None = None,
        *,
        required: bool = True,
        trusted: Keyring | None = None,
    ) -> RedisBroker:
        """A responder process: trusts the agent's key (or ``trusted``)."""
        broker = toolnexus.connect(
            self.url,
            namespace="sec",
            signing_key=key or self.bot_key,
            trusted_keys=trusted or Keyring.of(self.agent_key),
            require_signatures=required,
            **FAST,
        )
        assert isinstance(broker, RedisBroker)
        return broker


@pytest.fixture
def fleet(redis_server: RedisServer) -> Fleet:
    return Fleet(
        redis_server.url,
        SigningKey.generate("agent-7"),
        SigningKey.generate("ops-bot"),
        SigningKey.generate("intern"),
    )


MCP_MAJOR = int(importlib.metadata.version("mcp").split(".")[0])
collect_ignore_glob = ["test_mcp1_*.py"] if MCP_MAJOR >= 2 else []
"""The mcp 1.x tests run in .venv-mcp1 (``./run test`` makes it), not beside mcp 2.x."""


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if not _installed("google-adk"):
    collect_ignore_glob.append("test_frameworks_google_adk.py")
"""google-adk's tests run in .venv-frameworks (``./run test`` makes it): its pins conflict
with .venv's."""
