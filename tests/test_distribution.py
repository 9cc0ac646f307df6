"""The distribution (SPEC §1, issue #31): published as ``toolnexus-bridge`` (the package
index's ``toolnexus`` is the agent toolkit), importing as ``toolnexus``; the README's install
line names it, the wheel carries the extras and entry points pyproject.toml declares, and the
README's first round trip runs from the wheel (issue #33)."""

from __future__ import annotations

import configparser
import email.parser
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from helpers import page_block

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
NAME = "toolnexus-bridge"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (found,) = out.glob("*.whl")
    return found


def dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.endswith(f".dist-info/{name}")]
        return z.read(path).decode()


@pytest.mark.slow
def test_the_wheel_is_toolnexus_bridge_importing_as_toolnexus(wheel: Path) -> None:
    assert wheel.name.startswith(f"toolnexus_bridge-{PYPROJECT['version']}-")
    metadata = email.parser.Parser().parsestr(dist_info(wheel, "METADATA"))
    assert metadata["Name"] == NAME
    extras = set(metadata.get_all("Provides-Extra") or [])
    assert extras == set(PYPROJECT["optional-dependencies"])
    assert {"web", "metrics", "tracing", "slack", "telegram", "mcp2"} <= extras
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist() if not n.split("/")[0].endswith("-info")}
        assert "toolnexus/_wire10.py" in z.namelist()
        assert "toolnexus_workers/gateway/openapi.json" in z.namelist()
    assert tops == {"toolnexus", "toolnexus_workers"}


@pytest.mark.slow
def test_the_wheel_has_the_command_and_every_worker(wheel: Path) -> None:
    points = configparser.ConfigParser()
    points.read_string(dist_info(wheel, "entry_points.txt"))
    assert dict(points["console_scripts"]) == {"toolnexus": "toolnexus.cli:main"}
    workers = dict(points["toolnexus.workers"])
    assert workers == PYPROJECT["entry-points"]["toolnexus.workers"]
    assert {"auto", "terminal", "web", "slack", "telegram"} <= set(workers)


def test_the_installed_metadata_is_found_by_the_distribution_name() -> None:
    from toolnexus.cli._main import DISTRIBUTION

    assert DISTRIBUTION == PYPROJECT["name"] == NAME
    extras = importlib.metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    assert set(extras) == set(PYPROJECT["optional-dependencies"])


INSTALL_PAGES = [
    "README.md",
    "docs/index.md",
    "docs/tutorials/first-pause.md",
    "docs/tutorials/fleet.md",
]
"""The pages whose first shell block installs the package."""


@pytest.mark.slow
@pytest.mark.parametrize("page", INSTALL_PAGES)
def test_a_page_install_block_runs_as_written_from_this_wheel(
    page: str, wheel: Path, tmp_path: Path
) -> None:
    """The block, as written, in a fresh environment whose pip takes this wheel instead of
    the package index (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``; dependencies left out)."""
    block = page_block(page, "pip install ", language="sh")
    venv.create(tmp_path / "env", with_pip=True)
    bin_dir = tmp_path / "env" / "bin"
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheel.parent),
        "PIP_NO_DEPS": "1",
        "PIP_QUIET": "1",
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(
        ["bash", "-euc", block], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    show = subprocess.run(
        [
            bin_dir / "python",
            "-I",
            "-c",
            f"import importlib.metadata as m; print(m.version({NAME!r}))",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    assert show.stdout.strip() == PYPROJECT["version"]


def test_the_readme_names_every_extra() -> None:
    """The README's install block lists every extra a user installs (issue #43: a2a and
    the frameworks' were left out); dev, docs and bench are the checkout's own."""
    block = page_block("README.md", "pip install ", language="sh")
    listed = " ".join(
        line.split("# extras:", 1)[1] if "# extras:" in line else line.lstrip("# ")
        for line in block.splitlines()
        if line.startswith("#")
    )
    named = set(re.findall(r"[a-z][\w-]*[a-z0-9]", listed))
    own = {"dev", "docs", "bench"}
    assert set(PYPROJECT["optional-dependencies"]) - own <= named, (
        set(PYPROJECT["optional-dependencies"]) - own - named
    )


@pytest.mark.slow
def test_the_readme_install_line_installs_this_wheel(wheel: Path, tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    line = re.search(r"^pip install '([^']+)'", readme, flags=re.M)
    assert line is not None, "the README has no pip install line"
    requirement = line.group(1)
    name, extras = re.fullmatch(r"([\w.-]+)\[([\w,]+)\]", requirement).groups()  # type: ignore[union-attr]
    assert name == NAME and set(extras.split(",")) <= set(PYPROJECT["optional-dependencies"])
    venv.create(tmp_path / "env", with_pip=True)
    python = tmp_path / "env" / "bin" / "python"
    subprocess.run(  # dependencies left out: the index is not asked, only the wheel's folder
        [
            python,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-index",
            "--no-deps",
            "--find-links",
            str(wheel.parent),
            requirement,
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    show = subprocess.run(
        [
            python,
            "-I",
            "-c",
            "import importlib.metadata as m, importlib.util as u; "
            "print(m.version('toolnexus-bridge'), u.find_spec('toolnexus').origin)",
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    version, origin = show.stdout.split()
    assert version == PYPROJECT["version"]
    assert origin.startswith(str(tmp_path / "env")) and origin.endswith("toolnexus/__init__.py")


@pytest.mark.slow
@pytest.mark.redis
async def test_the_readme_round_trip_runs_from_the_wheel(
    wheel: Path, tmp_path: Path, redis_url: str, namespace: str
) -> None:
    """The README's install line, from the built wheel rather than the source tree, then its
    web page and its agent, word for word: the agent's question is accepted on the page. The
    wheel's dependencies are this environment's (nothing is fetched), the code is the
    wheel's."""
    from test_readme import readme_round_trip

    readme = (ROOT / "README.md").read_text()
    line = re.search(r"^pip install '([^']+)'", readme, flags=re.M)
    assert line is not None
    target = tmp_path / "installed"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps"]
    subprocess.run(
        [*pip, "--find-links", str(wheel.parent), "--target", str(target), line.group(1)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(target)  # ahead of this environment's editable install
    origin = subprocess.run(
        [sys.executable, "-c", "import toolnexus, toolnexus_workers as w; print(w.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert origin.startswith(str(target)), origin
    toolnexus = str(target / "bin" / "toolnexus")
    printed = await readme_round_trip(toolnexus, sys.executable, env, redis_url, namespace)
    assert printed == "approved"
