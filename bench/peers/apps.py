"""Worker-side code of every peer, importable by their worker processes.

The Redis URL comes from ``BENCH_REDIS_URL`` (set by the case that starts the worker).
Each task returns the benchmark's answer data for the benchmark's payload.
"""

from __future__ import annotations

import os
from typing import Any

from bench.common import ANSWER_DATA

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def echo(payload: dict[str, Any]) -> dict[str, Any]:
    """RQ job: the answer to ``payload``."""
    return dict(ANSWER_DATA)


async def arq_echo(ctx: dict[str, Any], payload: dict[str, Any]) -> dict[str, Any]:
    """arq job: the answer to ``payload``."""
    return dict(ANSWER_DATA)
