"""What a fleet costs the Redis it shares: memory per open and per ended request, the
steady commands and CPU of idle agents and of the responders holding their requests, and
how fast a dead agent's requests are withdrawn.

Each case measures a floor in the same run, on the same private ``redis-server``:

- *memory*: the floor is one ``XADD`` of the same encoded request per request (the least
  a broker that publishes it on a stream can hold);
- *idle*: the floor is what liveness at the same bound needs at least: one ``SET ... PX``
  per agent every third of ``liveness_ms``, and nothing per open request;
- *dead waiters*: the floor is the liveness bound itself (``liveness_ms``): no broker can
  tell a dead agent from a slow one sooner;
- *many channels*: the floor is one consumer group on the same queue (each further group
  reads every request once more, so ``groups`` times its cost is the linear bound);
- *durable waits at scale*: the floor is the same fleet waiting without ``durable``, where
  an answer goes to the one process that asked;
- *the Cluster's share*: the floor is one standalone node doing the same round trips; on a
  local 3-master Cluster, each master's share of the Redis CPU (an even third is the goal).

Agents and responders run in processes of their own (``multiprocessing`` spawn), as a
fleet would; the figures are read from Redis (``INFO memory``, ``INFO commandstats``,
``INFO cpu``), so they count every client's work.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from typing import Any, Final, TypedDict

from bench.common import SPAWN, stop_process

NAMESPACE: Final = "fleet"
QUEUE: Final = "default"
GROUP: Final = "holders"
AGENTS: Final = 96  # the Cluster case's agents: waiters enough to spread evenly over 3 masters
PROMPT: Final = "Approve the change described below? " + "x" * (1024 - 36)  # 1 KiB
FORM: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approve": {"type": "boolean", "title": "Approve"},
        "note": {"type": "string", "title": "Note", "maxLength": 200},
    },
    "required": ["approve"],
}


class Fleet(TypedDict, total=False):
    """One fleet case's figures (absent keys: not measured by that case)."""

    requests: int
    request_bytes: int  # one encoded request
    floor_open_bytes: float  # used_memory per request, one XADD each
    open_bytes: float  # used_memory per open toolnexus request
    ended_bytes: float  # used_memory per ended request during its retention, in all
    audit_bytes: float  # of which the audit stream's own MEMORY USAGE, per ended request
    audit_max_entries: int  # the audit stream's cap by count (it is also trimmed by age)
    brokers: int
    processes: int
    open_per_broker: int
    seconds: float
    floor_cmds_per_broker_s: float
    cmds_per_broker_s: float
    commands: dict[str, float]  # per idle broker per second, by command
    cpu_us_per_broker_s: float
    holder_cmds_per_request_s: float  # a responder holding every request: its extra
    holder_commands: dict[str, float]  # per open request per second, by command
    holder_cmds_per_broker_s: float  # ... and its looks at each waiter, per broker
    holder_broker_commands: dict[str, float]  # per broker per second, by command
    full_sweep_s: float  # how often the responder reads every held request's state
    holder_cpu_us_per_request_s: float
    liveness_s: float
    withdrawn_after_s: float  # the last request withdrawn, after the kill
    withdraw_commands: dict[str, int]  # the withdrawals' Redis commands, by command
    withdraw_cpu_s: float
    groups: int
    one_group_cpu_us_per_request: float  # Redis CPU per round trip with one group
    cpu_us_per_request_group: float  # with ``groups`` groups, per round trip per group
    lag_p50_ms: dict[str, float]  # per group: from the request's creation to its delivery
    lag_p99_ms: dict[str, float]
    waiters: int
    answers: int
    durable_reads_per_answer: float  # XREAD calls an answer causes beyond the idle rate
    plain_reads_per_answer: float
    durable_wake_p50_ms: float  # from accept() to the waiting task's return
    plain_wake_p50_ms: float
    durable_cpu_us_per_answer: float  # Redis CPU beyond the idle rate
    plain_cpu_us_per_answer: float
    queues: int
    agents: int  # asking agents, a waiter each, taking turns
    concurrency: int  # round trips at a time
    masters: list[str]  # each master's slot ranges, in the order of the lists below
    standalone_cpu_us: float  # Redis CPU per round trip on one standalone node, one queue
    standalone_cmds: float  # Redis commands per round trip
    standalone_several_cpu_us: float  # ... with ``queues`` queues
    standalone_several_cmds: float
    one_queue_cpu_us: list[float]  # per round trip on each master, one queue
    one_queue_cmds: list[float]
    one_queue_master: int  # the master index serving the one queue's slot
    one_queue_waiters: list[int]  # the agents' waiters on each master, one queue
    one_queue_commands: list[dict[str, list[float]]]  # each master: command -> [calls, µs]
    several_cpu_us: list[float]  # per round trip on each master, ``queues`` queues
    several_cmds: list[float]
    several_waiters: list[int]
    queues_per_master: list[int]  # how many of the ``queues`` queues' slots each serves
    durable_states: dict[str, list[int]]  # queue -> [master index, slot, durable states]


def _request() -> Any:
    import toolnexus

    return toolnexus.Request(
        id=toolnexus.new_id(), kind="input", prompt=PROMPT, data={"schema": FORM}
    )


def _quiet() -> None:
    # "nobody reads queue ..." is logged for every request nobody holds yet: true, and
    # no news in a benchmark.
    logging.getLogger("toolnexus").setLevel(logging.ERROR)


def _redis(url: str) -> Any:
    import redis

    return redis.Redis.from_url(url)


def _used_memory(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def _cpu_s(client: Any) -> float:
    cpu = client.info("cpu")
    return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])


def _calls(client: Any) -> dict[str, int]:
    return {
        name.removeprefix("cmdstat_"): int(stat["calls"])
        for name, stat in client.info("commandstats").items()
    }


def _settle(client: Any, key: str, expect: int, timeout_s: float = 600.0) -> None:
    """Return once stream ``key`` holds ``expect`` entries and memory stopped moving."""
    deadline = time.monotonic() + timeout_s
    while client.xlen(key) < expect:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{key} holds {client.xlen(key)} of {expect} entries")
        time.sleep(0.1)
    last = -1
    while (now := _used_memory(client)) != last:
        last = now
        time.sleep(0.5)


# --- agents in processes of their own ------------------------------------------------------


def _agents_main(
    url: str, brokers: int, each: int, ready: Any, stop: Any, durable_from: int = -1
) -> None:
    """``brokers`` agents each waiting for ``each`` requests; with ``durable_from`` ≥ 0,
    durable waits, each broker an agent of its own (``agent-{durable_from + i}``)."""
    _quiet()

    async def main() -> None:
        import toolnexus

        async with contextlib.AsyncExitStack() as stack:
            waits = []
            for i in range(brokers):
                agent = f"agent-{durable_from + i}" if durable_from >= 0 else None
                broker = await stack.enter_async_context(
                    toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE, agent=agent)
                )
                waits += [
                    asyncio.create_task(
                        broker.wait_for(_request(), timeout_s=3600, durable=durable_from >= 0)
                    )
                    for _ in range(each)
                ]
            await asyncio.sleep(0.5)
            ready.set()
            await asyncio.to_thread(stop.wait)
            for wait in waits:
                wait.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    asyncio.run(main())


def _channel_main(url: str, group: str, answers: bool, out: Any, ready: Any, stop: Any) -> None:
    """A responder of consumer group ``group`` (a channel: a chat, a web page): it shows
    every request, and answers it if ``answers`` (else holds it unanswered, as a web page
    showing it does: its lease renewals, reads and checks are the cost of an open request); at
    the end it puts each delivery's lag (ms from the request's creation) on ``out``, if
    given."""
    _quiet()
    lags: list[float] = []

    async def main() -> None:
        import toolnexus

        async with (
            toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker,
            broker.responder(group, f"{group}-1") as responder,
        ):

            async def take() -> None:
                accepts = set()  # each in a task: the next delivery does not wait for it
                async for pending in responder:
                    lags.append((time.time() - pending.request.created_at) * 1000)
                    if answers:
                        accept = asyncio.create_task(pending.accept({"approve": True}))
                        accepts.add(accept)
                        accept.add_done_callback(accepts.discard)

            task = asyncio.create_task(take())
            ready.set()
            await asyncio.to_thread(stop.wait)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(main())
    if out is not None:
        out.put((group, lags))


class _Procs:
    def __init__(self) -> None:
        self.stop = SPAWN.Event()
        self.procs: list[Any] = []

    def start(self, target: Any, *args: Any, **kwargs: Any) -> None:
        ready = SPAWN.Event()
        proc = SPAWN.Process(
            target=target, args=(*args, ready, self.stop), kwargs=kwargs, daemon=True
        )
        proc.start()
        self.procs.append((proc, ready))

    def wait_ready(self, timeout_s: float = 600.0) -> None:
        deadline = time.monotonic() + timeout_s
        for proc, ready in self.procs:
            if not ready.wait(max(0.0, deadline - time.monotonic())):
                raise RuntimeError(f"process {proc.pid} did not get ready")

    def kill(self) -> None:
        """SIGKILL every process (never ``stop.set()`` after: a process killed while
        waiting on the event would leave ``set`` waiting for it forever)."""
        for proc, _ in self.procs:
            os.kill(proc.pid, signal.SIGKILL)
            proc.join()
        self.procs = []

    def close(self) -> None:
        if self.procs:
            self.stop.set()
        for proc, _ in self.procs:
            stop_process(proc, grace_s=30.0)


# --- memory per open and per ended request -------------------------------------------------


def memory_case(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """``requests`` open requests from one agent process: ``used_memory`` growth per
    request against one ``XADD`` of the same encoded request each; then the same
    requests ended (withdrawn), per request during their retention, in all and the audit
    stream's share of it (``MEMORY USAGE``: the audit stream is capped by count,
    ``audit_max_entries``, and by age, so its records do not all live for the retention)."""
    from toolnexus import RedisSettings
    from toolnexus.codec import Codec
    from toolnexus.keys import Keys

    n = int(params["requests"])
    client = _redis(url)
    encoded = Codec().encode(_request())

    base = _used_memory(client)
    for start in range(0, n, 1000):
        with client.pipeline(transaction=False) as pipe:
            for _ in range(min(1000, n - start)):
                pipe.xadd("floor:requests", {"r": encoded})
            pipe.execute()
    _settle(client, "floor:requests", n)
    floor = (_used_memory(client) - base) / n
    client.flushall()

    base = _used_memory(client)
    procs = _Procs()
    procs.start(_agents_main, url, 1, n)
    try:
        procs.wait_ready()
        _settle(client, f"{{{NAMESPACE}:q:{QUEUE}}}:requests", n)
        opened = (_used_memory(client) - base) / n
    finally:
        procs.close()  # the waits are cancelled: every request withdrawn
    last = -1
    while (now := _used_memory(client)) != last:
        last = now
        time.sleep(0.5)
    ended = (now - base) / n
    audit = (client.memory_usage(Keys(NAMESPACE, QUEUE).audit, samples=0) or 0) / n
    return {
        "case": "fleet",
        "variant": "memory",
        "settings": f"{n:,} requests of one agent; a 1 KiB prompt and a two-field form",
        "fleet": Fleet(
            requests=n,
            request_bytes=len(encoded),
            floor_open_bytes=floor,
            open_bytes=opened,
            ended_bytes=ended,
            audit_bytes=audit,
            audit_max_entries=RedisSettings().audit_max_entries,
        ),
    }


# --- the steady cost of idle agents and of the requests they hold open ---------------------


def _rates(before: dict[str, int], after: dict[str, int], per: float) -> dict[str, float]:
    skip = ("info", "config|resetstat", "config", "client|list")
    return {
        name: (after[name] - before.get(name, 0)) / per
        for name in sorted(after, key=lambda k: before.get(k, 0) - after[k])
        if name not in skip and after[name] > before.get(name, 0)
    }


def _measure(client: Any, seconds: float, per: float) -> tuple[dict[str, float], float]:
    calls0, cpu0, t0 = _calls(client), _cpu_s(client), time.monotonic()
    time.sleep(seconds)
    calls1, cpu1, t1 = _calls(client), _cpu_s(client), time.monotonic()
    elapsed = t1 - t0
    return _rates(calls0, calls1, elapsed * per), (cpu1 - cpu0) / elapsed / per * 1e6


PER_WAITER: Final = ("exists", "evalsha", "time")
"""A holding responder's commands per waiter, whatever its number of requests: the
liveness look (``EXISTS``) and the state-reading script's call (``EVALSHA``, with
``TIME`` and ``EXISTS`` inside)."""


def idle_case(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """``brokers`` agents over ``processes`` processes, each holding ``open`` requests
    nobody answers: Redis commands and CPU per idle broker per second over ``seconds``;
    then with a responder holding every request (a web page showing them), its extra:
    per waiter (``EXISTS`` of its liveness mark every third of the liveness bound, and
    the script call of the full sweep), reported per broker, and the rest per open
    request. The full sweep (every ``full_sweep_leases`` leases: one ``HMGET`` per held
    request and one script call, ``TIME`` and ``EXISTS`` per waiter) comes long after the
    window: its share is added by that count, from the settings."""
    from toolnexus import RedisSettings
    from toolnexus.redis_broker import RedisResponder

    brokers, processes = int(params["brokers"]), int(params["processes"])
    each, seconds = int(params["open"]), float(params["seconds"])
    liveness_s = RedisSettings().liveness_ms / 1000
    full_sweep_s = RedisResponder.full_sweep_leases * RedisSettings().lease_ms / 1000
    client = _redis(url)

    # The floor: one SET PX per agent every liveness_ms / 3, from one process.
    async def floor_agents(stop_at: float) -> None:
        import redis.asyncio as aioredis

        r = aioredis.Redis.from_url(url)
        while time.monotonic() < stop_at:
            async with r.pipeline(transaction=False) as pipe:
                for i in range(brokers):
                    pipe.set(f"floor:alive:{i}", "1", px=int(liveness_s * 1000))
                await pipe.execute()
            await asyncio.sleep(liveness_s / 3)
        await r.aclose()

    calls0, t0 = _calls(client), time.monotonic()
    asyncio.run(floor_agents(time.monotonic() + min(seconds, 3 * liveness_s / 3 + 0.1)))
    floor_rates = _rates(calls0, _calls(client), (time.monotonic() - t0) * brokers)
    client.flushall()

    procs = _Procs()
    holder = _Procs()
    try:
        per_process = -(-brokers // processes)
        left = brokers
        while left > 0:
            procs.start(_agents_main, url, min(per_process, left), each)
            left -= per_process
        procs.wait_ready()
        time.sleep(min(5.0, liveness_s / 3))
        idle, idle_cpu = _measure(client, seconds, brokers)
        holder.start(_channel_main, url, GROUP, False, None)
        holder.wait_ready()
        groups = f"{{{NAMESPACE}:q:{QUEUE}}}:requests"
        deadline = time.monotonic() + 300
        while _pending_of(client, groups) < brokers * each:
            if time.monotonic() > deadline:
                raise TimeoutError("the holder did not take every request")
            time.sleep(0.2)
        held, held_cpu = _measure(client, seconds, brokers * each)
    finally:
        holder.close()
        procs.close()
    idle_per_request = {k: v / each for k, v in idle.items()}
    holder_rates = {k: max(0.0, v - idle_per_request.get(k, 0.0)) for k, v in held.items()}
    # per waiter: its liveness looks, and the full sweep's script call (TIME, EXISTS inside)
    per_broker = {k: holder_rates.pop(k, 0.0) * each for k in PER_WAITER}
    for k in PER_WAITER:
        per_broker[k] += 1 / full_sweep_s
    holder_rates["hmget"] = holder_rates.get("hmget", 0.0) + 1 / full_sweep_s  # one per request
    return {
        "case": "fleet",
        "variant": "idle",
        "settings": f"{brokers:,} brokers over {processes} processes, {each} open requests "
        f"each, {seconds:.0f} s",
        "fleet": Fleet(
            brokers=brokers,
            processes=processes,
            open_per_broker=each,
            seconds=seconds,
            floor_cmds_per_broker_s=sum(floor_rates.values()),
            cmds_per_broker_s=sum(idle.values()),
            commands=idle,
            cpu_us_per_broker_s=idle_cpu,
            holder_cmds_per_request_s=sum(holder_rates.values()),
            holder_commands=holder_rates,
            holder_cmds_per_broker_s=sum(per_broker.values()),
            holder_broker_commands=per_broker,
            full_sweep_s=full_sweep_s,
            holder_cpu_us_per_request_s=max(0.0, held_cpu - idle_cpu / each),
            liveness_s=liveness_s,
        ),
    }


def _pending_of(client: Any, stream: str) -> int:
    try:
        return int(client.xpending(stream, GROUP)["pending"])
    except Exception:  # the group does not exist yet
        return 0


# --- dead waiters ---------------------------------------------------------------------------


def dead_case(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """An agent process holding ``requests`` open requests, all taken by a responder, is
    killed (SIGKILL): the time until the last one is withdrawn, and the Redis work the
    responders did for it."""
    from toolnexus import RedisSettings

    n = int(params["requests"])
    liveness_s = RedisSettings().liveness_ms / 1000
    client = _redis(url)
    stream = f"{{{NAMESPACE}:q:{QUEUE}}}:requests"
    agent, holder = _Procs(), _Procs()
    try:
        agent.start(_agents_main, url, 1, n)
        agent.wait_ready()
        holder.start(_channel_main, url, GROUP, False, None)
        holder.wait_ready()
        deadline = time.monotonic() + 300
        while _pending_of(client, stream) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("the holder did not take every request")
            time.sleep(0.2)
        calls0, cpu0 = _calls(client), _cpu_s(client)
        agent.kill()
        killed = time.monotonic()
        deadline = killed + 10 * liveness_s + 120
        while client.xlen(stream) > 0:  # a withdrawn request leaves the stream
            if time.monotonic() > deadline:
                raise TimeoutError(f"{client.xlen(stream)} requests not withdrawn")
            time.sleep(0.05)
        after = time.monotonic() - killed
        calls1, cpu1 = _calls(client), _cpu_s(client)
    finally:
        holder.close()
        agent.close()
    return {
        "case": "fleet",
        "variant": "dead waiters",
        "settings": f"an agent with {n:,} open requests, all held by a responder, killed",
        "fleet": Fleet(
            requests=n,
            liveness_s=liveness_s,
            withdrawn_after_s=after,
            withdraw_commands={
                k: calls1[k] - calls0.get(k, 0)
                for k in calls1
                if calls1[k] > calls0.get(k, 0) and k not in ("info", "xlen", "xpending")
            },
            withdraw_cpu_s=cpu1 - cpu0,
        ),
    }


# --- many channels: consumer groups on one queue --------------------------------------------


async def _connect_agents(
    stack: contextlib.AsyncExitStack[Any], url: str, queues: tuple[str, ...], agents: int
) -> list[Any]:
    """``agents`` brokers, each an agent of its own (``agent-<i>``, so a waiter of its own:
    its own reply stream, liveness mark and states, on its own slot), agent ``i`` on
    ``queues[i % len(queues)]``."""
    import toolnexus

    return [
        await stack.enter_async_context(
            toolnexus.connect(
                url, namespace=NAMESPACE, queue=queues[i % len(queues)], agent=f"agent-{i}"
            )
        )
        for i in range(agents)
    ]


async def _drive(brokers: list[Any], n: int, concurrency: int) -> None:
    """``n`` round trips, ``concurrency`` at a time, the ``i``-th asked through
    ``brokers[i % len(brokers)]`` (with more brokers than ``concurrency``, each has asked
    and been answered before its next turn comes)."""
    left = iter(range(n))

    async def one() -> None:
        for i in left:
            await brokers[i % len(brokers)].wait_for(_request(), timeout_s=120)

    await asyncio.gather(*(one() for _ in range(concurrency)))


def _round_trips(url: str, n: int, concurrency: int, queues: tuple[str, ...] = (QUEUE,)) -> None:
    """``n`` round trips, ``concurrency`` at a time, spread evenly over ``queues`` (one
    broker each)."""

    async def main() -> None:
        import toolnexus

        async with contextlib.AsyncExitStack() as stack:
            brokers = [
                await stack.enter_async_context(
                    toolnexus.connect(url, namespace=NAMESPACE, queue=queue)
                )
                for queue in queues
            ]
            await _drive(brokers, n, concurrency)

    asyncio.run(main())


def _channels_run(url: str, groups: int, n: int, concurrency: int) -> tuple[float, dict[str, Any]]:
    """Redis CPU (µs) per round trip with ``groups`` groups, one answering; each group's
    delivery lags (ms)."""
    client = _redis(url)
    out = SPAWN.Queue()
    procs = _Procs()
    names = [f"channel-{i}" for i in range(groups)]
    for i, name in enumerate(names):
        procs.start(_channel_main, url, name, i == 0, out)
    try:
        procs.wait_ready()
        time.sleep(1.0)  # every group created before the first request
        _round_trips(url, max(10, n // 20), concurrency)  # warm-up
        cpu0 = _cpu_s(client)
        _round_trips(url, n, concurrency)
        cpu = (_cpu_s(client) - cpu0) / n * 1e6
        procs.stop.set()
        # read before joining: a process exits only once its queue's data is read
        lags = dict(out.get(timeout=60) for _ in names)
    finally:
        procs.close()
    client.flushall()
    return cpu, lags


def channels_case(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """``requests`` round trips (``concurrency`` at a time) on a queue read by one consumer
    group, then by ``groups`` groups, each in a process of its own, the first answering and
    the others showing every request: Redis CPU per round trip per group against one group,
    and each group's delivery lag."""
    from bench.common import percentile

    n, groups = int(params["requests"]), int(params["groups"])
    concurrency = int(params.get("concurrency", 20))
    one, _ = _channels_run(url, 1, n, concurrency)
    many, lags = _channels_run(url, groups, n, concurrency)
    warm = {g: sorted(v[-n:]) for g, v in lags.items()}  # the measured round trips
    return {
        "case": "fleet",
        "variant": "channels",
        "settings": f"{n:,} round trips, {concurrency} at a time; {groups} consumer groups "
        "in a process each, one answering",
        "fleet": Fleet(
            requests=n,
            groups=groups,
            one_group_cpu_us_per_request=one,
            cpu_us_per_request_group=many / groups,
            lag_p50_ms={g: percentile(v, 50) for g, v in sorted(warm.items()) if v},
            lag_p99_ms={g: percentile(v, 99) for g, v in sorted(warm.items()) if v},
        ),
    }


# --- durable waits at scale -----------------------------------------------------------------


async def _answers(url: str, n: int, durable: bool) -> tuple[float, float, float]:
    """One more agent (``probe``) asks ``n`` requests, one at a time, each answered by a
    responder in this process as soon as it is shown (after the fleet's, which it holds):
    XREAD calls and Redis CPU (µs) per answer beyond the idle rate (measured for 5 s
    before, the responder holding the fleet's requests), and the p50 wake-up (ms from
    ``accept`` to the waiting task's return)."""
    import toolnexus
    from bench.common import percentile

    client = _redis(url)
    wakes: list[float] = []
    async with (
        toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE, agent="probe") as agent,
        toolnexus.connect(url, namespace=NAMESPACE, queue=QUEUE) as broker,
        broker.responder(GROUP, "answerer") as responder,
    ):

        async def one() -> float:
            request = _request()
            wait = asyncio.create_task(agent.wait_for(request, timeout_s=120, durable=durable))
            async for pending in responder:
                if pending.request.id == request.id:
                    t0 = time.perf_counter()
                    await pending.accept({"approve": True})
                    await wait
                    return (time.perf_counter() - t0) * 1000
            raise RuntimeError("the responder stopped")

        await one()  # past the fleet's requests, which the responder now holds
        await asyncio.sleep(1.0)
        calls0, cpu0, t0 = _calls(client), _cpu_s(client), time.monotonic()
        await asyncio.sleep(5.0)
        calls1, cpu1, t1 = _calls(client), _cpu_s(client), time.monotonic()
        idle_reads = (calls1.get("xread", 0) - calls0.get("xread", 0)) / (t1 - t0)
        idle_cpu = (cpu1 - cpu0) / (t1 - t0)
        for _ in range(n):
            wakes.append(await one())
        calls2, cpu2, t2 = _calls(client), _cpu_s(client), time.monotonic()
    reads = calls2.get("xread", 0) - calls1.get("xread", 0) - idle_reads * (t2 - t1)
    cpu = (cpu2 - cpu1 - idle_cpu * (t2 - t1)) * 1e6
    return max(0.0, reads) / n, max(0.0, cpu) / n, percentile(sorted(wakes), 50)


def _durable_run(
    url: str, waiters: int, processes: int, n: int, durable: bool
) -> tuple[float, float, float]:
    """:func:`_answers` with ``waiters`` waiting agents over ``processes`` processes."""
    procs = _Procs()
    per_process = -(-waiters // processes)
    for first in range(0, waiters, per_process):
        count = min(per_process, waiters - first)
        procs.start(_agents_main, url, count, 1, durable_from=first if durable else -1)
    try:
        procs.wait_ready()
        return asyncio.run(_answers(url, n, durable))
    finally:
        procs.close()
        _redis(url).flushall()


def durable_case(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """``waiters`` agents over ``processes`` processes, each with an identity of its own
    (``agent=``) and one durable wait; then ``answers`` answers to one more agent's
    requests, one at a time: the reads each answer causes (XREAD calls beyond the idle
    rate: the processes woken), its wake-up and Redis CPU, against the same fleet
    waiting without ``durable``."""
    waiters, processes = int(params["waiters"]), int(params["processes"])
    n = int(params["answers"])
    plain = _durable_run(url, waiters, processes, n, durable=False)
    durable = _durable_run(url, waiters, processes, n, durable=True)
    return {
        "case": "fleet",
        "variant": "durable",
        "settings": f"{waiters:,} waiting agents (one identity each) over {processes} "
        f"processes; {n} answers to one more agent, one at a time",
        "fleet": Fleet(
            waiters=waiters,
            processes=processes,
            answers=n,
            durable_reads_per_answer=durable[0],
            plain_reads_per_answer=plain[0],
            durable_cpu_us_per_answer=durable[1],
            plain_cpu_us_per_answer=plain[1],
            durable_wake_p50_ms=durable[2],
            plain_wake_p50_ms=plain[2],
        ),
    }


# --- the Cluster's share --------------------------------------------------------------------


def _responders_main(url: str, queues: tuple[str, ...], ready: Any, stop: Any) -> None:
    """One process answering every request of each of ``queues`` as soon as it is shown."""
    _quiet()

    async def main() -> None:
        import toolnexus

        async with contextlib.AsyncExitStack() as stack:
            responders = []
            for queue in queues:
                broker = await stack.enter_async_context(
                    toolnexus.connect(url, namespace=NAMESPACE, queue=queue)
                )
                responders.append(
                    await stack.enter_async_context(broker.responder(GROUP, f"{GROUP}-1"))
                )

            async def take(responder: Any) -> None:
                accepts = set()  # each in a task: the next delivery does not wait for it
                async for pending in responder:
                    accept = asyncio.create_task(pending.accept({"approve": True}))
                    accepts.add(accept)
                    accept.add_done_callback(accepts.discard)

            tasks = [asyncio.create_task(take(r)) for r in responders]
            ready.set()
            await asyncio.to_thread(stop.wait)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


_NOT_ROUND_TRIPS: Final = ("info", "cluster", "command", "client", "hello", "config", "ping")
# ... but redis-py asks a Cluster node (its commands parser's) for the keys of a command it
# cannot route (an XREAD or XREADGROUP whose node toolnexus did not name): round trips' work
_ROUND_TRIP_LOOKUPS: Final = ("command|getkeys",)
_Snapshot = list[tuple[float, dict[str, tuple[int, int]]]]  # each node: CPU s, command counters


def _round_trip_command(name: str) -> bool:
    return not name.startswith(_NOT_ROUND_TRIPS) or name in _ROUND_TRIP_LOOKUPS


def _counters(clients: list[Any]) -> _Snapshot:
    """Each node's Redis CPU (s) and, by command, its calls and the µs spent in it so far,
    leaving out the measurement's own and the clients' connection set-up (``CLUSTER
    SLOTS``, ``HELLO``, ...)."""
    return [
        (
            _cpu_s(c),
            {
                name: (int(stat["calls"]), int(stat["usec"]))
                for name, stat in (
                    (k.removeprefix("cmdstat_"), v) for k, v in c.info("commandstats").items()
                )
                if _round_trip_command(name)
            },
        )
        for c in clients
    ]


class _Share(TypedDict):
    cpu_us: list[float]  # Redis CPU per round trip on each node, beyond its idle rate
    cmds: list[float]  # Redis commands per round trip on each node
    # per round trip on each node, by command: [calls, µs inside the command (commandstats)]
    by_command: list[dict[str, list[float]]]
    waiters: list[int]  # the agents' waiters (reply stream, states, mark) each node holds


def _share_run(
    url: str, nodes: list[str], n: int, concurrency: int, agents: int, queues: tuple[str, ...]
) -> _Share:
    """``n`` round trips, ``concurrency`` at a time, asked by ``agents`` agents in turn,
    agent ``i`` on ``queues[i % len(queues)]``, answered by a responder process: Redis CPU
    (µs, beyond each node's idle rate with the agents connected) and commands per round
    trip on each of ``nodes``, and how many of the agents' waiters each holds.

    The agents connect, and each waits once, before the idle rate is taken: the figures
    per round trip hold no connection set-up, whatever ``agents`` and ``n``."""
    clients = [_redis(node) for node in nodes]
    procs = _Procs()
    procs.start(_responders_main, url, queues)

    async def main() -> tuple[_Snapshot, float, _Snapshot, float, _Snapshot, float, list[int]]:
        from toolnexus.keys import Keys

        async with contextlib.AsyncExitStack() as stack:
            brokers = await _connect_agents(stack, url, queues, agents)
            await _drive(brokers, max(agents, n // 10), concurrency)  # each agent asks
            marks = Keys(NAMESPACE, QUEUE).alive_pattern()
            waiters = [sum(1 for _ in c.scan_iter(match=marks, count=1000)) for c in clients]
            idle0, t0 = _counters(clients), time.monotonic()
            await asyncio.sleep(2.0)
            idle1, t1 = _counters(clients), time.monotonic()
            await _drive(brokers, n, concurrency)
            done, t2 = _counters(clients), time.monotonic()
        return idle0, t0, idle1, t1, done, t2, waiters

    try:
        procs.wait_ready()
        idle0, t0, idle1, t1, done, t2, waiters = asyncio.run(main())
    finally:
        procs.close()
        for client in clients:
            client.flushall()
            client.close()
    idle_rates = [(b[0] - a[0]) / (t1 - t0) for a, b in zip(idle0, idle1, strict=True)]
    by_command = [
        {
            name: [(calls - i[1].get(name, (0, 0))[0]) / n, (us - i[1].get(name, (0, 0))[1]) / n]
            for name, (calls, us) in sorted(d[1].items())
            if calls > i[1].get(name, (0, 0))[0]
        }
        for i, d in zip(idle1, done, strict=True)
    ]
    return _Share(
        cpu_us=[
            max(0.0, (d[0] - i[0] - rate * (t2 - t1)) * 1e6 / n)
            for i, d, rate in zip(idle1, done, idle_rates, strict=True)
        ],
        cmds=[sum(calls for calls, _us in node.values()) for node in by_command],
        by_command=by_command,
        waiters=waiters,
    )


def _masters(nodes: list[str]) -> tuple[list[str], list[tuple[int, int, int]]]:
    """Each node's slot ranges as text, and (first slot, last slot, node index) for all."""
    texts, ranges = [], []
    for index, node in enumerate(nodes):
        with _redis(node) as client:
            lines = client.execute_command("CLUSTER", "NODES").decode().splitlines()
        mine = next(line.split() for line in lines if "myself" in line)[8:]
        texts.append(", ".join(r.replace("-", "–") for r in mine))
        for r in mine:
            first, _, last = r.partition("-")
            ranges.append((int(first), int(last or first), index))
    return texts, ranges


def _master_of(slot: int, ranges: list[tuple[int, int, int]]) -> int:
    return next(index for first, last, index in ranges if first <= slot <= last)


async def _durable_placement(
    url: str, nodes: list[str], queues: tuple[str, ...], each: int
) -> dict[str, list[int]]:
    """One agent (``agent-0``) with ``each`` durable waits on each of ``queues``: per
    queue, the master index holding its durable states, their slot, and their count."""
    from redis.crc import key_slot

    import toolnexus
    from toolnexus.keys import Keys

    _, ranges = _masters(nodes)
    clients = [_redis(node) for node in nodes]

    def states() -> dict[str, list[tuple[int, bytes]]]:
        return {
            queue: [
                (index, key)
                for index, client in enumerate(clients)
                for key in client.scan_iter(match=Keys(NAMESPACE, queue).durable_states_pattern())
            ]
            for queue in queues
        }

    async with contextlib.AsyncExitStack() as stack:
        waits = []
        for queue in queues:
            broker = await stack.enter_async_context(
                toolnexus.connect(url, namespace=NAMESPACE, queue=queue, agent="agent-0")
            )
            waits += [
                asyncio.create_task(broker.wait_for(_request(), timeout_s=3600, durable=True))
                for _ in range(each)
            ]
        deadline = time.monotonic() + 60
        found = states()
        while sum(len(v) for v in found.values()) < len(waits):
            found = states()
            if time.monotonic() > deadline:
                raise TimeoutError("the durable states did not all appear")
            await asyncio.sleep(0.1)
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    placement = {}
    for queue, keys in found.items():
        slots = {int(key_slot(key)) for _, key in keys}
        on = {index for index, _ in keys}
        if len(slots) != 1 or len(on) != 1:  # by design they share the agent's slot
            raise RuntimeError(f"{queue}: durable states on slots {slots}, masters {on}")
        (slot,) = slots
        if _master_of(slot, ranges) not in on:
            raise RuntimeError(f"{queue}: slot {slot} is not served where its keys are")
        placement[queue] = [on.pop(), slot, len(keys)]
    for client in clients:
        client.flushall()
    return placement


def cluster_case(url: str, params: dict[str, Any]) -> dict[str, Any]:
    """``requests`` round trips, ``concurrency`` at a time, asked in turn by ``agents``
    agents (each a waiter of its own, whose keys hash to a slot of their own: a fleet, not
    one process), answered by a responder process, with one queue and with ``queues``
    queues: Redis CPU and commands per round trip on the standalone node at ``url``, then
    on each master of the local 3-master Cluster at ``params["cluster"]`` (started by the
    runner); then where one agent's durable states land (``durable`` waits on each queue)."""
    from redis.crc import key_slot

    n, q = int(params["requests"]), int(params["queues"])
    agents = int(params.get("agents", AGENTS))
    concurrency = int(params.get("concurrency", 20))
    cluster = str(params["cluster"])
    nodes = ["redis://" + a for a in cluster.removeprefix("redis+cluster://").split(",")]
    masters, ranges = _masters(nodes)
    queues = tuple(f"q-{i}" for i in range(q))
    standalone = _share_run(url, [url], n, concurrency, agents, (QUEUE,))
    standalone_several = _share_run(url, [url], n, concurrency, agents, queues)
    one = _share_run(cluster, nodes, n, concurrency, agents, (QUEUE,))
    several = _share_run(cluster, nodes, n, concurrency, agents, queues)
    per_master = [0] * len(nodes)
    for queue in queues:
        per_master[_master_of(int(key_slot(f"{{{NAMESPACE}:q:{queue}}}".encode())), ranges)] += 1
    one_queue_master = _master_of(int(key_slot(f"{{{NAMESPACE}:q:{QUEUE}}}".encode())), ranges)
    durable = asyncio.run(_durable_placement(cluster, nodes, queues, int(params["durable"])))
    return {
        "case": "fleet",
        "variant": "cluster",
        "settings": f"{n:,} round trips, {concurrency} at a time, asked in turn by {agents} "
        f"agents (a waiter each), one responder process; a local Cluster of "
        f"{len(nodes)} masters, no replicas",
        "fleet": Fleet(
            requests=n,
            agents=agents,
            concurrency=concurrency,
            queues=q,
            masters=masters,
            standalone_cpu_us=standalone["cpu_us"][0],
            standalone_cmds=standalone["cmds"][0],
            standalone_several_cpu_us=standalone_several["cpu_us"][0],
            standalone_several_cmds=standalone_several["cmds"][0],
            one_queue_cpu_us=one["cpu_us"],
            one_queue_cmds=one["cmds"],
            one_queue_master=one_queue_master,
            one_queue_waiters=one["waiters"],
            one_queue_commands=one["by_command"],
            several_cpu_us=several["cpu_us"],
            several_cmds=several["cmds"],
            several_waiters=several["waiters"],
            queues_per_master=per_master,
            durable_states=durable,
        ),
    }
