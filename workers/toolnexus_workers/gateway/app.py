"""The wait gateway's HTTP API: an agent in any language POSTs a §10 request and gets its §10
answer (SPEC §10; the JSON form is :mod:`toolnexus._wire10`). Described in ``openapi.json``
beside this file, served at ``GET /openapi.json``.

- ``POST /v1/requests`` (body: a §10 Request) publishes it as the agent its bearer token
  names, signed with that agent's key, and waits: without ``?wait=`` until the answer (long
  polling: ``200``, a space every ``keepalive_s`` until the §10 Answer, which JSON readers
  skip), with ``?wait=S`` at most S seconds, then ``202`` ``{"id", "status": "open"}`` and
  ``Location: /v1/requests/{id}`` (``?wait=0``: create, then poll). Posting the same request
  again attaches to it; another with the same id is ``409``.
- ``GET /v1/requests/{id}`` waits for it as POST does; ``404`` if this agent has no such
  request (or its answer was given more than ``keep_s`` ago).
- ``DELETE /v1/requests/{id}`` withdraws it (responders are told): ``200`` with the answer
  it ended with (``cancelled``, ``bridge.reason`` ``withdrawn``, if it was still open).

A responder that refuses the request itself (it dead-lettered it: a missing or bad
signature, a key it does not trust, bytes it cannot read) ends the wait at once, as
``toolnexus ask`` does (the refusals that count, and the grace an answer on its way still
gets, are :meth:`RedisBroker.refusal <toolnexus.redis_broker.RedisBroker.refusal>`'s and
:data:`~toolnexus.redis_broker.REFUSAL_GRACE_S`): the request is withdrawn and its answer
is ``{"id", "ok": false, "reason": "cancelled", "bridge": {"reason": "withdrawn",
"refused": REASON, "responder": NAME}}`` (:func:`refused_answer`).

Every outcome is an Answer with status 200, as ``wait_for`` gives it; errors are
``{"error": "..."}`` with 400 (a bad body or parameter, named), 401 (no or an unknown bearer
token), 404, 409, 413 (over :data:`~toolnexus_workers.bodies.MAX_BODY_BYTES`) or 503 (Redis
unreachable, or too many requests open); bodies obey :mod:`toolnexus_workers.bodies`. A wait
goes on when its HTTP connection drops (GET it again) until it is answered, expires or is
withdrawn.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from toolnexus import Answer, Broker, Request, Source
from toolnexus.codec import answer_to_dict, answer_to_json, request_from_json, request_to_dict
from toolnexus.errors import BrokerClosed, BrokerUnavailable, InvalidRequest, Refused
from toolnexus.keys import check_request_id
from toolnexus.models import UNAVAILABLE, WITHDRAWN
from toolnexus.redis_broker import answer_or_refusal

from ..bodies import BadBody, json_object, read_body
from .tokens import Tokens

log = logging.getLogger("toolnexus.gateway")

OPENAPI = Path(__file__).with_name("openapi.json")
"""The gateway's OpenAPI document."""

KEEPALIVE = b" "
"""What a long poll sends while it waits: whitespace, which a JSON reader skips."""

Outcome = Answer | Refused
"""How a wait ends: its answer, or a responder's refusal of the request."""


@dataclass
class Wait:
    """One agent's request, waited for by the gateway whether or not a client is connected."""

    agent: str
    request: Request
    task: asyncio.Task[Outcome]


class Agents:
    """One broker per agent, made by ``make(agent)`` on first use (connected to Redis as
    that agent, signing with its key) and kept until :meth:`aclose`."""

    def __init__(self, make: Callable[[str], Broker]) -> None:
        self._make = make
        self._brokers: dict[str, Broker] = {}
        self._lock = asyncio.Lock()

    async def broker(self, agent: str) -> Broker:
        """The connected broker of ``agent``.

        Raises:
            BrokerUnavailable: Redis cannot be reached.
        """
        async with self._lock:
            broker = self._brokers.get(agent)
            if broker is None:
                broker = await self._make(agent).__aenter__()
                self._brokers[agent] = broker
            return broker

    async def aclose(self) -> None:
        """Close every broker (their open waits are withdrawn)."""
        brokers, self._brokers = list(self._brokers.values()), {}
        for broker in brokers:
            await broker.aclose()


def error(status: int, message: str, **headers: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers or None)


def answer_response(answer: Answer) -> Response:
    return Response(answer_to_json(answer), media_type="application/json")


class Gateway:
    """The gateway's routes over ``agents``. With ``tokens``, every call needs a bearer token
    and acts as the agent it names; without, every call acts as ``anonymous_agent`` (the
    gateway then listens on loopback only, see
    :class:`~toolnexus_workers.gateway.server.GatewayServer`). At most ``max_waits``
    requests are open at once (more: 503)."""

    def __init__(
        self,
        agents: Agents,
        tokens: Tokens,
        *,
        anonymous_agent: str = "anon",
        keepalive_s: float = 15.0,
        keep_s: float = 300.0,
        max_waits: int = 10_000,
    ) -> None:
        self.agents, self.tokens = agents, tokens
        self.anonymous_agent = anonymous_agent
        self.keepalive_s, self.keep_s, self.max_waits = keepalive_s, keep_s, max_waits
        self.waits: dict[tuple[str, str], Wait] = {}
        self._openapi = OPENAPI.read_bytes()

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/openapi.json", self.openapi, methods=["GET"]),
                Route("/v1/requests", self.create, methods=["POST"]),
                Route("/v1/requests/{id:path}", self.poll, methods=["GET"]),
                Route("/v1/requests/{id:path}", self.cancel, methods=["DELETE"]),
            ]
        )

    async def openapi(self, request: HttpRequest) -> Response:
        return Response(self._openapi, media_type="application/json")

    def agent(self, request: HttpRequest) -> str | None:
        """The agent the call's bearer token names (the anonymous one without tokens)."""
        if not self.tokens:
            return self.anonymous_agent
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return self.tokens.agent(token.strip())

    async def create(self, request: HttpRequest) -> Response:
        agent = self.agent(request)
        if agent is None:
            return unauthorized()
        wait_s = wait_parameter(request)
        if isinstance(wait_s, Response):
            return wait_s
        try:
            raw = await read_body(request.stream())
            json_object(raw)  # the shared rule first: bounded, UTF-8, not nested too deep
            asked = request_from_json(raw)
        except BadBody as bad:
            return error(bad.status, f"§10 request: {bad.reason}")
        except InvalidRequest as exc:
            return error(400, str(exc))
        problem = check_request_id(asked.id)
        if problem is not None:
            return error(400, f"§10 request: id {asked.id[:100]!r}: {problem}")
        wait = self.waits.get((agent, asked.id)) or await self.start(agent, asked)
        if isinstance(wait, Response):
            return wait
        if request_to_dict(wait.request) != request_to_dict(asked):
            return error(
                409,
                f"request {asked.id!r} is already being waited for and asks something "
                "else: a request id names one question",
            )
        return await self.respond(wait, wait_s)

    async def start(self, agent: str, asked: Request) -> Wait | Response:
        """Publish ``asked`` as ``agent`` and wait for it in the background (or the wait
        for its id that another call started meanwhile)."""
        try:
            broker = await self.agents.broker(agent)
        except BrokerUnavailable as exc:
            return error(503, str(exc))
        key = (agent, asked.id)
        if key in self.waits:  # posted twice at once: one wait
            return self.waits[key]
        if sum(1 for wait in self.waits.values() if not wait.task.done()) >= self.max_waits:
            return error(503, f"{self.max_waits} requests are open here: try again later")
        request = msgspec.structs.replace(asked, source=Source(agent=agent))
        task = asyncio.create_task(self.wait_for(broker, request), name=f"gateway {asked.id}")
        wait = self.waits[key] = Wait(agent, request, task)
        await asyncio.sleep(0)  # the wait's first step: its checks, before anything is sent
        if task.done() and task.exception() is not None:
            del self.waits[key]
            return finished(task)
        task.add_done_callback(lambda _: self.forget_later(key, wait))
        return wait

    @staticmethod
    async def wait_for(broker: Broker, request: Request) -> Outcome:
        """The answer to ``request``, or a responder's refusal of it (the request then
        withdrawn); cancelled (DELETE, shutdown), the withdrawal."""
        try:
            return await unless_refused(broker, request.id, broker.wait_for(request))
        except asyncio.CancelledError:
            return Answer(id=request.id, ok=False, reason=WITHDRAWN)
        except BrokerClosed:
            return Answer(id=request.id, ok=False, reason=UNAVAILABLE)

    def forget_later(self, key: tuple[str, str], wait: Wait) -> None:
        def forget() -> None:
            if self.waits.get(key) is wait:
                del self.waits[key]

        asyncio.get_running_loop().call_later(self.keep_s, forget)

    async def respond(self, wait: Wait, wait_s: float | None) -> Response:
        """The answer of ``wait``: after at most ``wait_s`` (202 if still open), or, with
        None, a long poll (keep-alives until the answer)."""
        if wait_s is None:
            if wait.task.done():
                return finished(wait.task)
            return StreamingResponse(self.long_poll(wait), media_type="application/json")
        done, _ = await asyncio.wait({wait.task}, timeout=wait_s)
        if done:
            return finished(wait.task)
        location = f"/v1/requests/{quote(wait.request.id, safe='')}"
        return JSONResponse(
            {"id": wait.request.id, "status": "open"},
            status_code=202,
            headers={"Location": location},
        )

    async def long_poll(self, wait: Wait) -> AsyncIterator[bytes]:
        while True:
            done, _ = await asyncio.wait({wait.task}, timeout=self.keepalive_s)
            if done:
                yield bytes(finished(wait.task).body)
                return
            yield KEEPALIVE

    async def poll(self, request: HttpRequest) -> Response:
        found = self.find(request)
        if isinstance(found, Response):
            return found
        wait_s = wait_parameter(request)
        if isinstance(wait_s, Response):
            return wait_s
        return await self.respond(found, wait_s)

    async def cancel(self, request: HttpRequest) -> Response:
        found = self.find(request)
        if isinstance(found, Response):
            return found
        found.task.cancel()
        outcome = await asyncio.shield(found.task)
        log.info("request %s of %s withdrawn by its agent", found.request.id, found.agent)
        return outcome_response(outcome)

    def find(self, request: HttpRequest) -> Wait | Response:
        agent = self.agent(request)
        if agent is None:
            return unauthorized()
        request_id = request.path_params["id"]
        wait = self.waits.get((agent, request_id))
        if wait is None:
            return error(404, f"no request {request_id[:100]!r} of agent {agent!r} here")
        return wait

    async def aclose(self) -> None:
        """Withdraw every open wait, then close the agents' brokers."""
        tasks = [wait.task for wait in self.waits.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.agents.aclose()


async def unless_refused(
    broker: Broker, request_id: str, waiting: Coroutine[Any, Any, Answer]
) -> Outcome:
    """The answer ``waiting`` gives, or the final refusal of the request, by the rule
    ``toolnexus ask`` follows (:func:`~toolnexus.redis_broker.answer_or_refusal`), logged."""
    outcome = await answer_or_refusal(broker, request_id, waiting)
    if isinstance(outcome, Refused):
        log.warning("%s: the request is withdrawn", outcome)
    return outcome


def refused_answer(refusal: Refused) -> dict[str, Any]:
    """The §10 answer a gateway agent gets when a responder refused its request: the
    withdrawal (``cancelled``, ``bridge.reason`` ``withdrawn``) with ``bridge.refused``, the
    responder's reason, and ``bridge.responder``, who refused."""
    values = answer_to_dict(Answer(id=refusal.request_id, ok=False, reason=WITHDRAWN))
    details = values.setdefault("bridge", {})
    details["refused"] = refusal.reason
    if refusal.responder is not None:
        details["responder"] = refusal.responder
    return values


def outcome_response(outcome: Outcome) -> Response:
    if isinstance(outcome, Refused):
        return JSONResponse(refused_answer(outcome))
    return answer_response(outcome)


def finished(task: asyncio.Task[Outcome]) -> Response:
    """The response for a wait that ended: its Answer, or (refused at its first step, e.g. an
    id already waited for in this process) an error."""
    failure = task.exception()
    if failure is None:
        return outcome_response(task.result())
    return error(400 if isinstance(failure, InvalidRequest) else 503, str(failure))


def unauthorized() -> Response:
    return error(
        401, "a bearer token that names an agent is required", **{"WWW-Authenticate": "Bearer"}
    )


def wait_parameter(request: HttpRequest) -> float | Response | None:
    """``?wait=`` in seconds (None without it: a long poll), or a 400 response naming it."""
    text = request.query_params.get("wait")
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        return error(400, f"wait must be a number of seconds, 0 or more, not {text[:20]!r}")
    return value


def openapi_document() -> dict[str, Any]:
    """The gateway's OpenAPI document, parsed."""
    document: dict[str, Any] = json.loads(OPENAPI.read_bytes())
    return document
