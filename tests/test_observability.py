"""Prometheus metrics (``toolnexus.metrics``) and W3C trace context across the broker
(``toolnexus.tracing``), with the OpenTelemetry SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import toolnexus
from conftest import free_port
from helpers import page_block, run_fragment
from toolnexus import Answer, Broker, Pending, Request, Service, Worker, new_id
from toolnexus.observability import Metrics, inject, traced

FAST = {"block_ms": 100, "lease_ms": 600}
ACCEPTED_ONCE = (
    'toolnexus_requests_resolved_total{outcome="answered",queue="default",reason="accepted"} 1.0'
)


async def accept_one(broker: Broker, group: str = "bot") -> Request:
    async with broker.responder(group) as requests:
        async with asyncio.timeout(20):
            pending = await anext(requests)
        await pending.accept()
        return pending.request


async def test_an_agent_counts_what_it_waits_for(redis_url: str, namespace: str) -> None:
    metrics = Metrics()
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        wait_for = metrics.instrument(broker.wait_for, queue="default")
        waiting = asyncio.create_task(wait_for(Request(id=new_id(), kind="approval")))
        await accept_one(broker)
        assert (await waiting).ok
        expired = await metrics.instrument(
            lambda r: broker.wait_for(r, timeout_s=0.2), queue="default"
        )(Request(id=new_id(), kind="approval"))
    assert expired.reason == "expired"
    text = metrics.text()
    assert 'toolnexus_requests_published_total{queue="default"} 2.0' in text
    assert ACCEPTED_ONCE in text
    assert (
        'toolnexus_requests_resolved_total{outcome="expired",queue="default",reason="expired"} 1.0'
        in text
    )
    assert 'toolnexus_time_to_answer_seconds_count{queue="default"} 1.0' in text
    assert 'toolnexus_open_requests{queue="default"} 0.0' in text


async def test_a_worker_exports_its_counters_and_the_queue_s_resolutions() -> None:
    class Approver(Worker):
        group = "ops-bot"

        async def show(self, pending: Pending) -> None:
            await pending.accept()

    metrics = Metrics()
    port = metrics.serve(0, host="127.0.0.1")
    try:
        async with toolnexus.connect("memory://") as broker:
            service = Service(broker, Approver(), consumer="c1")
            metrics.watch(service)
            following = asyncio.create_task(metrics.follow(broker, queue="default"))
            running = asyncio.create_task(service.run())
            answer = await broker.wait_for(Request(id=new_id(), kind="approval"), timeout_s=20)
            assert answer.ok
            async with asyncio.timeout(20):
                while 'reason="accepted"} 1.0' not in metrics.text():
                    await asyncio.sleep(0.02)
            service.stop()
            await running
            following.cancel()
            await asyncio.gather(following, return_exceptions=True)
        url = f"http://127.0.0.1:{port}/metrics"
        scraped = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
    finally:
        metrics.close()
    text = scraped.decode()
    assert (
        'toolnexus_worker_requests_total{consumer="c1",group="ops-bot",state="answered"} 1.0'
        in text
    )
    assert 'toolnexus_worker_holding{consumer="c1",group="ops-bot"} 0.0' in text
    assert ACCEPTED_ONCE in text


def test_a_missing_extra_names_the_install_command() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None\n"
        "from toolnexus.observability import Metrics\n"
        "try:\n    Metrics()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == (
        "ConfigurationError metrics need prometheus-client: pip install 'toolnexus-bridge[metrics]'"
    )


@pytest.mark.slow
def test_a_bad_metrics_port_is_refused() -> None:
    toolnexus_bin = str(Path(sys.executable).with_name("toolnexus"))
    done = subprocess.run(
        [toolnexus_bin, "worker", "terminal", "--metrics-port", "http"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--metrics-port: 'http' is not a port number" in done.stderr


# -- traces ---------------------------------------------------------------------------------

_EXPORTER = InMemorySpanExporter()


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """The global tracer provider (set once per process) exporting into memory."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        trace.set_tracer_provider(provider)
    _EXPORTER.clear()
    yield _EXPORTER
    _EXPORTER.clear()


class Approver(Worker):
    group = "traced"

    async def show(self, pending: Pending) -> None:
        with trace.get_tracer("test").start_as_current_span("approving"):
            await pending.accept()


async def serve_one(broker: Broker, wait: asyncio.Task[Answer]) -> Answer:
    service = Service(broker, Approver())
    running = asyncio.create_task(service.run())
    try:
        return await asyncio.wait_for(wait, 20)
    finally:
        service.stop()
        await running


async def test_the_agent_s_span_is_the_parent_of_the_responder_s(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    tracer = trace.get_tracer("test")
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        with tracer.start_as_current_span("agent asks") as agent:
            request = inject(Request(id=new_id(), kind="approval", prompt="Deploy?"))
            wait = asyncio.create_task(broker.wait_for(request, timeout_s=20))
        assert (await serve_one(broker, wait)).ok
    assert request.trace is not None and "traceparent" in request.trace
    finished = {span.name: span for span in spans.get_finished_spans()}
    show = finished["toolnexus.show"]
    assert show.parent is not None
    agent_context = agent.get_span_context()
    assert show.parent.span_id == agent_context.span_id
    assert show.context.trace_id == agent_context.trace_id
    assert show.parent.is_remote  # it came through Redis, in Request.trace
    assert show.attributes is not None and show.attributes["toolnexus.request.id"] == request.id
    approving = finished["approving"]
    assert approving.parent is not None and approving.parent.span_id == show.context.span_id


async def test_traced_wait_for_opens_a_span_the_responder_continues(
    redis_url: str, namespace: str, spans: InMemorySpanExporter
) -> None:
    async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
        wait_for = traced(broker.wait_for)
        wait = asyncio.create_task(wait_for(Request(id=new_id(), kind="approval")))
        assert (await serve_one(broker, wait)).ok
    finished = {span.name: span for span in spans.get_finished_spans()}
    waiting, show = finished["toolnexus.wait_for"], finished["toolnexus.show"]
    assert show.parent is not None and show.parent.span_id == waiting.context.span_id
    assert waiting.attributes is not None and waiting.attributes["toolnexus.answer.ok"] is True


@pytest.mark.slow
def test_without_a_provider_or_a_trace_a_show_opens_no_span() -> None:
    # In a process of its own: the tests above set this one's global tracer provider.
    code = (
        "from toolnexus.models import Request\n"
        "from toolnexus.observability._tracing import responder_span\n"
        "with responder_span(Request(id='req-1', kind='approval')) as span:\n"
        "    assert span is None, span\n"
        "parent = {'traceparent': '00-' + '1' * 32 + '-' + '2' * 16 + '-01'}\n"
        "with responder_span(Request(id='req-2', kind='approval', trace=parent)) as span:\n"
        "    assert span.get_span_context().trace_id == int('1' * 32, 16), span\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_provider_set_while_serving_traces_the_shows_after_it() -> None:
    # In a process of its own: the first show runs with no provider set in the process.
    code = """
import asyncio
import toolnexus
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from toolnexus.models import Request, new_id

spans = []

async def show(pending):
    spans.append(trace.get_current_span().get_span_context().is_valid)
    await pending.accept()

async def main():
    async with toolnexus.connect("memory://") as broker:
        service = toolnexus.Service(broker, show)
        running = asyncio.create_task(service.run())
        await broker.wait_for(Request(id=new_id(), kind="approval"), timeout_s=20)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        trace.set_tracer_provider(provider)
        await asyncio.sleep(0.05)
        await broker.wait_for(Request(id=new_id(), kind="approval"), timeout_s=20)
        service.stop()
        await running
    assert spans == [False, True], spans

asyncio.run(main())
"""
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_without_a_span_the_request_is_unchanged() -> None:
    request = Request(id=new_id(), kind="approval")
    assert inject(request) is request


@pytest.mark.slow
async def test_a_worker_logs_json_lines(redis_url: str, namespace: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nname = "yes"\naction = "accept"\n')
    process = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("toolnexus")), "worker", "auto", "--rules", str(rules),
        "--log-json", "--url", redis_url, "--namespace", namespace,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    entries = []
    try:
        async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:
            request = Request(id=new_id(), kind="approval", prompt="Deploy?")
            assert (await broker.wait_for(request, timeout_s=30)).ok
            async with asyncio.timeout(20):
                while not any(request.id in e["message"] for e in entries):
                    entries.append(json.loads(await process.stderr.readline()))
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 20)
    (decision,) = [e for e in entries if request.id in e["message"]]
    assert decision["logger"] == "toolnexus.auto" and decision["level"] == "info"
    assert decision["message"].startswith(f"decision=accept request={request.id} rule=1 (yes)")
    assert decision["time"].endswith("+00:00")


async def test_the_operating_page_metrics_example_counts_a_wait() -> None:
    """The metrics block of docs/how-to/operating.md as written (its port a free one),
    with a request a responder beside it accepts; then its page is scraped."""
    page = "docs/how-to/operating.md"
    port = free_port()
    code = page_block(page, "from toolnexus.observability import Metrics, traced")
    assert "metrics.serve(9100)" in code
    code = code.replace("metrics.serve(9100)", f"metrics.serve({port})")
    async with toolnexus.connect("memory://") as broker:

        async def accept() -> None:
            async with broker.responder("ops") as requests:
                await (await anext(requests)).accept()

        answering = asyncio.create_task(accept())
        request = Request(id=new_id(), kind="approval", prompt="Deploy?")
        names = await asyncio.wait_for(run_fragment(code, page, broker=broker, request=request), 20)
        await answering
    try:
        assert names["answer"].ok
        url = f"http://127.0.0.1:{port}/metrics"
        scraped = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert 'toolnexus_time_to_answer_seconds_count{queue="default"} 1.0' in scraped.decode()
    finally:
        names["metrics"].close()
