"""The container image: ``./run image`` builds the ``Dockerfile`` with buildah (there is no
Docker engine on these machines) on a Debian base made here, then runs these against it
(``TOOLNEXUS_TEST_IMAGE`` names the image, ``TOOLNEXUS_TEST_BUILDAH`` the buildah command
line of its storage). The image runs as a non-root user, ``toolnexus --help`` and its
health check run in it, and ``toolnexus worker auto`` in it answers an agent on this host
through this host's Redis."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import toolnexus
from conftest import FAST
from helpers import eventually

IMAGE = os.environ.get("TOOLNEXUS_TEST_IMAGE", "")
BUILDAH = shlex.split(os.environ.get("TOOLNEXUS_TEST_BUILDAH", "buildah"))
TOOLNEXUS = str(Path(sys.executable).parent / "toolnexus")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not IMAGE, reason="./run image builds the image and runs these"),
]

WORKER = "toolnexus worker auto --rules /tmp/rules.toml"
RULES = """\
[[rule]]
name = "image test"
prompt = "^Deploy build 412"
action = "accept"
"""


def buildah(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*BUILDAH, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def container() -> Iterator[str]:
    """A working container of the image (removed afterwards)."""
    made = buildah("from", "--pull=never", IMAGE)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    try:
        yield name
    finally:
        buildah("rm", name)


def run_args(container: str, *command: str, env: dict[str, str] | None = None) -> list[str]:
    """``buildah run`` of ``command`` in ``container``, on this host's network, as the
    image's user, with ``env``."""
    flags = [f"--env={key}={value}" for key, value in (env or {}).items()]
    return [
        *BUILDAH, "run", "--isolation", "chroot", "--network", "host", *flags, container,
        "--", *command,
    ]  # fmt: skip


def run_in(
    container: str, *command: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        run_args(container, *command, env=env), capture_output=True, text=True, timeout=120
    )


def config() -> dict[str, Any]:
    """The image's configuration (Docker's format: it keeps the health check)."""
    done = buildah("inspect", "--type", "image", IMAGE)
    assert done.returncode == 0, done.stderr
    inspected: dict[str, Any] = json.loads(done.stdout)
    docker: dict[str, Any] = inspected["Docker"]["config"]
    return docker


def test_the_image_runs_toolnexus_as_a_non_root_user(container: str) -> None:
    image = config()
    assert (image["User"], image["Entrypoint"], image["Cmd"]) == (
        "10001:10001",
        ["toolnexus"],
        ["--help"],
    )
    ids = run_in(container, "sh", "-c", 'echo "$(id -u):$(id -g)"')
    assert (ids.returncode, ids.stdout.strip()) == (0, "10001:10001"), ids.stderr
    shown = run_in(container, "toolnexus", "--help")
    assert shown.returncode == 0, shown.stderr
    assert "Pause an AI agent for a person anywhere in a fleet." in shown.stdout


async def test_a_worker_in_the_image_answers_an_agent_here_and_is_healthy(
    container: str, redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The image's own health check fails while no worker runs in the container, and
    passes while ``toolnexus worker auto`` runs there; an agent here (``toolnexus ask``) is
    answered by that worker's rule, through this host's Redis."""
    health = config()["Healthcheck"]["Test"]
    assert health == ["CMD", "toolnexus", "check", "--here"]
    env = {"TOOLNEXUS_URL": redis_url, "TOOLNEXUS_NAMESPACE": namespace}
    before = run_in(container, *health[1:], env=env)
    assert before.returncode == 1, before.stdout + before.stderr
    (tmp_path / "rules.toml").write_text(RULES)
    rules = buildah("copy", container, str(tmp_path / "rules.toml"), "/tmp/rules.toml")
    assert rules.returncode == 0, rules.stderr
    log = (tmp_path / "worker.log").open("w")
    # buildah run ends its command with SIGKILL: the worker gets SIGTERM from a shell beside
    # it, when the test closes that shell's input, and the shell exits with the worker's status
    worker = subprocess.Popen(
        run_args(container, "sh", "-c", f"{WORKER} & read -r _; kill -TERM $!; wait $!", env=env),
        stdin=subprocess.PIPE,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        async with toolnexus.connect(redis_url, namespace=namespace, **FAST) as broker:

            async def beating() -> bool:
                assert worker.poll() is None, (tmp_path / "worker.log").read_text()
                return "auto" in {beat.group for beat in await broker.heartbeats()}

            await eventually(beating, "the image's auto worker's heartbeat", timeout_s=60)
        healthy = run_in(container, *health[1:], env=env)
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        asked = subprocess.run(
            [TOOLNEXUS, "ask", "Deploy build 412 to production?", "--timeout", "60s"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert asked.returncode == 0, asked.stdout + asked.stderr
        audit = subprocess.run(
            [TOOLNEXUS, "audit", "--json"],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        records = json.loads(audit.stdout)
        assert [(r["ok"], r["person"]) for r in records] == [(True, "auto:image test")]
    finally:
        assert worker.stdin is not None
        worker.stdin.close()
        try:
            code = worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait(30)
        log.close()
    assert code == 0, (tmp_path / "worker.log").read_text()
