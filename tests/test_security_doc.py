"""docs/security.md and the tests it cites keep each other true: its promises S1-S11 keep
their ids, every test it names exists, and every adversarial test names the promise it
checks and the observation of issue #24 it reproduces."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).parent
DOC = (TESTS.parent / "docs" / "security.md").read_text()
CITED = re.compile(
    r"`((?:adversarial/)?test_\w+\.py)?::(test_\w+)`|`((?:adversarial/)?test_\w+\.py)`"
)
PROMISE = re.compile(r"\bS(\d+)\b")
OBSERVATION = re.compile(r"\bobs(?:ervations?)?\.?\s*\d", re.IGNORECASE)


def promises() -> list[str]:
    return re.findall(r"^\*\*(S\d+) ", DOC, flags=re.MULTILINE)


def citations() -> list[tuple[str, str | None]]:
    """Each test file the page cites, with the function named (``::name`` after a file
    cites that file's function)."""
    cited: list[tuple[str, str | None]] = []
    file = None
    for match in CITED.finditer(DOC):
        file = match.group(1) or match.group(3) or file
        assert file is not None, f"{match.group(0)} names no file before it"
        cited.append((file, match.group(2)))
    return cited


def test_the_promises_keep_their_ids() -> None:
    assert promises() == [f"S{n}" for n in range(1, 12)]


def test_every_test_function_the_page_names_exists() -> None:
    named = [(file, name) for file, name in citations() if name is not None]
    assert len(named) > 30
    missing = [
        f"{file}::{name}"
        for file, name in named
        if not (TESTS / file).exists() or f"def {name}(" not in (TESTS / file).read_text()
    ]
    assert not missing, missing


def test_every_adversarial_test_is_cited_and_names_its_promise_and_observation() -> None:
    cited = {file for file, _ in citations()}
    ids = set(promises())
    for path in sorted((TESTS / "adversarial").glob("test_*.py")):
        assert f"adversarial/{path.name}" in cited, f"docs/security.md does not cite {path}"
        module = ast.parse(path.read_text())
        shared = ast.get_docstring(module) or ""
        for node in module.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
                "test_"
            ):
                text = f"{shared}\n{ast.get_docstring(node) or ''}"
                named = {f"S{n}" for n in PROMISE.findall(text)}
                where = f"{path.name}::{node.name}"
                assert named & ids, f"{where}: its docstring names no promise S1-S11"
                assert OBSERVATION.search(text), f"{where}: its docstring names no observation"
