"""A Microsoft Agent Framework agent with a scripted chat client (no network) whose
``transfer`` tool needs approval, run by tests/test_frameworks_agent_framework.py in a
process of its own (so that it can be killed while it waits).

    python agent_framework_agent.py URL NAMESPACE RUN RAN_FILE MODE [TIMEOUT_S]

MODE: ``inline`` (run_with_approvals, each wait TIMEOUT_S), ``cancel`` (the same,
cancelled after TIMEOUT_S), ``docs`` (the example of docs/how-to/tool-approvals.md),
``start`` (the agent in a workflow: run_workflow, checkpoints in RAN_FILE's folder),
``resume`` (resume_workflow), ``agent-start`` (run_resumable), ``agent-resume`` (resume).
Prints the final text; the tool appends each call it runs to RAN_FILE.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

from agent_framework import (
    Agent,
    AgentResponse,
    BaseChatClient,
    ChatResponse,
    Content,
    FileCheckpointStorage,
    FunctionInvocationLayer,
    Message,
    WorkflowBuilder,
    tool,
)

import toolnexus
from helpers import page_block, run_fragment
from toolnexus.frameworks.agent_framework import (
    resume,
    resume_workflow,
    run_resumable,
    run_with_approvals,
    run_workflow,
)

ARGUMENTS = json.dumps({"to": "ACME", "amount": 10})


class Scripted(FunctionInvocationLayer[Any], BaseChatClient[Any]):
    """Calls ``transfer`` once, then answers with the tool's results and the user's texts."""

    async def _respond(self, messages: Sequence[Message]) -> ChatResponse:
        results = [c for m in messages for c in m.contents if c.type == "function_result"]
        if not results:
            call = Content.from_function_call(
                call_id="call_1", name="transfer", arguments=ARGUMENTS
            )
            return ChatResponse(messages=[Message(role="assistant", contents=[call])])
        said = [str(r.result) for r in results]
        said += [m.text for m in messages[1:] if m.role == "user" and m.text]
        return ChatResponse(messages=[Message(role="assistant", contents=[json.dumps(said)])])

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Any, **kwargs: Any
    ) -> Awaitable[ChatResponse]:
        assert not stream, "the scripted client does not stream"
        return self._respond(messages)


PAGE = "docs/how-to/tool-approvals.md"
FIRST_LINE = "response = await run_with_approvals("


async def main() -> None:
    url, namespace, run, ran_file, mode = sys.argv[1:6]
    timeout_s = float(sys.argv[6]) if len(sys.argv) > 6 else 30.0

    @tool(approval_mode="always_require")
    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        with open(ran_file, "a") as f:
            f.write(json.dumps({"to": to, "amount": amount}) + "\n")
        return f"sent {amount} to {to}"

    agent = Agent(client=Scripted(), tools=[transfer], name="bank-bot")
    storage = FileCheckpointStorage(str(Path(ran_file).parent / "checkpoints"))
    workflow = WorkflowBuilder(start_executor=agent, name="pay", checkpoint_storage=storage).build()
    async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
        wait_for = functools.partial(broker.wait_for, timeout_s=timeout_s)
        if mode == "inline":
            response = await run_with_approvals(agent, "Pay ACME", wait_for=wait_for, run=run)
            print(response.text, flush=True)
        elif mode == "cancel":
            running = run_with_approvals(agent, "Pay ACME", wait_for=broker.wait_for, run=run)
            try:
                await asyncio.wait_for(running, timeout_s)
            except TimeoutError:
                print("cancelled", flush=True)
        elif mode == "agent-start":
            print((await run_resumable(agent, "Pay ACME", broker=broker, run=run)).text)
        elif mode == "agent-resume":
            print((await resume(agent, broker=broker, run=run)).text, flush=True)
        elif mode == "docs":
            names = {"agent": agent, "broker": broker, "run_with_approvals": run_with_approvals}
            code = page_block(PAGE, FIRST_LINE)
            print((await run_fragment(code, PAGE, **names))["response"].text, flush=True)
        else:
            if mode == "start":
                result = await run_workflow(
                    workflow, "Pay ACME", broker=broker, run=run, checkpoint_storage=storage
                )
            else:
                result = await resume_workflow(
                    workflow, broker=broker, run=run, checkpoint_storage=storage
                )
            [output] = [o for o in result.get_outputs() if isinstance(o, AgentResponse)]
            print(output.text, flush=True)


asyncio.run(main())
