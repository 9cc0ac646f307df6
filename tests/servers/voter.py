"""A responder in its own process that votes on quorum requests for several persons, as a
web page or a chat bot does for its users (SPEC §14).

    python voter.py URL NAMESPACE VOTES_JSON

``VOTES_JSON`` is a list of ``[person, "accept" | "decline"]``: each request shown gets
one vote per entry, in order, through the same pending. Each vote's result is printed as
one JSON line: ``{"id", "person", "result"}`` where ``result`` is ``"counted"`` (with
``count``, ``need`` and ``approvers``), ``"resolved"``, or the reason it was refused; and
``"ready"`` once reading. Signing keys come from ``TOOLNEXUS_*`` variables.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import toolnexus


async def main(url: str, namespace: str, votes: list[tuple[str, str]]) -> None:
    async with (
        toolnexus.connect(url, namespace=namespace, block_ms=100, lease_ms=600) as broker,
        broker.responder("voters") as requests,
    ):
        print(json.dumps("ready"), flush=True)
        async for pending in requests:
            for person, vote in votes:
                line: dict[str, Any] = {"id": pending.request.id, "person": person}
                try:
                    if vote == "accept":
                        progress = await pending.accept(person=person)
                    else:
                        progress = await pending.decline(person=person)
                except toolnexus.NotResolved as exc:
                    line["result"] = exc.reason
                else:
                    if progress is None:
                        line["result"] = "resolved"
                    else:
                        line["result"] = "counted"
                        line.update(
                            count=progress.count, need=progress.need, approvers=progress.approvers
                        )
                print(json.dumps(line), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3])))
