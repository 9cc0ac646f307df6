"""The processes of a partition run: an agent that publishes and waits, a responder that
answers. Each appends its history events (see partition_history.py) to its own file, one
JSON line each, with the time (``t``, the host clock every namespace shares).

    python partition_roles.py agent URL NAMESPACE NAME HISTORY OPTIONS MODE RUN_S EVERY_S WAIT_S
        BURST
    python partition_roles.py responder URL NAMESPACE NAME HISTORY OPTIONS MODE RUN_S DELAY_S

``OPTIONS`` is the broker's options as JSON. An agent publishes ``BURST`` requests at
once, then one every ``EVERY_S`` for ``RUN_S`` seconds, each waiting up to ``WAIT_S``, then
waits for what is still open. A responder answers each request it is
handed (after ``DELAY_S``) with data of its own (its name and a counter, so that two
answers always differ), for ``RUN_S`` seconds.

``MODE`` shapes the requests (:data:`MODES`):

- ``plain``: one answer decides; the responders share one consumer group.
- ``quorum``: each request needs two votes (``Quorum(2)``); each responder reads in a
  group of its own (so every request reaches both) and votes as a person of its own.
  The deciding vote is an answer (``accepted`` when acknowledged); a vote acknowledged
  as counted without deciding is recorded as ``counted``.
- ``escalation``: each request escalates after :data:`HOP_S` from the agents' queue
  (which nobody answers) to ``oncall``, where the responders answer (their ``OPTIONS``
  carry ``queue="oncall"``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from partition_history import ACCEPTED, ALREADY_RESOLVED, COUNTED, FAILED, NOT_CONFIRMED

import toolnexus
from toolnexus import Quorum, Request
from toolnexus.errors import AlreadyVoted, BrokerUnavailable, NotConfirmed, NotResolved
from toolnexus.models import Hop
from toolnexus.redis_broker import RedisBroker

MODES = ("plain", "quorum", "escalation")
HOP_S = 1.5
"""How long an escalating request waits on the agents' queue before ``oncall``."""
ONCALL = "oncall"


def request_of(mode: str, request_id: str, prompt: str) -> Request:
    if mode == "quorum":
        return Request(id=request_id, kind="approval", prompt=prompt, quorum=Quorum(2))
    if mode == "escalation":
        return Request(id=request_id, kind="input", prompt=prompt, escalate=[Hop(HOP_S, ONCALL)])
    return Request(id=request_id, kind="input", prompt=prompt)


class History:
    def __init__(self, path: str, by: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.by = by

    def add(self, op: str, req: str, **fields: Any) -> None:
        event = {"op": op, "req": req, "by": self.by, "t": time.time(), **fields}
        os.write(self._fd, (json.dumps(event) + "\n").encode())


async def connected(url: str, namespace: str, options: dict[str, Any]) -> toolnexus.Broker:
    """A broker entered (its ``__aenter__`` pinged Redis), tried again for up to 60 s: a
    loaded machine can make the first connection slow."""
    deadline = time.monotonic() + 60
    while True:
        broker = toolnexus.connect(url, namespace=namespace, **options)
        try:
            await broker.__aenter__()
        except BrokerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)
            continue
        return broker


async def agent(
    url: str, namespace: str, name: str, path: str, options: dict[str, Any], mode: str,
    run_s: float, every_s: float, wait_s: float, burst: float,
) -> None:  # fmt: skip
    history = History(path, name)

    async def one(broker: toolnexus.Broker, number: int) -> None:
        request = request_of(mode, f"{name}-{number}", f"#{number}")
        history.add("publish", request.id)
        try:
            answer = await broker.wait_for(request, timeout_s=wait_s)
        except BrokerUnavailable:
            history.add("outcome", request.id, answer=None, reason="unavailable")
            return
        except toolnexus.ToolnexusError as exc:
            history.add("outcome", request.id, answer=None, reason=f"error {type(exc).__name__}")
            return
        if answer.reason is None:
            voters = [a.person for a in answer.approvals or ()]
            quorum = {"voters": voters} if request.quorum is not None else {}
            history.add("outcome", request.id, answer=answer.data, reason=None, **quorum)
        else:
            history.add("outcome", request.id, answer=None, reason=str(answer.reason))

    async with await connected(url, namespace, options) as broker:
        assert isinstance(broker, RedisBroker)
        history.add("ready", "-", waiter=broker.waiter_id)  # (where its state lives)
        waits = []
        started = time.monotonic()
        for number in range(int(burst)):  # held by the responders when the fault comes
            waits.append(asyncio.create_task(one(broker, number)))
        number = int(burst)
        while time.monotonic() - started < run_s:
            waits.append(asyncio.create_task(one(broker, number)))
            number += 1
            await asyncio.sleep(every_s)
        await asyncio.wait(waits, timeout=wait_s + 5)


async def responder(
    url: str, namespace: str, name: str, path: str, options: dict[str, Any], mode: str,
    run_s: float, delay_s: float,
) -> None:  # fmt: skip
    history = History(path, name)
    counter = 0

    async def answer_all(broker: toolnexus.Broker) -> None:
        nonlocal counter
        group = name if mode == "quorum" else "bot"  # a quorum: every request to each
        person = f"person-{name}" if mode == "quorum" else None
        async with broker.responder(group, name) as requests:
            async for pending in requests:
                await asyncio.sleep(delay_s)
                counter += 1
                data = {"by": name, "n": counter}
                told = ACCEPTED
                try:
                    if await pending.accept(data, person=person) is not None:
                        told = COUNTED  # a vote counted, not deciding
                except AlreadyVoted:
                    told = ALREADY_RESOLVED  # (delivered again: this person's vote stands)
                except NotConfirmed:
                    told = NOT_CONFIRMED
                except NotResolved:
                    told = ALREADY_RESOLVED
                except toolnexus.ToolnexusError:
                    told = FAILED
                voter = {"voter": person} if told == COUNTED else {}
                history.add("respond", pending.request.id, answer=data, told=told, **voter)

    async def keep_answering() -> None:
        async with await connected(url, namespace, options) as broker:
            history.add("ready", "-")
            while True:
                try:
                    await answer_all(broker)
                except toolnexus.ToolnexusError as exc:
                    print(f"responder {name}: {type(exc).__name__}: {exc}", flush=True)
                    await asyncio.sleep(0.5)

    try:
        async with asyncio.timeout(run_s):
            await keep_answering()
    except TimeoutError:
        pass


def main(argv: list[str]) -> None:
    role, url, namespace, name, path, options_json, mode, *rest = argv
    options = json.loads(options_json)
    numbers = [float(x) for x in rest]
    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}")
    if role == "agent":
        asyncio.run(agent(url, namespace, name, path, options, mode, *numbers))
    elif role == "responder":
        asyncio.run(responder(url, namespace, name, path, options, mode, *numbers))
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
