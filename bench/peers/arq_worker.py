"""``python -m bench.peers.arq_worker POLL_DELAY_S``: an arq worker for ``arq_echo``."""

from __future__ import annotations

import asyncio
import sys

from arq.connections import RedisSettings
from arq.worker import Worker

from bench.peers.apps import URL, arq_echo


async def main(poll_delay_s: float | None) -> None:
    options = {} if poll_delay_s is None else {"poll_delay": poll_delay_s}
    worker = Worker(
        functions=[arq_echo],
        redis_settings=RedisSettings.from_dsn(URL),
        handle_signals=True,
        **options,  # type: ignore[arg-type]
    )
    await worker.async_run()


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "default"
    asyncio.run(main(None if arg == "default" else float(arg)))
