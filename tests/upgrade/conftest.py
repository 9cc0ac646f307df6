"""The previous release's set: this tree beside the last release (its version and commit in
``.ci/previous-release``), built from git history into ``.venv-previous`` by ``./run
test-previous`` (and ``./run test``), which names its Python in ``TOOLNEXUS_PREVIOUS_PYTHON``.
The two never share a process: each release runs as its own commands (``toolnexus ask``,
``toolnexus worker ...``) and agent scripts of public API calls, on one Redis."""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

from fleet import ROOT, Release

PREVIOUS_RELEASE = ROOT / ".ci" / "previous-release"


def last_release() -> tuple[str, str]:
    """The version and commit ``.ci/previous-release`` names."""
    lines = [line for line in PREVIOUS_RELEASE.read_text().splitlines() if line[:1] not in "#"]
    version, commit = lines[0].split()
    return version, commit


@pytest.fixture(scope="session")
def previous() -> Release:
    """The last release's commands, from ``$TOOLNEXUS_PREVIOUS_PYTHON``'s environment."""
    version, commit = last_release()
    python = os.environ.get("TOOLNEXUS_PREVIOUS_PYTHON")
    if not python:
        pytest.skip(
            f"the last release ({version}, {commit[:7]}) is not set up: ./run test-previous "
            "builds it into .venv-previous and runs these tests with TOOLNEXUS_PREVIOUS_PYTHON"
        )
    if not Path(python).exists():
        pytest.fail(f"TOOLNEXUS_PREVIOUS_PYTHON={python} does not exist")
    # ./run's setup_previous marks the environment with the release it built it from
    stamp = Path(python).parents[1] / f".installed-{version}-{commit}"
    assert stamp.exists(), f"{python} is not built from {version} {commit}: ./run test-previous"
    release = Release(Path(python))
    found = release.installed()
    assert found["version"] == version, f"{python} has toolnexus-bridge {found['version']}"
    # the release's own code, installed from its wheel: not this tree's
    assert not Path(found["file"]).is_relative_to(ROOT / "bridge"), found
    return release


@pytest.fixture(scope="session")
def current() -> Release:
    """This tree's commands, from this environment (``toolnexus`` beside this Python)."""
    release = Release(Path(sys.executable))
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert release.installed()["version"] == version, "reinstall: pip install -e ."
    return release
