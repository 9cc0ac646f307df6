"""A MkDocs hook: the CLI reference page is made from the argparse parsers of every command
at build time (so it cannot drift from them): for each command its description, its usage
and a table of its options, grouped as ``--help`` groups them."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path
from typing import Any

PAGE = "reference/cli.md"
MARK = "<!-- cli-reference -->"
WORKERS = [
    "terminal",
    "auto",
    "web",
    "slack",
    "telegram",
    "gateway",
    "a2a",
    "http",
    "webhook",
    "email",
]
MODULES = {"email": "mail"}
"""Workers whose module (``toolnexus_workers.MODULE``) is not named as the worker."""
ROOT = Path(__file__).parents[1]


def _this_tree() -> None:
    """Import this tree's packages, installed or not."""
    for folder in ("bridge", "workers"):
        path = str(ROOT / folder)
        if path not in sys.path:
            sys.path.insert(0, path)


def _cell(text: str) -> str:
    """``text`` as one Markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _option(action: argparse.Action) -> str:
    """How an option is written: ``--url URL`` (``-v``, ``--verbose``), or its positional name."""
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    metavar = ""
    if action.nargs != 0:
        choices = "{" + ",".join(map(str, action.choices)) + "}" if action.choices else None
        metavar = f" {action.metavar or choices or action.dest.upper()}"
    return ", ".join(f"`{flag}{metavar}`" for flag in action.option_strings)


def _help(action: argparse.Action, prog: str) -> str:
    """An option's help, with its ``%(default)s`` and the like filled in as ``--help`` does."""
    text = action.help or ""
    if "%" in text:
        params = {**vars(action), "prog": prog}
        if action.choices is not None:
            params["choices"] = ", ".join(map(str, action.choices))
        text = text % params
    return text


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The subcommands of ``parser`` by name (argparse has no public way to list a parser's
    actions: its ``_actions`` it is, here and below)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def section(name: str, parser: argparse.ArgumentParser) -> str:
    """One command's section: its description, its usage line, and a table of options per
    group (the usage's own option lists, which argparse wraps at the terminal's width, are
    left out: the tables say them)."""
    lines = [f"## `{name}`", ""]
    if parser.description:
        lines += [" ".join(parser.description.split()), ""]
    positionals = [
        a.metavar or a.dest
        for a in parser._actions
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction)
    ]
    commands = _subcommands(parser)
    usage = " ".join([name, *(["COMMAND"] if commands else []), *map(str, positionals)])
    lines += [f"Usage: `{usage} [options]`", ""]
    if commands:
        lines += ["| command | what it does |", "|---|---|"]
        helps = {
            choice.dest: choice.help or ""
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for choice in action._choices_actions
        }
        lines += [f"| `{command}` | {_cell(helps.get(command, ''))} |" for command in commands]
        lines.append("")
    for group in parser._action_groups:
        actions = [
            a
            for a in group._group_actions
            if a.help != argparse.SUPPRESS and not isinstance(a, argparse._SubParsersAction)
        ]
        if not actions:
            continue
        title = group.title or "options"
        lines += [f"**{title}**", "", "| option | what it does |", "|---|---|"]
        lines += [f"| {_option(a)} | {_cell(_help(a, parser.prog))} |" for a in actions]
        lines.append("")
    return "\n".join(lines)


def reference() -> str:
    """Every command's section: ``toolnexus``, its subcommands, then each worker."""
    _this_tree()
    cli = importlib.import_module("toolnexus.cli")
    top = cli.command_parser()
    sections = [section("toolnexus", top)]
    for command, sub in _subcommands(top).items():
        sections.append(section(f"toolnexus {command}", sub))
        for nested, parser in _subcommands(sub).items():
            sections.append(section(f"toolnexus {command} {nested}", parser))
    for worker in WORKERS:
        module = importlib.import_module(f"toolnexus_workers.{MODULES.get(worker, worker)}")
        sections.append(section(f"toolnexus worker {worker}", module.parser()))
    return "\n".join(sections)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    return markdown.replace(MARK, reference())
