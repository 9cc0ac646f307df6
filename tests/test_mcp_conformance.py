"""The official MCP conformance package's client scenarios against ``load_mcp`` with its
defaults (tests/mcp_conformance_client.py), for 2025-06-18, 2025-11-25 and 2026-07-28, and
a sample of its auth scenarios with the SDK's own OAuth clients as ``load_mcp(auth=...)``.

The package and Node 22 are installed by ``./run test`` into .ci/node22 (pinned in
.ci/conformance-requirements.txt); without them this module is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE = ROOT / ".ci" / "node22" / "node_modules" / ".bin" / "node"
CONFORMANCE = ROOT / ".ci" / "node22" / "node_modules" / ".bin" / "conformance"
CLIENT = Path(__file__).resolve().parent / "mcp_conformance_client.py"

SCENARIOS = [
    ("initialize", "2025-06-18"),
    ("initialize", "2025-11-25"),
    ("tools_call", "2025-06-18"),
    ("tools_call", "2025-11-25"),
    ("tools_call", "2026-07-28"),
    ("elicitation-sep1034-client-defaults", "2025-11-25"),
    ("request-metadata", "2026-07-28"),
    ("sep-2322-client-request-state", "2026-07-28"),
    ("http-standard-headers", "2026-07-28"),
    ("http-custom-headers", "2026-07-28"),
    ("http-invalid-tool-headers", "2026-07-28"),
    ("json-schema-ref-no-deref", "2026-07-28"),
    ("json-schema-2020-12-preservation", "2025-11-25"),
    ("json-schema-2020-12-preservation", "2026-07-28"),
    ("sse-retry", "2025-11-25"),
    # load_mcp(auth=) with the SDK's own OAuth clients (tests/mcp_conformance_client.py): a
    # sample of the auth scenarios, every one of which passes (docs/how-to/mcp-servers.md)
    ("auth/metadata-default", "2025-11-25"),
    ("auth/metadata-default", "2026-07-28"),
    ("auth/token-endpoint-auth-basic", "2025-06-18"),
    ("auth/pre-registration", "2026-07-28"),
    ("auth/scope-step-up", "2026-07-28"),
    ("auth/iss-wrong-issuer", "2026-07-28"),
    ("auth/client-credentials-basic", None),  # an extension: no spec version
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),  # the scenarios run once, in the first test
    pytest.mark.skipif(not CONFORMANCE.exists(), reason="./run test installs .ci/node22"),
]


def run(scenario: str, version: str | None, out: Path) -> tuple[int, list[dict[str, Any]], str]:
    """One scenario: the runner's exit code, its checks, and its output."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = f"{sys.executable} {CLIENT}"
    spec = [] if version is None else ["--spec-version", version]
    done = subprocess.run(
        [str(NODE), str(CONFORMANCE), "client", "--command", command, "--scenario", scenario,
         *spec, "--timeout", "60000", "-o", str(out)],
        capture_output=True, text=True, env=env, timeout=180, check=False,
    )  # fmt: skip
    found = sorted(out.rglob("checks.json"))  # auth/x writes under auth/
    checks = json.loads(found[-1].read_text()) if found else []
    return done.returncode, checks, done.stdout + done.stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("conformance")

    def one(item: tuple[str, str | None]) -> tuple[int, list[dict[str, Any]], str]:
        scenario, version = item
        return run(scenario, version, base / f"{scenario.replace('/', '_')}-{version}")

    with ThreadPoolExecutor(3) as pool:
        return dict(zip([f"{s}@{v}" for s, v in SCENARIOS], pool.map(one, SCENARIOS), strict=True))


@pytest.mark.parametrize("scenario", [f"{s}@{v}" for s, v in SCENARIOS])
def test_the_scenario_passes(results: dict[str, Any], scenario: str) -> None:
    code, checks, output = results[scenario]
    failed = [f"{c['id']}: {c.get('errorMessage')}" for c in checks if c["status"] == "FAILURE"]
    assert checks, output[-2000:]
    assert not failed, failed
    assert code == 0, output[-2000:]
