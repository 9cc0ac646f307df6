"""A responder process for the fault suite: accepts every request it reads and appends
the id of each acceptance Redis took to a file (one line each, ``O_APPEND``).

    python accepting_responder.py URL NAMESPACE ACCEPTED_FILE DELAY_S

``DELAY_S`` is how long it thinks before each answer, so that a kill finds requests held.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys

import toolnexus


async def main(url: str, namespace: str, accepted_file: str, delay_s: str) -> None:
    fd = os.open(accepted_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    async with (
        toolnexus.connect(url, namespace=namespace, block_ms=100, lease_ms=1000) as broker,
        broker.responder("bot", f"proc-{os.getpid()}") as requests,
    ):
        async for pending in requests:
            await asyncio.sleep(float(delay_s))
            with contextlib.suppress(toolnexus.ToolnexusError):  # taken by another: refused
                await pending.accept({"by": os.getpid()})
                os.write(fd, f"{pending.request.id}\n".encode())


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
