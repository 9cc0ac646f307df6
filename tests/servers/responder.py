"""A responder in its own process: answers toolnexus requests on Redis by prompt.

    python responder.py URL NAMESPACE RULES_JSON [QUEUE]

``RULES_JSON`` maps a prompt to what to do: ``{"accept": data}``, ``"decline"``,
``"dismiss"``, or ``"hold"`` (answer nothing: the asker withdraws or it expires).
Unknown prompts are declined. It reads queue ``QUEUE`` (``default``). Each request seen
is printed as one JSON line (id, prompt, source, seconds until it expires, meta), and
each event of the queue as one (``{"event", "id", "queue"}``), after ``ready``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import toolnexus


async def follow(events: toolnexus.EventStream) -> None:
    async for event in events:
        print(
            json.dumps(
                {"event": event.event, "id": event.id, "queue": getattr(event, "queue", None)}
            ),
            flush=True,
        )


async def main(url: str, namespace: str, rules: dict[str, Any], queue: str) -> None:
    async with (
        toolnexus.connect(
            url, namespace=namespace, queue=queue, block_ms=100, lease_ms=600
        ) as broker,
        broker.responder("process-responder") as requests,
        broker.events() as events,
    ):
        following = asyncio.create_task(follow(events))
        print(json.dumps("ready"), flush=True)
        async for pending in requests:
            request = pending.request
            expires = request.expires_at
            seen = {
                "id": request.id,
                "prompt": request.prompt,
                "kind": request.kind,
                "server": request.source.server,
                "tool": request.source.tool,
                "agent": request.source.agent,
                "timeout_s": None if expires is None else round(expires - request.created_at),
                "meta": request.meta,
                "allow": request.allow,
            }
            print(json.dumps(seen), flush=True)
            rule = rules.get(request.prompt, "decline")
            if rule == "hold":
                continue
            if rule == "dismiss":
                await pending.dismiss(person="tester")
            elif isinstance(rule, dict) and "accept" in rule:
                await pending.accept(rule["accept"], person="tester")
            else:
                await pending.decline(person="tester")
        following.cancel()


if __name__ == "__main__":
    queue = sys.argv[4] if len(sys.argv) > 4 else "default"
    asyncio.run(main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), queue))
