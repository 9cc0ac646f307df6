"""An OpenAI Agents SDK agent with a scripted model (no network) whose ``transfer`` tool
needs approval, run by tests/test_frameworks_openai_agents.py in a process of its own
(which a test kills, then resumes the run in another).

    python openai_agents_agent.py URL NAMESPACE RUN RAN_FILE MODE [TIMEOUT_S]

MODE: ``docs`` (the example of docs/how-to/tool-approvals.md),
``inline`` (run_with_approvals, each wait TIMEOUT_S), ``cancel`` (the same,
cancelled after TIMEOUT_S), ``start`` (run_resumable), ``resume``. Prints the final
output; the tool appends each call it runs to RAN_FILE.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys

from agents import Agent, ModelSettings, function_tool, set_tracing_disabled

import toolnexus
from helpers import page_block, run_fragment
from openai_scripted import Scripted
from toolnexus.frameworks import Ledger
from toolnexus.frameworks.openai_agents import resume, run_resumable, run_with_approvals

set_tracing_disabled(True)  # no network: traces are not exported


PAGE = "docs/how-to/tool-approvals.md"
FIRST_LINE = "result = await run_with_approvals("


async def main() -> None:
    url, namespace, run, ran_file, mode = sys.argv[1:6]
    timeout_s = float(sys.argv[6]) if len(sys.argv) > 6 else 30.0

    @function_tool(needs_approval=True)
    def transfer(to: str, amount: int) -> str:
        """Send ``amount`` euros to ``to``."""
        with open(ran_file, "a") as f:
            f.write(json.dumps({"to": to, "amount": amount}) + "\n")
        return f"sent {amount} to {to}"

    agent = Agent(
        name="bank-bot", model=Scripted(), tools=[transfer], model_settings=ModelSettings()
    )
    async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
        ledger = Ledger.of(broker)
        wait_for = functools.partial(broker.wait_for, timeout_s=timeout_s)
        if mode == "inline":
            result = await run_with_approvals(
                agent, "Pay ACME", wait_for=wait_for, run=run, ledger=ledger
            )
        elif mode == "cancel":
            running = run_with_approvals(agent, "Pay ACME", wait_for=broker.wait_for, run=run)
            try:
                await asyncio.wait_for(running, timeout_s)
            except TimeoutError:
                print("cancelled", flush=True)
            return
        elif mode == "docs":  # the example of docs/how-to/tool-approvals.md, as written
            names = {"agent": agent, "broker": broker, "run_with_approvals": run_with_approvals}
            result = (await run_fragment(page_block(PAGE, FIRST_LINE), PAGE, **names))["result"]
        elif mode == "start":
            result = await run_resumable(agent, "Pay ACME", broker=broker, run=run)
        else:
            result = await resume(agent, broker=broker, run=run)
    print(result.final_output, flush=True)


asyncio.run(main())
