"""``python -m bench.web_login [ROOT]``: the web page's time while 60 wrong logins run.

Serves the page (a token and a users file with one login; ``memory://``) in a child
process with ``ROOT/bridge`` and ``ROOT/workers`` first on ``PYTHONPATH`` (default: this
tree), then GETs it every 20 ms (open loop: a stalled page does not slow the asking)
for 2 s idle, and again while 60 wrong logins are sent at once: first all for one name
from one client, then (a fresh server) 60 names from 60 client addresses
(``X-Forwarded-For``, which uvicorn trusts from loopback), so that no backoff spares
the hashing. Prints the median and p95 page time of each phase and the logins' statuses.
"""

from __future__ import annotations

import asyncio
import collections
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx2 as httpx

TOKEN = "bench-token-0123456789"
LOGINS = 60
SERVER = f"""
import asyncio
import toolnexus
from toolnexus_workers.web.access import Access, hash_password
from toolnexus_workers.web.server import WebServer

async def main() -> None:
    access = Access(token={TOKEN!r}, users={{"alice": hash_password("correct horse")}})
    async with toolnexus.connect("memory://") as broker:
        async with WebServer(broker, port=0, access=access) as web:
            print(web.url, flush=True)
            await asyncio.Event().wait()

asyncio.run(main())
"""


async def _get(client: httpx.AsyncClient, times: list[float]) -> None:
    started = time.perf_counter()
    response = await client.get("/", headers={"authorization": f"Bearer {TOKEN}"})
    response.raise_for_status()
    times.append(time.perf_counter() - started)


async def _pages(client: httpx.AsyncClient, stop: asyncio.Event, times: list[float]) -> None:
    running = []
    while not stop.is_set():
        running.append(asyncio.create_task(_get(client, times)))
        await asyncio.sleep(0.02)
    await asyncio.gather(*running)


async def _login(client: httpx.AsyncClient, i: int, spread: bool) -> int:
    headers = {"x-forwarded-for": f"10.0.{i // 250}.{i % 250 + 1}"} if spread else {}
    form = {"name": f"user{i}" if spread else "alice", "password": "wrong"}
    response = await client.post("/login", data=form, headers=headers)
    return response.status_code


def _figures(label: str, times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    median = statistics.median(ordered)
    return f"{label}: {len(ordered)} pages, median {median * 1e3:.1f} ms, p95 {p95 * 1e3:.1f} ms"


async def _measure(url: str, spread: bool) -> None:
    limits = httpx.Limits(max_connections=200)
    async with (
        httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as pages,
        httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as logins,
    ):
        idle: list[float] = []
        stop = asyncio.Event()
        asking = asyncio.create_task(_pages(pages, stop, idle))
        await asyncio.sleep(2)
        stop.set()
        await asking
        print(_figures("  idle", idle))
        busy: list[float] = []
        stop = asyncio.Event()
        asking = asyncio.create_task(_pages(pages, stop, busy))
        started = time.perf_counter()
        codes = await asyncio.gather(*(_login(logins, i, spread) for i in range(LOGINS)))
        took = time.perf_counter() - started
        stop.set()
        await asking
        print(_figures(f"  during {LOGINS} wrong logins", busy))
        counted = dict(collections.Counter(codes))
        print(f"  the logins took {took:.2f} s; statuses {counted}")


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parents[1]).resolve()
    env = {**os.environ, "PYTHONPATH": f"{root / 'bridge'}:{root / 'workers'}"}
    for spread in (False, True):
        print("one name, one client" if not spread else "60 names from 60 addresses")
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER], env=env, stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            asyncio.run(_measure(server.stdout.readline().strip(), spread))
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
