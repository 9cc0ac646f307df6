"""A MkDocs hook: every benchmark figure on the site is written by the benchmark, not copied
by hand. A page quotes one as ``{{ bench:NAME }}``, rendered from ``bench/summary.json`` (the
run's headline figures, its date, machine and command, as ``python -m bench`` last wrote them);
a name the summary lacks fails the build. The performance page also shows the benchmark's
own report, ``bench/RESULTS.md`` and ``bench/results.png``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files

PAGE = "explanation/performance.md"
MARK = "<!-- bench-results -->"
BENCH = Path(__file__).parents[1] / "bench"
FIGURE = re.compile(r"\{\{\s*bench:([\w.]+)\s*\}\}")


def figures() -> dict[str, str]:
    """The figures of the benchmark's last run by name (``bench/summary.json``)."""
    loaded: dict[str, str] = json.loads((BENCH / "summary.json").read_text())
    return loaded


def render_figures(markdown: str, where: str, known: dict[str, str]) -> str:
    """``markdown`` with each ``{{ bench:NAME }}`` replaced by the figure ``NAME`` of
    ``known``; a name it lacks raises, naming the placeholder and the page."""

    def figure(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in known:
            raise PluginError(
                f"{where}: {{{{ bench:{name} }}}} is not a figure of bench/summary.json "
                f"(python -m bench writes it; it has: {', '.join(sorted(known))})"
            )
        return known[name]

    return FIGURE.sub(figure, markdown)


def on_files(files: Files, config: Any) -> Files:
    image = File.generated(
        config, "explanation/results.png", abs_src_path=str(BENCH / "results.png")
    )
    files.append(image)
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    where = page.file.src_uri
    if FIGURE.search(markdown):
        markdown = render_figures(markdown, where, figures())
    if where != PAGE:
        return markdown
    report = (BENCH / "RESULTS.md").read_text()
    report = report.split("\n", 1)[1]  # its title: the page has one
    report = re.sub(r"^(#+) ", r"#\1 ", report, flags=re.M)  # under the page's section
    return markdown.replace(MARK, report)
