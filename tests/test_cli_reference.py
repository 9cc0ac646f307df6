"""docs/reference/cli.md's generated part (docs_hooks/cli_reference.py, issue #43): a table
of options per command, every option of every command in it, and no ``--help`` text in
code blocks cut off at the page's right edge."""

from __future__ import annotations

import argparse
import importlib.util
import re
from pathlib import Path
from types import ModuleType

from toolnexus.cli import command_parser
from toolnexus_workers import web

ROOT = Path(__file__).resolve().parents[1]


def hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "cli_reference_hook", ROOT / "docs_hooks" / "cli_reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sections(text: str) -> dict[str, str]:
    """Each section of the reference by its command, e.g. ``toolnexus ask``."""
    parts = re.split(r"^## `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {flag for action in parser._actions for flag in action.option_strings}


def test_each_command_has_a_table_of_all_its_options_and_nothing_is_clipped() -> None:
    reference = hook().reference()
    assert "```" not in reference  # --help in code blocks was cut off at the right edge
    found = sections(reference)
    commands = {
        name: parser
        for action in command_parser()._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, parser in action.choices.items()
    }
    assert set(commands) <= {name.removeprefix("toolnexus ") for name in found}
    parsers = {f"toolnexus {name}": parser for name, parser in commands.items()}
    parsers["toolnexus worker web"] = web.parser()
    for name, parser in parsers.items():
        section = found[name]
        assert "| option | what it does |" in section, name
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        for flag in options(parser):
            assert any(f"`{flag}" in row for row in rows), f"{name}: {flag} is not in a table"
    web_rows = found["toolnexus worker web"]
    assert "| `--token TOKEN` | bearer token that signs people in" in web_rows
    assert "| `--known-domain DOMAIN` | a domain to guard against look-alikes" in web_rows
    assert len(found) >= 20
