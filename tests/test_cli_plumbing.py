"""CLI plumbing once (issue #32, observation 7): every command and worker takes the broker
flags of one parent parser, and ends on an error with the status one map gives its class,
as docs/reference/errors.md documents it."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import tomllib
from pathlib import Path

import pytest

import toolnexus
from toolnexus import errors
from toolnexus.cli import exit_code, failed, main
from toolnexus.cli._exits import EXIT_CODES
from toolnexus.settings import DEFAULT_URL, connection_parser

ROOT = Path(__file__).parents[1]
WORKERS = {ep.name: ep for ep in importlib.metadata.entry_points(group="toolnexus.workers")}


def broker_section(help_text: str) -> str:
    """The ``broker:`` group of a ``--help``, whitespace collapsed (wrapping differs)."""
    found = re.search(r"^broker:\n(.*?)(?:\n\n|\Z)", help_text, re.S | re.M)
    assert found is not None, help_text
    return " ".join(found.group(1).split())


def help_of(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as done:
        main([*argv, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


COMMANDS = {
    ("ask",): connection_parser(),
    ("answer",): connection_parser(),
    ("status",): connection_parser(queue=None, keys=False),
    ("check",): connection_parser(keys=False),
    ("audit",): connection_parser(keys=False),
    ("dead-letters", "list"): connection_parser(keys=False),
    ("dead-letters", "show"): connection_parser(keys=False),
    ("dead-letters", "requeue"): connection_parser(keys=False),
    ("dead-letters", "purge"): connection_parser(keys=False),
    ("demo",): connection_parser(keys=False, embedded=True, queue_default="demo"),
}


@pytest.mark.parametrize("command", list(COMMANDS), ids=" ".join)
def test_every_command_takes_the_shared_broker_flags(
    command: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    shared = broker_section(COMMANDS[command].format_help())
    assert broker_section(help_of(capsys, *command)) == shared


def test_the_command_list_is_complete() -> None:
    """Every command that takes --url is one of those checked above (keygen, acl and
    worker talk to no broker themselves)."""
    source = (ROOT / "bridge" / "toolnexus" / "cli" / "_main.py").read_text()
    assert '"--url",' not in source and '"--namespace",' not in source  # only shared ones
    assert set(re.findall(r'"(\w[\w-]*)",\n\s+parents=\[connection_parser', source)) == {
        "ask", "answer", "status", "check", "audit", "list", "show", "requeue", "purge", "demo"
    }  # fmt: skip


def test_version_prints_the_version_of_pyproject(capsys: pytest.CaptureFixture[str]) -> None:
    """``toolnexus --version``: this project's version, as pyproject.toml sets it (the
    installed metadata: a stale install fails here, reinstall with pip install -e .)."""
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert capsys.readouterr().out == f"toolnexus {version}\n"
    assert re.fullmatch(r"\d+\.\d+\.\d+", version)
    # the changelog has its section, and the last release's; the last release is older
    named = (ROOT / ".ci" / "previous-release").read_text().splitlines()
    last = next(line.split()[0] for line in named if line and not line.startswith("#"))
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert f"## {version}" in changelog and f"## {last}" in changelog
    assert tuple(map(int, last.split("."))) < tuple(map(int, version.split(".")))


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_every_worker_takes_the_shared_broker_flags(name: str) -> None:
    module = importlib.import_module(WORKERS[name].module)
    assert WORKERS[name].attr == "main"
    queue = ASKING_QUEUES.get(name, "request queue to answer")
    shared = broker_section(connection_parser(queue=queue).format_help())
    assert broker_section(module.parser().format_help()) == shared


ASKING_QUEUES = {
    "gateway": "request queue the agents' requests are published to",
    "a2a": "request queue the remote agents' questions are published to",
}
"""The workers that ask rather than answer, and what their ``--queue`` says."""


def test_the_default_url_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """connect(), the commands and the workers fall back to the same URL."""
    monkeypatch.delenv("TOOLNEXUS_URL", raising=False)
    assert toolnexus.connect().url == DEFAULT_URL
    args = connection_parser().parse_args([])
    assert args.url == DEFAULT_URL
    worker = importlib.import_module(WORKERS["auto"].module)
    assert worker.parser().parse_args(["--rules", "x"]).url == DEFAULT_URL
    monkeypatch.setenv("TOOLNEXUS_URL", "memory://")
    assert toolnexus.connect().url == "memory://"
    assert connection_parser().parse_args([]).url == "memory://"


def documented_statuses() -> dict[str, int]:
    """The exit status table of docs/reference/errors.md, by class name."""
    text = (ROOT / "docs" / "reference" / "errors.md").read_text()
    section = text.split("## Exit statuses", 1)[1]
    return {
        name: int(status)
        for name, status in re.findall(r"^\| [^`|]*`(\w+)`[^|]*\| (\d+) \|$", section, re.M)
    }


def error_tree() -> list[type[BaseException]]:
    toolnexus.mcp.McpError  # noqa: B018 (loads the lazily imported MCP errors into the tree)
    importlib.import_module("toolnexus.mcp._tasks")  # and the Tasks extension's
    importlib.import_module("toolnexus.frameworks")  # and the framework adapters'
    found: list[type[BaseException]] = []
    todo: list[type[BaseException]] = [errors.ToolnexusError]
    while todo:
        cls = todo.pop()
        if cls.__module__.split(".")[0] == "toolnexus" and cls not in found:
            found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_class_has_its_documented_exit_status() -> None:
    documented = documented_statuses()
    tree = error_tree()
    assert len(tree) >= 16
    assert {cls.__name__ for cls in tree} | {"KeyboardInterrupt"} == set(documented)
    for cls in tree:
        assert exit_code(cls) == documented[cls.__name__], cls
    assert exit_code(KeyboardInterrupt) == documented["KeyboardInterrupt"] == 130
    assert exit_code(errors.BrokerUnavailable("down")) == 3
    assert exit_code(errors.AlreadyResolved("r1", "expired")) == 1
    assert exit_code(ValueError("not ours")) == 2
    assert set(EXIT_CODES) <= {*tree, KeyboardInterrupt}


def test_failed_says_one_line_without_the_password(capsys: pytest.CaptureFixture[str]) -> None:
    url = "redis://ops:s3cret@db:6379/0"
    error = errors.BrokerUnavailable(f"cannot reach Redis at {url}:\n  refused")
    assert failed("toolnexus status", error, url) == 3
    assert capsys.readouterr().err == (
        "toolnexus status: cannot reach Redis at redis://ops:***@db:6379/0: refused\n"
    )
    assert failed("toolnexus ask", KeyboardInterrupt()) == 130
    assert capsys.readouterr().err == ""


def test_exit_statuses_are_defined_only_in_exits() -> None:
    """No command or worker keeps its own exit codes (cli, ask and the workers' options
    each did)."""
    owners = []
    for path in [*(ROOT / "bridge").rglob("*.py"), *(ROOT / "workers").rglob("*.py")]:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                names = target.elts if isinstance(target, ast.Tuple) else [target]
                if any(isinstance(n, ast.Name) and n.id.startswith("EXIT_") for n in names):
                    owners.append(path.relative_to(ROOT).as_posix())
    assert set(owners) == {"bridge/toolnexus/cli/_exits.py"}
