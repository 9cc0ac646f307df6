"""Channels: each way a person answers, or an agent waits, through its public interface.

Each worker runs as ``python -m toolnexus.cli worker NAME`` in a process of its own, on
the benchmark's Redis, as a user would run it; the agent (a ``toolnexus.connect`` broker),
the webhook receiver and the SMTP server run in the case process. One request at a time:

- ``http``: ``POST /v1/requests/{id}/answer`` (``toolnexus worker http``, kept-alive
  connection) until the agent has the answer; timed once the worker shows the request;
- ``link``: an answer link's ``POST /v1/links/TOKEN`` (the link from the webhook worker's
  delivery, taken by ``toolnexus worker http``) until the agent has the answer;
- ``webhook``: the agent's publish until the receiver has the verified, signed delivery
  (``toolnexus worker webhook``; the request is then answered through its link);
- ``email``: the agent's publish until aiosmtpd has the mail (``toolnexus worker email``;
  the request is then answered through the mail's link);
- ``gateway``: an agent's long poll, ``POST /v1/requests`` to ``toolnexus worker gateway``,
  answered by the same responder as the broker's own round trip (bench.tnx), until the
  response's JSON answer is read;
- ``auto``: the agent's ``wait_for`` answered by ``toolnexus worker auto`` (one rule).

Each row's budget is a ratio to the broker's own round trip measured in the same run
(``toolnexus | default``), :data:`BUDGETS`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Final

from bench.common import ANSWER_DATA, PAYLOAD, CaseResult, latency
from bench.tnx import NAMESPACE, QUEUE, Responder

CHANNELS: Final[dict[str, str]] = {
    "http": "POST /v1/requests/{id}/answer (toolnexus worker http) until the agent has it",
    "link": "POST of the webhook's answer link (toolnexus worker http) until the agent has it",
    "webhook": "publish until the receiver has the signed delivery (toolnexus worker webhook)",
    "email": "publish until aiosmtpd has the mail (toolnexus worker email)",
    "gateway": "an agent's long poll on toolnexus worker gateway, answered by the responder",
    "auto": "wait_for answered by toolnexus worker auto (one accept rule)",
}
"""What each channel row times."""

BUDGETS: Final[dict[str, float]] = {
    "http": 4.0,  # uvicorn + starlette + a token check + the answer: ~1 ms beyond the broker
    "link": 5.0,  # the same, with the link's signature checked and its single use recorded
    "webhook": 8.0,  # an HTTP client (httpx), a signed message, the receiver's check
    "email": 15.0,  # a MIME message built, a new SMTP connection per mail (5 SMTP exchanges)
    "gateway": 6.0,  # an HTTP long poll in front of the broker's own round trip
    "auto": 1.5,  # the broker's round trip with a rule evaluated: nothing else in the way
}
"""Each channel's p50 budget, as a ratio to the broker's own p50 in the same run (why each:
docs/explanation/performance.md, "Channels")."""

TOKEN_NAME: Final = "bench"
RECIPIENT: Final = "bench@example.com"


def free_port() -> int:
    """A free loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Worker:
    """``toolnexus worker NAME ARGS`` in a process of its own, its output in ``log``."""

    def __init__(
        self, url: str, name: str, args: list[str], log: Path, profile_to: str | None = None
    ) -> None:
        profiled = ["-m", "cProfile", "-o", profile_to] if profile_to else []
        self.command = [
            sys.executable, *profiled, "-m", "toolnexus.cli", "worker", name,
            "--url", url, "--namespace", NAMESPACE, "--queue", QUEUE, *args,
        ]  # fmt: skip
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Worker:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def check(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{' '.join(self.command)} exited: {tail}")

    async def listening(self, port: int, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.check()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{' '.join(self.command)} did not listen") from None
                await asyncio.sleep(0.05)
                continue
            writer.close()
            await writer.wait_closed()
            return

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _request() -> Any:
    import toolnexus
    from toolnexus.models import new_id

    return toolnexus.Request(id=new_id(), kind="input", prompt="bench", data=PAYLOAD)


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    """Ask another process ``check`` every 0.5 ms until it holds (untimed set-up)."""
    async with asyncio.timeout(timeout_s):
        while True:
            if await check():
                return
            await asyncio.sleep(0.0005)


class Sink:
    """Deliveries (webhook messages or mails) by request id, each with when it came."""

    def __init__(self) -> None:
        self.got: dict[str, tuple[int, Any]] = {}
        self.arrived = asyncio.Event()

    def put(self, request_id: str, item: Any) -> None:
        self.got.setdefault(request_id, (time.perf_counter_ns(), item))
        self.arrived.set()

    async def take(self, request_id: str, timeout_s: float = 30) -> tuple[int, Any]:
        async with asyncio.timeout(timeout_s):
            while request_id not in self.got:
                self.arrived.clear()
                await self.arrived.wait()
        return self.got.pop(request_id)


@contextlib.asynccontextmanager
async def _receiver(secret: str, sink: Sink) -> AsyncIterator[str]:
    """A webhook receiver (starlette on uvicorn) that verifies each message's signature."""
    import uvicorn
    from standardwebhooks.webhooks import Webhook
    from starlette.applications import Starlette
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response
    from starlette.routing import Route

    hook = Webhook(secret)

    async def receive(request: HttpRequest) -> Response:
        message = hook.verify(await request.body(), dict(request.headers))
        if message["type"] == "request.open":
            sink.put(message["data"]["request"]["id"], message["data"]["answer_link"])
        return Response(status_code=204)

    port = free_port()
    app = Starlette(routes=[Route("/hook", receive, methods=["POST"])])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    serving = asyncio.create_task(server.serve())

    async def started() -> bool:
        return bool(server.started)

    await _until(started)
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        server.should_exit = True
        await serving


class _Mailbox:
    """aiosmtpd's handler: each mail's answer link (``Approve``/``Open the form``) by the
    request id in its ``X-Toolnexus-Request`` header."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        import email
        import email.policy
        import re

        mail = email.message_from_bytes(envelope.content, policy=email.policy.default)
        body = mail.get_body(("plain",))
        text = body.get_content().replace("\r\n", "\n") if body is not None else ""
        link = re.search(r"^(?:Approve|Open the form): (\S+)$", text, re.M)
        self.sink.put(str(mail.get("X-Toolnexus-Request", "")), link.group(1) if link else "")
        return "250 OK"


@contextlib.asynccontextmanager
async def _smtp(sink: Sink) -> AsyncIterator[int]:
    from aiosmtpd.smtp import SMTP

    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: SMTP(_Mailbox(sink)), "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


def channel_case(url: str, params: dict[str, Any]) -> CaseResult:
    """One channel's round trips: ``params["variant"]`` is a key of :data:`CHANNELS`; with
    ``params["profile_dir"]``, each worker runs under cProfile (wall clock) and leaves
    ``VARIANT-WORKER.prof`` there."""
    variant = str(params["variant"])
    if variant not in CHANNELS:
        raise ValueError(f"unknown channel {variant!r} (one of {', '.join(CHANNELS)})")
    with tempfile.TemporaryDirectory(prefix="toolnexus-bench-channel-") as workdir:
        logdir = Path(params.get("logdir") or workdir)
        logdir.mkdir(parents=True, exist_ok=True)
        samples = asyncio.run(_measure(url, variant, Path(workdir), logdir, params))
    return CaseResult(
        case="channel",
        variant=variant,
        settings=CHANNELS[variant],
        latency=latency(samples, int(params["warmup"])),
        samples_ms=[s / 1e6 for s in samples],
    )


async def _measure(
    url: str, variant: str, workdir: Path, logdir: Path, params: dict[str, Any]
) -> list[int]:
    import httpx2 as httpx

    import toolnexus
    from toolnexus_workers.http.tokens import add_token

    warmup, n = int(params["warmup"]), int(params["n"])
    link_secret = secrets.token_urlsafe(32)
    token = add_token(workdir / "tokens.toml", TOKEN_NAME, ["*"])
    bearer = {"authorization": f"Bearer {token}"}
    http_port = free_port()
    api = f"http://127.0.0.1:{http_port}"
    http_args = [
        "--tokens", str(workdir / "tokens.toml"), "--port", str(http_port),
        "--link-secret", link_secret,
    ]  # fmt: skip
    with contextlib.ExitStack() as processes:

        def start(name: str, args: list[str]) -> Worker:
            profile = params.get("profile_dir")
            profile_to = f"{profile}/{variant}-{name}.prof" if profile else None
            log = logdir / f"channel-{variant}-{name}.log"
            return processes.enter_context(Worker(url, name, args, log, profile_to))

        async with (
            contextlib.AsyncExitStack() as stack,
            httpx.AsyncClient(timeout=60) as client,
            toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker,
        ):

            async def shown(request_id: str) -> None:
                async def check() -> bool:
                    got = await client.get(f"{api}/v1/requests/{request_id}", headers=bearer)
                    return got.status_code == 200

                await _until(check)

            async def answered(wait: asyncio.Task[Any], post: Awaitable[Any]) -> int:
                """Time from now until ``wait`` (the agent's) has the answer ``post`` sends."""
                t0 = time.perf_counter_ns()
                posting = asyncio.ensure_future(post)
                answer = await wait
                took = time.perf_counter_ns() - t0
                response = await posting
                if response.status_code != 200 or not answer.ok:
                    raise RuntimeError(f"{response.status_code} {response.text}: {answer}")
                return took

            one: Callable[[], Awaitable[int]]
            if variant == "http":
                http = start("http", http_args)
                await http.listening(http_port)

                async def one() -> int:
                    request = _request()
                    wait = asyncio.create_task(broker.wait_for(request, timeout_s=60))
                    await shown(request.id)
                    post = client.post(
                        f"{api}/v1/requests/{request.id}/answer",
                        json={"action": "accept", "data": ANSWER_DATA},
                        headers=bearer,
                    )
                    return await answered(wait, post)

            elif variant in ("link", "webhook", "email"):
                http = start("http", http_args)
                await http.listening(http_port)
                sink = Sink()
                if variant == "email":
                    smtp_port = await stack.enter_async_context(_smtp(sink))
                    routes = workdir / "routes.toml"
                    routes.write_text(f'[[route]]\nkind = "input"\nto = ["{RECIPIENT}"]\n')
                    start("email", [
                        "--rules", str(routes), "--from", "toolnexus@example.com",
                        "--smtp-host", "127.0.0.1", "--smtp-port", str(smtp_port),
                        "--smtp-tls", "none", "--link-secret", link_secret, "--link-base", api,
                    ])  # fmt: skip
                else:
                    secret = "whsec_" + base64.b64encode(os.urandom(24)).decode()
                    hook_url = await stack.enter_async_context(_receiver(secret, sink))
                    start("webhook", [
                        "--endpoint", f"bench={hook_url}", "--webhook-secret", secret,
                        "--link-secret", link_secret, "--link-base", api,
                    ])  # fmt: skip

                async def one() -> int:
                    request = _request()
                    t0 = time.perf_counter_ns()
                    wait = asyncio.create_task(broker.wait_for(request, timeout_s=60))
                    came, link = await sink.take(request.id)
                    delivered = came - t0
                    await shown(request.id)
                    post = client.post(link, json={"action": "accept", "data": ANSWER_DATA})
                    by_link = await answered(wait, post)
                    return by_link if variant == "link" else delivered

            elif variant == "gateway":
                gateway_port = free_port()
                gateway = start("gateway", ["--port", str(gateway_port), "--agent", "bench-agent"])
                processes.enter_context(Responder(url))
                await gateway.listening(gateway_port)

                async def one() -> int:
                    request = _request()
                    expires = datetime.now(UTC) + timedelta(seconds=60)
                    body = {
                        "id": request.id,
                        "kind": "input",
                        "prompt": "bench",
                        "data": PAYLOAD,
                        "expiresAt": expires.isoformat(timespec="milliseconds")[:-6] + "Z",
                    }
                    t0 = time.perf_counter_ns()
                    response = await client.post(
                        f"http://127.0.0.1:{gateway_port}/v1/requests", json=body
                    )
                    got = response.json()
                    took = time.perf_counter_ns() - t0
                    if response.status_code != 200 or not got.get("ok"):
                        raise RuntimeError(f"{response.status_code} {response.text}")
                    return took

            else:  # auto
                rules = workdir / "rules.toml"
                rules.write_text(
                    '[[rule]]\nname = "bench"\nkind = "input"\naction = "accept"\n'
                    'data = { choice = "approve", note = "go ahead", v = 1 }\n'
                )
                start("auto", ["--rules", str(rules)])

                async def one() -> int:
                    request = _request()
                    t0 = time.perf_counter_ns()
                    answer = await broker.wait_for(request, timeout_s=60)
                    took = time.perf_counter_ns() - t0
                    if not answer.ok:
                        raise RuntimeError(f"the auto worker did not accept: {answer}")
                    return took

            samples: list[int] = []
            for i in range(warmup + n):
                took = await one()
                if i >= warmup:
                    samples.append(took)
        return samples
