"""The taskiq broker of the peer case: ``RedisStreamBroker`` + ``RedisAsyncResultBackend``."""

from __future__ import annotations

from typing import Any

from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

from bench.common import ANSWER_DATA
from bench.peers.apps import URL

broker = RedisStreamBroker(url=URL).with_result_backend(RedisAsyncResultBackend(redis_url=URL))


@broker.task(task_name="bench.echo")
async def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return dict(ANSWER_DATA)
