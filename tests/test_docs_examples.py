"""Every Python and shell example of the README and the manual (docs/**/*.md) is run or checked,
so that a renamed function, argument or flag fails a test.

Each ``python`` or ``sh`` block is followed by a comment saying how it is tested:

- ``<!-- run -->``: a complete Python program or shell script, run here (it must exit 0
  within a minute, writing nothing to stderr: a warning on a page's own example teaches
  readers to ignore warnings); ``<!-- run, printing: TEXT -->``: and TEXT is the last line
  it prints; either may end ``; stderr: TEXT``: what it writes to stderr is expected, and
  contains TEXT (the page says why);
- ``<!-- test: tests/FILE.py::NAME -->``: a named test runs it, with its own assertions (the
  test must exist and read this page);
- ``<!-- not run: REASON -->``: not run, and why (a fragment, a third party's service, ...).

Whatever the marker, every block is also checked against the code: in Python, every name taken
from ``toolnexus`` exists and every call to one of its functions, classes or methods (on a
broker or a pending request) binds its arguments to the signature; in a shell block, every
``toolnexus`` command exists and every ``--option`` it is given is one its ``--help`` lists.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import toolnexus

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(r"^```(python|sh)\n(.*?)^```\n(?:[ \t]*\n)*(?:<!-- (.*?) -->)?", re.S | re.M)
# What an example's free names stand for, when a fragment uses them without binding them.
KNOWN = {"toolnexus": toolnexus, "broker": toolnexus.Broker, "pending": toolnexus.Pending}


@dataclass(frozen=True)
class Example:
    page: str  # relative to the repository
    line: int
    language: str
    code: str
    marker: str | None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in PAGES:
        text = path.read_text()
        for match in BLOCK.finditer(text):
            found.append(
                Example(
                    page=str(path.relative_to(ROOT)),
                    line=text.count("\n", 0, match.start()) + 1,
                    language=match.group(1),
                    code=match.group(2),
                    marker=match.group(3),
                )
            )
    return found


EXAMPLES = examples()
PYTHON = [e for e in EXAMPLES if e.language == "python"]
SHELL = [e for e in EXAMPLES if e.language == "sh"]
RUN = [e for e in EXAMPLES if e.marker is not None and re.match(r"run\b", e.marker)]


def test_the_pages_have_examples_and_each_says_how_it_is_tested() -> None:
    assert len(PYTHON) >= 20 and len(SHELL) >= 15, (len(PYTHON), len(SHELL))
    unmarked = [str(e) for e in EXAMPLES if e.marker is None]
    assert not unmarked, "examples with no <!-- run | test: ... | not run: ... --> after them"
    for example in EXAMPLES:
        assert example.marker is not None
        marker = example.marker
        if re.fullmatch(r"run(, printing: .+?)?(; stderr: .+)?", marker):
            continue
        if marker.startswith("test: "):
            file, _, name = marker.removeprefix("test: ").partition("::")
            source = (ROOT / file).read_text() if (ROOT / file).is_file() else ""
            assert f"def {name}(" in source, f"{example}: {marker} names no test"
            assert Path(example.page).name in source, f"{example}: {file} does not read it"
        else:
            reason = marker.removeprefix("not run: ")
            assert marker.startswith("not run: ") and len(reason) >= 15, (
                f"{example}: the marker {marker!r} is none of run, test: or not run: REASON"
            )
            for cited in re.findall(r"tests/[\w/]+\.py", reason):
                assert (ROOT / cited).is_file(), f"{example}: {cited} does not exist"


@pytest.mark.slow
@pytest.mark.parametrize("example", RUN, ids=str)
def test_a_runnable_example_runs(example: Example, tmp_path: Path) -> None:
    program = [sys.executable, "-c"] if example.language == "python" else ["bash", "-euc"]
    path = os.pathsep.join([str(ROOT / "bridge"), str(ROOT / "workers")])
    done = subprocess.run(  # in a scratch directory, with this environment's toolnexus first
        [*program, example.code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": path,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
        },
    )
    assert done.returncode == 0, f"{example}:\n{done.stderr}"
    assert example.marker is not None
    marker, _, expected = example.marker.partition("; stderr: ")
    if expected:
        assert expected in done.stderr, f"{example}: {expected!r} is not on stderr:\n{done.stderr}"
    else:
        assert done.stderr == "", f"{example} wrote to stderr:\n{done.stderr}"
    if marker.startswith("run, printing: "):
        assert done.stdout.strip().splitlines()[-1] == marker.split(": ", 1)[1]


# Python: names and calls checked against the code.


def resolve(node: ast.expr, names: dict[str, Any]) -> Any:
    """The object an expression of names and attributes stands for, or None when it is
    not rooted in toolnexus; an attribute toolnexus does not have raises AttributeError."""
    if isinstance(node, ast.Name):
        return names.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = resolve(node.value, names)
        if owner is None:
            return None
        if isinstance(owner, type) and not hasattr(owner, node.attr):
            declared = [vars(c).get("__annotations__", {}) for c in owner.__mro__]
            declared += [getattr(c, "__slots__", ()) for c in owner.__mro__]
            if any(node.attr in d for d in declared):
                return None  # an instance's attribute: its type is not followed
        return getattr(owner, node.attr)
    return None


def signature_of(target: Any) -> inspect.Signature | None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    parameters = list(signature.parameters.values())
    if inspect.isfunction(target) and parameters and parameters[0].name == "self":
        signature = signature.replace(parameters=parameters[1:])  # a method of a known type
    return signature


def check_python(code: str) -> list[str]:
    tree = compile(code, "<example>", "exec", ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    names: dict[str, Any] = dict(KNOWN)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "toolnexus":
                    names[alias.asname or alias.name.split(".")[0]] = importlib.import_module(
                        alias.name.split(".")[0]
                    )
                    importlib.import_module(alias.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("toolnexus"):
            try:
                module = importlib.import_module(node.module or "")
            except toolnexus.ConfigurationError:  # an extra this environment cannot hold
                return []  # (google-adk): the block's own test runs it where it is installed
            for alias in node.names:
                if not hasattr(module, alias.name):
                    problems.append(f"{node.module} has no {alias.name}")
                else:
                    names[alias.asname or alias.name] = getattr(module, alias.name)
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            call = node.context_expr
            if isinstance(call, ast.Call) and resolve(call.func, names) is toolnexus.connect:
                names[node.optional_vars.id] = toolnexus.Broker
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            try:
                resolve(node, names)
            except AttributeError as exc:
                problems.append(str(exc))
        if not isinstance(node, ast.Call):
            continue
        try:
            target = resolve(node.func, names)
        except AttributeError:
            continue  # reported above
        if not callable(target) or (
            isinstance(node.func, ast.Name) and target is KNOWN.get(node.func.id)
        ):
            continue
        signature = signature_of(target)
        starred = any(isinstance(a, ast.Starred) for a in node.args)
        keywords = {k.arg: None for k in node.keywords if k.arg is not None}
        if signature is None or starred:
            continue
        try:
            signature.bind_partial(*[None] * len(node.args), **keywords)
        except TypeError as exc:
            problems.append(f"{ast.unparse(node.func)}(...): {exc}")
    return problems


@pytest.mark.parametrize("example", PYTHON, ids=str)
def test_a_python_example_uses_only_what_toolnexus_has(example: Example) -> None:
    assert not check_python(example.code), f"{example}: {check_python(example.code)}"


def test_the_python_check_finds_a_renamed_argument_and_a_missing_name() -> None:
    assert not check_python("await broker.wait_for(request, timeout_s=5)")
    assert check_python("await broker.wait_for(request, timeout=5)")
    assert check_python("from toolnexus import Requests")
    assert check_python("import toolnexus\ntoolnexus.conect('memory://')")
    assert check_python("async with toolnexus.connect() as b:\n    await b.wait_for(r, allowed=[])")
    assert check_python("await pending.accept(persons='x')")


# Shell: every toolnexus command and option checked against the parsers.


@cache
def help_of(command: tuple[str, ...]) -> str:
    """``toolnexus COMMAND --help`` (exit 0: the command exists)."""
    path = os.pathsep.join([str(ROOT / "bridge"), str(ROOT / "workers")])
    done = subprocess.run(
        [sys.executable, "-m", "toolnexus.cli", *command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "200"},
    )
    assert done.returncode == 0, f"toolnexus {' '.join(command)} --help: {done.stderr}"
    return done.stdout


def commands(code: str) -> list[list[str]]:
    """The toolnexus command lines of a shell block, as argument lists (after the program
    name), up to the first operator (``&&``, ``|``, ``;``)."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] != ["toolnexus"]:
            continue
        cut = [i for i, w in enumerate(words) if w in {"&&", "||", "|", ";", ">", "2>"}]
        found.append(words[1 : cut[0] if cut else None])
    return found


def check_shell(code: str, help_text: Callable[[tuple[str, ...]], str] = help_of) -> list[str]:
    problems = []
    for words in commands(code):
        command = tuple(words[:2]) if words[:1] == ["worker"] else tuple(words[:1])
        text = help_text(command)
        for word in words:
            option = word.split("=", 1)[0]
            if option.startswith("--") and not re.search(rf"(?<![\w-]){re.escape(option)}\b", text):
                problems.append(f"toolnexus {' '.join(command)} has no option {option}")
    return problems


@pytest.mark.parametrize("example", SHELL, ids=str)
@pytest.mark.slow
def test_a_shell_example_uses_only_commands_and_options_that_exist(example: Example) -> None:
    assert not check_shell(example.code), f"{example}: {check_shell(example.code)}"


@pytest.mark.slow
def test_the_shell_check_finds_a_renamed_option() -> None:
    assert not check_shell('toolnexus ask "Ship?" --timeout 10m && ./deploy.sh')
    assert check_shell('toolnexus ask "Ship?" --timeout-s 10m')
    assert check_shell("toolnexus worker web --tokens x")
    with pytest.raises(AssertionError, match="--help"):
        check_shell("toolnexus wait --id x")


def test_the_readme_links_to_files_that_exist() -> None:
    """The README is shown outside the site too (a forge, the package index): its links are
    to files of the repository, and each exists (mkdocs build --strict checks the pages')."""
    links = re.findall(r"\]\(([^)]+)\)", (ROOT / "README.md").read_text())
    local = [link.split("#")[0] for link in links if "://" not in link]
    assert len(local) > 20
    assert not [link for link in local if not (ROOT / link).is_file()]


def test_no_page_cites_the_projects_internal_documents() -> None:
    """Users read of features, not of the specification's sections (the API reference's
    docstrings are cleaned by docs_hooks/no_spec.py as the site is built)."""
    citing = [str(p.relative_to(ROOT)) for p in PAGES if "SPEC §" in p.read_text()]
    assert not citing
    assert (ROOT / "workers" / "README.md").read_text().count("SPEC") == 0


def test_the_environment_reference_names_every_variable_the_code_reads() -> None:
    variable = re.compile(r"\b(?:TOOLNEXUS|SLACK|TELEGRAM)_[A-Z_]*[A-Z]\b")
    read = {
        name
        for folder in ("bridge", "workers")
        for path in (ROOT / folder).rglob("*.py")
        for name in variable.findall(path.read_text())
    }
    table = (ROOT / "docs" / "reference" / "environment.md").read_text()
    documented = set(variable.findall(table.split("| variable |", 1)[1]))
    assert len(read) > 20
    assert read == documented, (read - documented, documented - read)
