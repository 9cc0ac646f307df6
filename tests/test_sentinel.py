"""SPEC §11 on a Sentinel-watched master: waits continue on the new master after a
failover. One master, one replica and three Sentinels on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import toolnexus
from conftest import FAST
from redis_topologies import LocalSentinel, wait_until
from toolnexus import ConfigurationError, Request
from toolnexus.models import new_id

pytestmark = [pytest.mark.redis, pytest.mark.slow]  # private Cluster / Sentinel servers


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[LocalSentinel]:
    topology = LocalSentinel(tmp_path)
    try:
        topology.start()
        yield topology
    finally:
        topology.stop()


def test_a_sentinel_url_must_name_its_master() -> None:
    with pytest.raises(ConfigurationError, match="ends in /master-name"):
        toolnexus.connect("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="every address must be host:port"):
        toolnexus.connect("redis+sentinel://127.0.0.1:26379,nowhere/mymaster")


async def test_waits_continue_on_the_new_master_after_a_failover(
    sentinel: LocalSentinel, namespace: str
) -> None:
    async with toolnexus.connect(sentinel.url, namespace=namespace, **FAST) as broker:
        requests = [Request(id=new_id(), kind="approval", prompt=f"#{i}") for i in range(20)]
        waits = [asyncio.create_task(broker.wait_for(r, timeout_s=60)) for r in requests]
        await asyncio.sleep(1.0)  # published and replicated
        old_port = sentinel.master.port
        sentinel.master.kill()
        killed_at = time.monotonic()

        def failed_over() -> bool:
            return sentinel.master_port() != old_port

        await asyncio.to_thread(wait_until, "the sentinels fail the master over", failed_over, 40)
        assert sentinel.master_port() == sentinel.replica.port

        async def accept_all() -> None:
            async with broker.responder("bot") as responder:
                async for pending in responder:
                    with contextlib.suppress(toolnexus.ToolnexusError):
                        await pending.accept()

        answering = asyncio.create_task(accept_all())
        try:
            answers = await asyncio.wait_for(asyncio.gather(*waits), timeout=45)
        finally:
            answering.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await answering
        recovered_s = time.monotonic() - killed_at
    print(f"Sentinel failover: {len(requests)} waits answered {recovered_s:.2f} s after the kill")
    assert [a.ok for a in answers] == [True] * len(requests)
    assert recovered_s < 45


async def test_clients_follow_the_switch_not_their_command_timeout(
    sentinel: LocalSentinel, namespace: str
) -> None:
    """A master frozen (SIGSTOP: its connections stay open and silent, as behind a
    partition) is failed over; the agent, whose every command would wait 30 s on it,
    reaches the new master within seconds of Sentinel's switch (issue 40: it waited out
    two command timeouts). Its waits are answered there."""
    options = {**FAST, "command_timeout_s": 30.0}
    async with toolnexus.connect(sentinel.url, namespace=namespace, **options) as agent:
        requests = [Request(id=new_id(), kind="approval", prompt=f"#{i}") for i in range(5)]
        waits = [asyncio.create_task(agent.wait_for(r, timeout_s=90)) for r in requests]
        await asyncio.sleep(1.0)  # published and replicated
        old_port = sentinel.master.port
        assert sentinel.master.process is not None
        frozen = sentinel.master.process
        frozen.send_signal(signal.SIGSTOP)
        try:

            def failed_over() -> bool:
                return sentinel.master_port() != old_port

            await asyncio.to_thread(wait_until, "the sentinels fail over", failed_over, 40)
            switched_at = time.monotonic()
            async with (
                toolnexus.connect(sentinel.url, namespace=namespace, **FAST) as bot,
                bot.responder("bot") as responder,
            ):

                async def accept_all() -> None:
                    async for pending in responder:
                        with contextlib.suppress(toolnexus.ToolnexusError):
                            await pending.accept()

                answering = asyncio.create_task(accept_all())
                try:
                    answers = await asyncio.wait_for(asyncio.gather(*waits), timeout=60)
                finally:
                    answering.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await answering
            after_switch_s = time.monotonic() - switched_at
        finally:
            frozen.send_signal(signal.SIGCONT)
    print(f"frozen master: waits answered {after_switch_s:.2f} s after Sentinel's switch")
    assert [a.ok for a in answers] == [True] * len(requests)
    assert after_switch_s < 10  # its commands to the frozen master would wait 30 s
