"""The Celery app of the peer case: Redis broker and Redis result backend, defaults otherwise."""

from __future__ import annotations

from typing import Any

from celery import Celery

from bench.common import ANSWER_DATA
from bench.peers.apps import URL

app = Celery("bench", broker=URL, backend=URL)
app.conf.worker_hijack_root_logger = False


@app.task(name="bench.echo")  # type: ignore[untyped-decorator]
def echo(payload: dict[str, Any]) -> dict[str, Any]:
    return dict(ANSWER_DATA)
