"""Issue #27, observation 3 (its review: the claim of a run): one Redis write must not
stop an approved tool call. The ledger claims a call's single run under
``<request id>:executed`` in the store, which whoever may write it can pre-write (it was a
queue store, which the ACL lets every responder write; it is now the agent's own,
tests/test_acl.py::test_the_ledger_is_the_agents_alone_and_a_tool_runs_once); before, the
approved call was then refused as "ran already". On a private
redis-server with signatures required (S3: stored state counts only once verified), the
claim is signed by the agent's own key, bound to the request id, the digest and the
claim's own id: a claim that does not verify (garbage, unsigned, another key's, the
agent's own for another call) is replaced atomically and the approved call runs once; a
genuine claim still refuses a second run; resumers racing over one forged claim run the
tool once. LangGraph's ledger middleware, which cannot see the decision, is given the
approved digest by the resuming helper in memory: a forged ``approved`` digest in the
ledger no longer stops the call either. Without signatures (the embedded broker), a claim
is what it was: any value refuses the run, the documented limit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from test_run_state_tamper import asked_then_gone

import toolnexus
from conftest import Fleet
from test_forgery import shown
from test_frameworks_pydantic_ai import ARGS, resumable_bank
from toolnexus import InvalidAnswer
from toolnexus.frameworks import Ledger, tool_call_digest
from toolnexus.frameworks._tool_call import CLAIM_KIND, LEDGER_STORE
from toolnexus.frameworks.pydantic_ai import resume
from toolnexus.redis_broker import RedisBroker
from toolnexus.security import SigningKey
from toolnexus.security._signing import sign_own

RUN = "run-claim"
DIGEST = tool_call_digest("transfer", ARGS)
RAN_ALREADY = "ran already: an approval is used once"


async def forge(agent: RedisBroker, request_id: str, value: bytes) -> None:
    """Write ``value`` as the claim of ``request_id``'s run, as a writer of the agent's own
    store could (with the shipped ACL, the agent's own Redis user: no responder): one HSET,
    no key."""
    await agent.redis.hset(
        agent.store(LEDGER_STORE, agent=True).key, f"{request_id}:executed", value
    )


def signed_claim(key: SigningKey, request_id: str, by: str = "run-forged") -> bytes:
    fields = {"request_id": request_id, "digest": DIGEST, "by": by}
    signature = sign_own(CLAIM_KIND, fields, key)
    return json.dumps(
        {"digest": DIGEST, "by": by, "signature": msgspec.to_builtins(signature)}
    ).encode()


async def replayed(fleet: Fleet, agent: RedisBroker, request_id: str) -> bytes:
    """The agent's own genuine claim of another call, copied under this one."""
    await Ledger.of(agent).executing("tool-other", "transfer", ARGS, approved=DIGEST)
    raw = await agent.store(LEDGER_STORE, agent=True).get("tool-other:executed")
    assert raw is not None and b'"signature"' in raw
    return raw


Forgery = Callable[[Fleet, RedisBroker, str], Awaitable[bytes]]


async def garbage(fleet: Fleet, agent: RedisBroker, request_id: str) -> bytes:
    return b"\xff garbage, not a claim"


async def unsigned(fleet: Fleet, agent: RedisBroker, request_id: str) -> bytes:
    return json.dumps({"digest": DIGEST, "by": "run-forged"}).encode()


async def another_key(fleet: Fleet, agent: RedisBroker, request_id: str) -> bytes:
    return signed_claim(fleet.bot_key, request_id)  # a responder's key, trusted for answers


async def the_agents_name(fleet: Fleet, agent: RedisBroker, request_id: str) -> bytes:
    return signed_claim(SigningKey.generate(fleet.agent_key.name), request_id)


@pytest.mark.redis
@pytest.mark.parametrize(
    "forgery",
    [garbage, unsigned, another_key, the_agents_name, replayed],
    ids=lambda f: f.__name__,
)
async def test_a_forged_claim_does_not_stop_the_approved_run(
    fleet: Fleet, forgery: Forgery, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the resumer runs the approved call, a writer of the store claims it: the
    claim does not verify as the agent's own for this call, so it is replaced, the tool
    runs once with the approved arguments and a warning names the call (S3; observation
    3). Before, the run was refused as "ran already"."""
    ran: list[dict[str, Any]] = []
    async with fleet.agent() as agent, fleet.responder() as bot:
        request_id = await asked_then_gone(agent, bot, ran, RUN)
        await forge(agent, request_id, await forgery(fleet, agent, request_id))
        await (await shown(bot)).accept(person="web:alice")
        with caplog.at_level(logging.WARNING, logger="toolnexus"):
            result = await resume(resumable_bank(ran), broker=agent, run=RUN)
        assert json.loads(str(result.output)) == ["sent 10 to ACME"]
        assert ran == [ARGS]
        warned = [r.getMessage() for r in caplog.records if "forged claim" in r.getMessage()]
        assert len(warned) == 1 and request_id in warned[0], warned
        # the claim now held is the agent's own: the approval is used up
        ledger = Ledger.of(agent)
        assert (await ledger.get(request_id))["executed"] == DIGEST
        with pytest.raises(InvalidAnswer, match=RAN_ALREADY):
            await ledger.executing(request_id, "transfer", ARGS, approved=DIGEST)
    assert ran == [ARGS]


@pytest.mark.redis
async def test_a_genuine_claim_still_refuses_a_second_run(fleet: Fleet) -> None:
    """Another process of the agent (its own broker, the same key) claimed the approved
    call and ran it: a resumer finds that claim, which verifies, and refuses to run the
    tool again (S3; observation 3)."""
    ran: list[dict[str, Any]] = []
    async with fleet.agent() as agent, fleet.responder() as bot, fleet.agent() as other:
        request_id = await asked_then_gone(agent, bot, ran, RUN)
        await (await shown(bot)).accept(person="web:alice")
        assert await Ledger.of(other).executing(request_id, "transfer", ARGS, approved=DIGEST)
        with pytest.raises(InvalidAnswer, match=RAN_ALREADY):
            await resume(resumable_bank(ran), broker=agent, run=RUN)
        assert ran == []
        # without the key (a ledger that cannot verify) a claim refuses too: never a run
        with pytest.raises(InvalidAnswer, match=RAN_ALREADY):
            await Ledger(agent.store(LEDGER_STORE, agent=True)).executing(
                request_id, "transfer", ARGS, approved=DIGEST
            )


@pytest.mark.redis
async def test_resumers_racing_over_a_forged_claim_run_the_tool_once(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Four resumers (each with a broker of its own, as processes would have) reach the
    tool at the same moment and all lose the claim to a forged one: each replaces exactly
    the bytes it read, so one wins and runs the tool; the others then find its genuine
    claim and are refused (S3; observation 3)."""
    ran: list[dict[str, Any]] = []
    async with contextlib.AsyncExitStack() as stack:
        agents = [await stack.enter_async_context(fleet.agent()) for _ in range(5)]
        bot = await stack.enter_async_context(fleet.responder())
        request_id = await asked_then_gone(agents[0], bot, ran, RUN)
        await forge(agents[0], request_id, await unsigned(fleet, agents[0], request_id))
        await (await shown(bot)).accept(person="web:alice")
        barrier = asyncio.Barrier(len(agents) - 1)
        with caplog.at_level(logging.WARNING, logger="toolnexus"):
            outcomes = await asyncio.gather(
                *(resume(resumable_bank(ran, barrier), broker=a, run=RUN) for a in agents[1:]),
                return_exceptions=True,
            )
    assert ran == [ARGS]
    finished = [o for o in outcomes if not isinstance(o, BaseException)]
    assert [json.loads(str(o.output)) for o in finished] == [["sent 10 to ACME"]]
    refused = [str(o) for o in outcomes if isinstance(o, BaseException)]
    assert len(refused) == 3 and all(RAN_ALREADY in r for r in refused), refused
    warned = [r for r in caplog.records if "forged claim" in r.getMessage()]
    assert len(warned) == 1


@pytest.mark.redis
async def test_the_queue_store_a_ledger_was_kept_in_is_not_read(fleet: Fleet) -> None:
    """The ledger was the queue store ``tool-calls``, which responders may write; it is now
    the agent's own store. What that queue store holds (a ledger entry kept before the
    upgrade, or a responder's writes: an approved digest of other arguments, a claim) is
    not read: the resumer takes the digest from the signed approval and claims the run in
    the agent's store, so the approved call runs once (S3; observation 3)."""
    ran: list[dict[str, Any]] = []
    async with fleet.agent() as agent, fleet.responder() as bot:
        request_id = await asked_then_gone(agent, bot, ran, RUN)
        old = agent.store(LEDGER_STORE)  # the queue store the ledger was kept in
        other = tool_call_digest("transfer", {"to": "EVIL", "amount": 10000})
        await old.set(request_id, json.dumps({"approved": other}).encode(), ttl_s=600)
        await old.set(
            f"{request_id}:executed", signed_claim(fleet.agent_key, request_id), ttl_s=600
        )
        await (await shown(bot)).accept(person="web:alice")
        result = await resume(resumable_bank(ran), broker=agent, run=RUN)
        assert json.loads(str(result.output)) == ["sent 10 to ACME"]
        assert ran == [ARGS]
        entry = await Ledger.of(agent).get(request_id)
        assert entry["approved"] == entry["executed"] == DIGEST


async def test_without_signatures_any_claim_refuses_the_run() -> None:
    """The limit, documented: with no signing key (the embedded broker cannot sign) a
    claim cannot be told from a forgery, so any value under it refuses the run, as before:
    a writer of the store can stop an approved call, never make one run (S3;
    observation 3)."""
    async with toolnexus.connect("memory://") as broker:
        ledger = Ledger.of(broker)
        assert ledger.signing_key is None
        await broker.store(LEDGER_STORE, agent=True).set("tool-x:executed", b"garbage", ttl_s=60)
        with pytest.raises(InvalidAnswer, match=RAN_ALREADY):
            await ledger.executing("tool-x", "transfer", ARGS, approved=DIGEST)
        assert await broker.store(LEDGER_STORE, agent=True).get("tool-x:executed") == b"garbage"


@pytest.mark.redis
async def test_langgraph_checks_the_digest_its_own_decision_approved(
    fleet: Fleet, tmp_path: Path
) -> None:
    """As the approved tool starts, a writer of the store says in the ledger that other
    arguments were approved, and claims the call: ``LedgerMiddleware`` takes the approved
    digest from the resuming helper's own decision (the ``ainvoke`` config), not from the
    store, and the claim does not verify: the tool runs once (S3; observation 3). Before,
    the forged entry refused the run as "not the approved ones"."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import AgentMiddleware, HumanInTheLoopMiddleware
    from langgraph.checkpoint.memory import InMemorySaver

    from servers.langgraph_agent import Scripted, calls, tool_results, transfer_tool
    from toolnexus.frameworks.langgraph import LedgerMiddleware, run_resumable

    forged = tool_call_digest("transfer", {"to": "EVIL", "amount": 10000})

    class Forger(AgentMiddleware[Any, Any]):
        """Writes the store as the tool starts, as a writer of it could."""

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            [entry] = [k for k in await store.items() if not k.endswith(":executed")]
            store_key = agent.store(LEDGER_STORE, agent=True).key
            await agent.redis.hset(store_key, entry, json.dumps({"approved": forged}))
            await forge(agent, entry, b"garbage")
            return await handler(request)

    async with fleet.agent() as agent, fleet.responder() as bot:
        store = agent.store(LEDGER_STORE, agent=True)
        graph = create_agent(
            Scripted(messages=iter([*calls(ARGS), "done"])),
            tools=[transfer_tool(tmp_path / "ran.jsonl")],
            middleware=[
                HumanInTheLoopMiddleware({"transfer": True}),
                Forger(),
                LedgerMiddleware(Ledger.of(agent)),
            ],
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "t-claim"}}
        running = asyncio.create_task(
            run_resumable(graph, {"messages": [("user", "Pay ACME")]}, broker=agent, config=config)
        )
        pending = await shown(bot)
        await pending.accept(person="web:alice")
        values = await asyncio.wait_for(running, 30)
        assert tool_results(values) == ["sent 10 to ACME"]
        ran = (tmp_path / "ran.jsonl").read_text().splitlines()
        assert [json.loads(line) for line in ran] == [ARGS]
        assert (await Ledger.of(agent).get(pending.request.id))["approved"] == forged  # a record
