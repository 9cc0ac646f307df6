"""Issue #27, observation 3 (its leftovers, item 2): the arguments approved are the
arguments that run. A resumable run keeps its state unsigned in a broker store (the
message history, the pending calls' requests), which whoever may write stores can edit.
On a private redis-server with signatures required, a resumer runs a tool only with
arguments whose digest is the one its own decision took from the signed approval
(S3: stored state is verified before it counts; S4: the signed answer is bound to the
exact request): an edited history (pydantic-ai) or ``RunState`` (OpenAI Agents SDK) is
refused before the tool runs, with an error naming both digests; an edited request is
refused as the durable attach's signed copy asks something else; a ``RunState`` that
says another call is approved runs nothing (before, it ran); a forged ledger entry
approves nothing."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import msgspec
import pytest

from conftest import Fleet
from test_forgery import shown
from test_frameworks_pydantic_ai import ARGS, resumable_bank
from toolnexus import InvalidAnswer, InvalidRequest
from toolnexus.frameworks import Ledger, tool_call_digest
from toolnexus.frameworks.pydantic_ai import STORE, resume, run_resumable
from toolnexus.redis_broker import RedisBroker

pytestmark = pytest.mark.redis

RUN = "run-tamper"


async def asked_then_gone(
    agent: RedisBroker, bot: RedisBroker, ran: list[Any], run: str = RUN
) -> str:
    """Start the run ``run``; once its approval is asked, its process is gone (the task
    cancelled: the durable request stays open). The id of the request asked."""
    started = asyncio.create_task(
        run_resumable(resumable_bank(ran), "Pay ACME", broker=agent, run=run)
    )
    pending = await shown(bot)
    started.cancel()
    await asyncio.gather(started, return_exceptions=True)
    return pending.request.id


async def edit_kept_state(agent: RedisBroker, part: str, old: bytes, new: bytes) -> None:
    """Replace ``old`` by ``new`` in the kept state's ``part`` (``messages``, or each of
    ``requests``), as a writer of the store could."""
    store = agent.store(STORE)
    raw = await store.get(RUN)
    assert raw is not None
    kept = msgspec.json.decode(raw)
    items = kept[part] if isinstance(kept[part], list) else [kept[part]]
    edited = []
    for item in items:
        text = base64.b64decode(item)
        assert old in text, (old, text)
        edited.append(base64.b64encode(text.replace(old, new)).decode())
    kept[part] = edited if isinstance(kept[part], list) else edited[0]
    await store.set(RUN, msgspec.json.encode(kept), ttl_s=600)


async def approve(bot: RedisBroker) -> None:
    await (await shown(bot)).accept(person="web:alice")


async def test_an_edited_message_history_cannot_change_the_arguments_that_run(
    fleet: Fleet,
) -> None:
    """The history's call says 10000 where the signed approval approved 10: the resumer
    refuses to run the tool (S3, S4; observation 3)."""
    ran: list[dict[str, Any]] = []
    async with fleet.agent() as agent, fleet.responder() as bot:
        request_id = await asked_then_gone(agent, bot, ran)
        await edit_kept_state(agent, "messages", b'"amount":10}', b'"amount":10000}')
        await approve(bot)
        with pytest.raises(InvalidAnswer, match="not the approved ones") as refused:
            await resume(resumable_bank(ran), broker=agent, run=RUN)
        assert tool_call_digest("transfer", ARGS) in str(refused.value)
        assert tool_call_digest("transfer", {"to": "ACME", "amount": 10000}) in str(refused.value)
        assert ran == []
        assert "executed" not in await Ledger.of(agent).get(request_id)


async def test_an_edited_pending_request_cannot_change_the_arguments_that_run(
    fleet: Fleet,
) -> None:
    """The kept request (and the history) say 10000, with a digest to match: the durable
    attach compares it with the signed request it published and refuses it (S3;
    observation 3)."""
    ran: list[dict[str, Any]] = []
    forged = tool_call_digest("transfer", {"to": "ACME", "amount": 10000})
    async with fleet.agent() as agent, fleet.responder() as bot:
        await asked_then_gone(agent, bot, ran)
        await edit_kept_state(agent, "messages", b'"amount":10}', b'"amount":10000}')
        digest = tool_call_digest("transfer", ARGS).encode()
        await edit_kept_state(agent, "requests", digest, forged.encode())
        await edit_kept_state(agent, "requests", b'"amount":10}', b'"amount":10000}')
        await approve(bot)
        with pytest.raises(InvalidRequest, match="asks something else"):
            await resume(resumable_bank(ran), broker=agent, run=RUN)
        assert ran == []


async def test_a_forged_ledger_entry_cannot_approve_other_arguments(fleet: Fleet) -> None:
    """The ledger's digests are in the store too: one that says the forged arguments were
    approved changes nothing, as the resumer checks against its own decision (S3;
    observation 3)."""
    forged_args = {"to": "ACME", "amount": 10000}
    forged = tool_call_digest("transfer", forged_args)
    async with fleet.agent() as agent:
        ledger = Ledger(agent.store("tool-calls", agent=True))
        await ledger.store.set("tool-x", msgspec.json.encode({"approved": forged}), ttl_s=600)
        genuine = tool_call_digest("transfer", ARGS)
        with pytest.raises(InvalidAnswer, match="not the approved ones"):
            await ledger.executing("tool-x", "transfer", forged_args, approved=genuine)
        assert "executed" not in await ledger.get("tool-x")
        assert await ledger.executing("tool-x", "transfer", ARGS, approved=genuine) == genuine


def openai_bank(ran: list[dict[str, Any]]) -> Any:
    """An OpenAI Agents SDK agent whose ``transfer`` needs approval (a scripted model)."""
    from agents import Agent, function_tool, set_tracing_disabled

    from openai_scripted import Scripted

    set_tracing_disabled(True)

    @function_tool(needs_approval=True)
    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        ran.append({"to": to, "amount": amount})
        return f"sent {amount} to {to}"

    return Agent(name="bank-bot", model=Scripted(), tools=[transfer])


async def openai_asked_then_gone(agent: RedisBroker, bot: RedisBroker, bank: Any) -> None:
    from toolnexus.frameworks import openai_agents

    started = asyncio.create_task(
        openai_agents.run_resumable(bank, "Pay ACME", broker=agent, run=RUN)
    )
    await shown(bot)
    started.cancel()
    await asyncio.gather(started, return_exceptions=True)


async def test_an_edited_openai_agents_run_state_cannot_change_the_arguments_that_run(
    fleet: Fleet,
) -> None:
    """The OpenAI Agents SDK's kept ``RunState`` says 10000 where the signed approval
    approved 10: the resumer refuses the call as its tool starts (S3; observation 3)."""
    from toolnexus.frameworks import openai_agents

    ran: list[dict[str, Any]] = []
    bank = openai_bank(ran)
    async with fleet.agent() as agent, fleet.responder() as bot:
        await openai_asked_then_gone(agent, bot, bank)
        store = agent.store(openai_agents.STORE)
        raw = await store.get(RUN)
        assert raw is not None
        kept = msgspec.json.decode(raw)
        kept["state"] = json.dumps(forged_run_state(json.loads(kept["state"])))
        await store.set(RUN, msgspec.json.encode(kept), ttl_s=600)
        await approve(bot)
        with pytest.raises(InvalidAnswer, match="not the approved ones"):
            await openai_agents.resume(bank, broker=agent, run=RUN)
        assert ran == []


async def test_a_run_state_that_approves_another_call_runs_nothing(fleet: Fleet) -> None:
    """The kept ``RunState`` is edited into one whose pending call is another (its id
    ``call_9``, 10000) and already approved, as the SDK itself would mark it
    (``state.approve``): no approval of this run approved that call, so it is refused as
    its tool starts (before, the ledger knew nothing of it and let it run) (S3;
    observation 3)."""
    from agents import RunState

    from toolnexus.frameworks import openai_agents

    ran: list[dict[str, Any]] = []
    bank = openai_bank(ran)
    async with fleet.agent() as agent, fleet.responder() as bot:
        await openai_asked_then_gone(agent, bot, bank)
        store = agent.store(openai_agents.STORE)
        raw = await store.get(RUN)
        assert raw is not None
        kept = msgspec.json.decode(raw)
        forged = json.loads(kept["state"].replace("call_1", "call_9"))
        state = await RunState.from_string(bank, json.dumps(forged_run_state(forged)))
        for item in state.get_interruptions():
            state.approve(item)
        kept["state"] = state.to_string()
        await store.set(RUN, msgspec.json.encode(kept), ttl_s=600)
        await approve(bot)  # the genuine approval, of call_1 with 10
        with pytest.raises(InvalidAnswer, match="'call_9' of transfer: no approval of this run"):
            await openai_agents.resume(bank, broker=agent, run=RUN)
        assert ran == []


def forged_run_state(node: Any) -> Any:
    """A serialized ``RunState`` whose calls send 10000 (every copy of their arguments),
    without the SDK's own record of the calls it saw (which would tell)."""
    if isinstance(node, dict):
        forged = {k: forged_run_state(v) for k, v in node.items() if k != "tool_invocations"}
        if isinstance(forged.get("arguments"), str) and '"amount": 10}' in forged["arguments"]:
            forged["arguments"] = forged["arguments"].replace('"amount": 10}', '"amount": 10000}')
        return forged
    if isinstance(node, list):
        return [forged_run_state(item) for item in node]
    return node
