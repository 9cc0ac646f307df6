"""The baseline of the scale case: what a wait costs with no broker at all.

``waits`` asyncio tasks, each awaiting a future kept in a dict by request id:
the least any implementation can hold per pending wait in Python. The broker
cases report their RSS per wait; this tells how much of it is the task itself.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from bench.common import CaseResult, Scale, settled_rss


def baseline_case(url: str, params: dict[str, Any]) -> CaseResult:
    waits = int(params["waits"])

    async def run() -> CaseResult:
        ids = [uuid.uuid4().hex for _ in range(waits)]
        pending: dict[str, asyncio.Future[Any]] = {}

        async def wait(request_id: str) -> Any:
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            pending[request_id] = fut
            return await fut

        rss0 = settled_rss()
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(wait(i)) for i in ids]
        await asyncio.sleep(0)
        publish_s = time.perf_counter() - t0
        await asyncio.sleep(0.2)
        rss1 = settled_rss()
        t1 = time.perf_counter()
        for fut in pending.values():
            fut.set_result(True)
        await asyncio.gather(*tasks)
        resolve_s = time.perf_counter() - t1
        return CaseResult(
            case="bare task",
            variant="baseline",
            settings="asyncio task awaiting a future in a dict; no Redis",
            scale=Scale(
                waits=waits,
                rss_before_bytes=rss0,
                rss_delta_bytes=rss1 - rss0,
                per_wait_bytes=(rss1 - rss0) / waits,
                connections=0,
                connections_at_one=0,
                publish_s=publish_s,
                resolve_s=resolve_s,
            ),
        )

    return asyncio.run(run())
