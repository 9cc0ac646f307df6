"""A CrewAI flow whose payment proposal a person reviews (``@human_feedback`` with the
toolnexus provider), with a scripted collapse LLM (no network). Imported by
tests/test_frameworks_crewai.py, and run by it in a process of its own for the kill test:

    python crewai_flow.py URL NAMESPACE RAN_FILE MODE [FLOW_ID]

MODE: ``start`` (run_resumable, the flow persisted in RAN_FILE's folder) or ``resume``
(resume FLOW_ID). Prints the flow's result as its last line; ``pay`` appends each payment
it makes to RAN_FILE (the environment's TOOLNEXUS_TEST_RAN_FILE).
"""

from __future__ import annotations

import os

os.environ.update(  # no network: CrewAI's telemetry and trace prompts off
    CREWAI_DISABLE_TELEMETRY="true", OTEL_SDK_DISABLED="true", CREWAI_TRACING_ENABLED="false"
)

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from crewai.flow import Flow, human_feedback, listen, start
from crewai.flow.persistence import SQLiteFlowPersistence
from crewai.llms.base_llm import BaseLLM

import toolnexus
from toolnexus.frameworks.crewai import Feedback, resume, run_resumable

PROPOSAL = {"to": "ACME", "amount": 10}


class Scripted(BaseLLM):
    """CrewAI's collapse LLM, scripted: the outcome the feedback starts with."""

    def call(self, messages: Any, *args: Any, **kwargs: Any) -> str:
        prompt = messages if isinstance(messages, str) else messages[-1]["content"]
        feedback = prompt.split("Feedback: ", 1)[1].split("\n", 1)[0]
        return json.dumps({"outcome": feedback.split(":", 1)[0].strip()})


COLLAPSE = Scripted(model="scripted")


class PaymentReview(Flow[dict[str, Any]]):
    @start()
    @human_feedback(
        message="Send 10 euros to ACME?",
        emit=["approved", "rejected"],
        llm=COLLAPSE,
        provider=Feedback(),
    )
    def propose(self) -> dict[str, Any]:
        return PROPOSAL

    @listen("approved")
    def pay(self) -> str:
        with open(os.environ["TOOLNEXUS_TEST_RAN_FILE"], "a") as f:
            f.write(json.dumps(PROPOSAL) + "\n")
        return "sent 10 to ACME"

    @listen("rejected")
    def explain(self) -> str:
        return f"not paid: {self.last_human_feedback.feedback}"


async def main() -> None:
    url, namespace, ran_file, mode = sys.argv[1:5]
    os.environ["TOOLNEXUS_TEST_RAN_FILE"] = ran_file
    persistence = SQLiteFlowPersistence(str(Path(ran_file).parent / "flows.db"))
    async with toolnexus.connect(url, namespace=namespace, block_ms=100) as broker:
        if mode == "start":
            result = await run_resumable(PaymentReview(persistence=persistence), broker=broker)
        else:
            result = await resume(
                PaymentReview,
                broker=broker,
                flow_id=sys.argv[5],
                persistence=persistence,
                llm=COLLAPSE,
            )
    print(f"\nRESULT {result}", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
