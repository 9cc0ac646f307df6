"""``toolnexus worker NAME``: workers found by entry point, with the options every one takes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolnexus import Broker
from toolnexus_workers.options import run_main, worker_parser

TOOLNEXUS = str(Path(sys.executable).with_name("toolnexus"))


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLNEXUS_")}
    return subprocess.run(
        [TOOLNEXUS, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, **env},
        check=False,
    )


def test_the_workers_are_listed() -> None:
    done = run("worker", "--help")
    assert done.returncode == 0
    assert (
        "Run a responder worker: a2a, auto, email, gateway, http, slack, telegram, terminal, "
        "web, webhook." in " ".join(done.stdout.split())
    )


def test_an_unknown_worker_is_refused_by_name() -> None:
    done = run("worker", "slak")
    assert done.returncode == 2
    assert (
        done.stderr == "toolnexus: no worker named 'slak' "
        "(installed: a2a, auto, email, gateway, http, slack, telegram, terminal, web, webhook)\n"
    )


@pytest.mark.parametrize(
    "name",
    ["a2a", "auto", "email", "http", "slack", "telegram", "terminal", "web", "webhook"],
)
@pytest.mark.slow
def test_every_worker_takes_the_common_options(name: str) -> None:
    done = run("worker", name, "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: toolnexus worker {name} ")
    for option in ("--url", "--namespace", "--queue", "--group", "--help", "$TOOLNEXUS_URL"):
        assert option in done.stdout


@pytest.mark.slow
def test_the_url_comes_from_the_environment(tmp_path: Path) -> None:
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\naction = "skip"\n')
    done = run("worker", "auto", "--rules", str(rules), TOOLNEXUS_URL="redis://127.0.0.1:1/0")
    assert done.returncode == 3
    assert "toolnexus worker auto: cannot reach Redis at redis://127.0.0.1:1/0" in done.stderr


@pytest.mark.parametrize(
    ("worker", "blocked"),
    [
        ("web", ["starlette", "uvicorn", "sse_starlette", "jinja2"]),
        ("slack", ["slack_bolt", "slack_sdk", "aiohttp"]),
        ("telegram", ["aiogram"]),
        ("gateway", ["uvicorn"]),
        ("http", ["uvicorn"]),
        ("a2a", ["a2a"]),
        ("webhook", ["standardwebhooks"]),
        ("email", ["aiosmtplib"]),
    ],
)
@pytest.mark.slow
def test_a_missing_extra_names_the_install_command(worker: str, blocked: list[str]) -> None:
    code = (
        "import sys\n"
        f"for name in {blocked!r}: sys.modules[name] = None  # as if never installed\n"
        "from toolnexus.cli import main\n"
        f"sys.exit(main(['worker', {worker!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert done.stderr.rstrip().endswith(f"pip install 'toolnexus-bridge[{worker}]'"), done.stderr


@pytest.mark.parametrize(("choice", "loop"), [("no", "asyncio"), ("yes", "uvloop")])
def test_a_worker_runs_on_the_event_loop_asked_for(
    choice: str, loop: str, redis_url: str, namespace: str
) -> None:
    pytest.importorskip("uvloop")
    parser = worker_parser("test", "A test worker.", group="test")
    args = parser.parse_args(["--url", redis_url, "--namespace", namespace, "--uvloop", choice])

    async def work(broker: Broker) -> int:
        running = type(asyncio.get_running_loop()).__module__.split(".")[0]
        return 0 if running == loop else 1

    assert run_main(args, work) == 0
