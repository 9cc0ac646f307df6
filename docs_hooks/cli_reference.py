"""A MkDocs hook: the CLI reference page is the ``--help`` of every command, generated from
the argparse parsers at build time (so it cannot drift from them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"
MARK = "<!-- cli-reference -->"
COMMANDS = [
    [],
    ["ask"],
    ["answer"],
    ["status"],
    ["check"],
    ["audit"],
    ["dead-letters"],
    ["acl"],
    ["keygen"],
    ["demo"],
    ["worker"],
    ["worker", "terminal"],
    ["worker", "auto"],
    ["worker", "web"],
    ["worker", "slack"],
    ["worker", "telegram"],
    ["worker", "gateway"],
    ["worker", "a2a"],
    ["worker", "http"],
    ["worker", "webhook"],
    ["worker", "email"],
]
MODULES = {"email": "mail"}
"""Workers whose module (``toolnexus_workers.MODULE``) is not named as the worker."""
ROOT = Path(__file__).parents[1]


def help_text(command: list[str]) -> str:
    """``toolnexus COMMAND --help``, as the installed parsers print it (80 columns)."""
    path = os.pathsep.join([str(ROOT / "bridge"), str(ROOT / "workers")])
    env = {**os.environ, "COLUMNS": "88", "PYTHONPATH": path}
    run = ["-m", "toolnexus.cli", *command, "--help"]
    if command[:1] == ["worker"] and len(command) == 2:  # this tree's worker, installed or not
        module = MODULES.get(command[1], command[1])
        run = ["-c", f"from toolnexus_workers.{module} import main; main(['--help'])"]
    done = subprocess.run(
        [sys.executable, *run],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    sections = []
    for command in COMMANDS:
        name = " ".join(["toolnexus", *command])
        sections.append(f"## `{name}`\n\n```text\n{help_text(command).rstrip()}\n```\n")
    return markdown.replace(MARK, "\n".join(sections))
