"""A small MCP server of our own that speaks the Tasks extension (``io.modelcontextprotocol/tasks``)
in the shapes of its published schema (modelcontextprotocol/experimental-ext-tasks,
``schema/draft/schema.ts``), on the SDK's ``MCPServer`` over streamable HTTP.

    python tests/mcp_task_server.py PORT

Neither the SDK (mcp 2.3) nor fastmcp 4.1 (without the separate ``fastmcp-tasks``) serves
the extension. Here a tool listed in ``JOBS`` called by a client that declares the extension
becomes a task: ``tools/call`` returns ``resultType: "task"`` at once, the job runs in the
background, and ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` are served. An
``input_required`` task also carries a ``requestState`` that changes with every question
round (the schema has none; it lets a test see the newest one echoed). The ``journal`` tool
returns what the server saw: updates (keys, echoed state), cancels, declared capabilities,
how many times each task was polled, and tasks/* requests whose ``Mcp-Name`` header was not
their task id.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import uvicorn
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.extension import Extension, MethodBinding
from mcp.server.mcpserver import MCPServer
from mcp_types import CallToolRequestParams, RequestParams

TASKS = "io.modelcontextprotocol/tasks"
POLL_MS = 100
TTL_MS = 60_000

NAME_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
SEATS_SCHEMA = {
    "type": "object",
    "properties": {"value": {"type": "integer", "minimum": 1}},
    "required": ["value"],
}
YES_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}}


def now() -> str:
    return datetime.now(UTC).isoformat()


@dataclass
class Task:
    id: str
    ttl_ms: int | None = TTL_MS
    status: str = "working"
    status_message: str | None = None
    created_at: str = field(default_factory=now)
    updated_at: str = field(default_factory=now)
    outstanding: dict[str, Any] = field(default_factory=dict)
    answers: dict[str, Any] = field(default_factory=dict)
    rounds: int = 0
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    job: asyncio.Task[None] | None = None

    def set(self, status: str, message: str | None = None) -> None:
        self.status, self.status_message, self.updated_at = status, message, now()

    def wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "taskId": self.id,
            "status": self.status,
            "createdAt": self.created_at,
            "lastUpdatedAt": self.updated_at,
            "ttlMs": self.ttl_ms,
            "pollIntervalMs": POLL_MS,
        }
        if self.status_message is not None:
            body["statusMessage"] = self.status_message
        if self.status == "input_required":
            body["inputRequests"] = dict(self.outstanding)
            body["requestState"] = f"{self.id}/round-{self.rounds}"
        if self.result is not None:
            body["result"] = self.result
        if self.error is not None:
            body["error"] = self.error
        return body

    async def ask(self, questions: dict[str, tuple[str, dict[str, Any]]]) -> dict[str, Any]:
        """Put every question at once; wait until each has an answer (in any order)."""
        self.rounds += 1
        for key, (message, schema) in questions.items():
            self.outstanding[key] = {
                "method": "elicitation/create",
                "params": {"mode": "form", "message": message, "requestedSchema": schema},
            }
        self.set("input_required")
        while not set(questions) <= set(self.answers):
            self.changed.clear()
            await self.changed.wait()
        self.set("working")
        return {key: self.answers[key] for key in questions}


Job = Callable[[Task, dict[str, Any]], Awaitable[dict[str, Any]]]


def text(value: str) -> dict[str, Any]:
    return {
        "content": [{"type": "text", "text": value}],
        "structuredContent": {"result": value},  # the listed tools return str
        "isError": False,
    }


async def book(task: Task, arguments: dict[str, Any]) -> dict[str, Any]:
    answers = await task.ask(
        {"name": ("Name for the booking?", NAME_SCHEMA), "seats": ("How many seats?", SEATS_SCHEMA)}
    )
    name, seats = answers["name"], answers["seats"]
    if name["action"] != "accept" or seats["action"] != "accept":
        return text(json.dumps({key: answers[key]["action"] for key in answers}))
    return text(f"booked {seats['content']['value']} seats for {name['content']['name']}")


async def brew(task: Task, arguments: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(float(arguments.get("seconds", 0.5)))
    return text("brewed")


async def fail_task(task: Task, arguments: dict[str, Any]) -> dict[str, Any]:
    raise JobError(-32000, "the kitchen is closed")


async def self_cancel(task: Task, arguments: dict[str, Any]) -> dict[str, Any]:
    raise asyncio.CancelledError


async def ask_hold(task: Task, arguments: dict[str, Any]) -> dict[str, Any]:
    answers = await task.ask({"hold": ("Hold on?", YES_SCHEMA)})
    return text(answers["hold"]["action"])


async def short_ttl(task: Task, arguments: dict[str, Any]) -> dict[str, Any]:
    task.ttl_ms = 4_000
    answers = await task.ask({"quick": ("Quick?", YES_SCHEMA)})
    return text(answers["quick"]["action"])


class JobError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


JOBS: dict[str, Job] = {
    "book": book,
    "brew": brew,
    "fail_task": fail_task,
    "self_cancel": self_cancel,
    "ask_hold": ask_hold,
    "short_ttl": short_ttl,
}


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any]
    request_state: str | None = None


class TasksExtension(Extension):
    """The server side of the Tasks extension, in memory."""

    identifier = TASKS

    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}
        self.journal: dict[str, Any] = {
            "updates": [],
            "cancels": [],
            "declared": [],
            "gets": {},
            "misrouted": [],
        }
        self._ids = itertools.count(1)

    def methods(self) -> list[MethodBinding]:
        return [
            MethodBinding("tasks/get", TaskParams, self.get),
            MethodBinding("tasks/update", UpdateParams, self.update),
            MethodBinding("tasks/cancel", TaskParams, self.cancel),
        ]

    def _task(self, params: TaskParams, ctx: ServerRequestContext[Any, Any]) -> Task:
        headers = getattr(ctx.request, "headers", None)
        routed = None if headers is None else headers.get("mcp-name")
        if routed != params.task_id:  # SEP-2663: Mcp-Name is the task id on tasks/*
            self.journal["misrouted"].append({"task": params.task_id, "mcp-name": routed})
        task = self.tasks.get(params.task_id)
        if task is None:
            from mcp.shared.exceptions import MCPError

            raise MCPError(-32602, f"Failed to retrieve task: Task not found: {params.task_id}")
        return task

    async def get(self, ctx: ServerRequestContext[Any, Any], params: TaskParams) -> HandlerResult:
        task = self._task(params, ctx)
        self.journal["gets"][task.id] = self.journal["gets"].get(task.id, 0) + 1
        return {"resultType": "complete", **task.wire()}

    async def update(
        self, ctx: ServerRequestContext[Any, Any], params: UpdateParams
    ) -> HandlerResult:
        task = self._task(params, ctx)
        self.journal["updates"].append(
            {"task": task.id, "keys": sorted(params.input_responses), "state": params.request_state}
        )
        for key, response in params.input_responses.items():
            if key in task.outstanding:  # unknown and already answered keys are ignored
                del task.outstanding[key]
                task.answers[key] = response
        task.changed.set()
        return {"resultType": "complete"}

    async def cancel(
        self, ctx: ServerRequestContext[Any, Any], params: TaskParams
    ) -> HandlerResult:
        task = self._task(params, ctx)
        self.journal["cancels"].append(task.id)
        if task.job is not None:
            task.job.cancel()
        return {"resultType": "complete"}

    async def intercept_tool_call(
        self,
        params: CallToolRequestParams,
        ctx: ServerRequestContext[Any, Any],
        call_next: CallNext,
    ) -> HandlerResult:
        meta: dict[str, Any] = dict(ctx.meta or {})
        capabilities = meta.get("io.modelcontextprotocol/clientCapabilities") or {}
        declared = TASKS in (capabilities.get("extensions") or {})
        self.journal["declared"].append({"tool": params.name, "declared": declared})
        job = JOBS.get(params.name)
        if job is None or not declared:
            return await call_next(ctx)
        task = Task(f"task-{next(self._ids)}")
        self.tasks[task.id] = task
        task.job = asyncio.get_running_loop().create_task(self._run(task, job, params))
        await asyncio.sleep(0)  # let the job ask its first question before the first poll
        return {"resultType": "task", **task.wire()}

    async def _run(self, task: Task, job: Job, params: CallToolRequestParams) -> None:
        try:
            task.result = await job(task, dict(params.arguments or {}))
            task.set("completed")
        except JobError as exc:
            task.error = {"code": exc.code, "message": exc.message}
            task.set("failed", f"Tool execution failed: {exc.message}")
        except asyncio.CancelledError:
            task.set("cancelled", "The task was cancelled.")


def make_task_server() -> tuple[MCPServer, TasksExtension]:
    extension = TasksExtension()
    server = MCPServer("task-server", extensions=[extension])

    def listed(name: str) -> None:
        async def fallback() -> str:
            return "no task: the client did not declare the Tasks extension"

        server.tool(name=name)(fallback)

    for name in JOBS:
        if name != "brew":
            listed(name)

    @server.tool()
    async def brew(seconds: float = 0.5) -> str:
        return "no task"

    @server.tool()
    async def journal() -> str:
        return json.dumps(extension.journal)

    return server, extension


if __name__ == "__main__":
    server, _ = make_task_server()
    uvicorn.run(
        server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning"
    )
