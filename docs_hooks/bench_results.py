"""A MkDocs hook: the performance page shows the benchmark's own report, ``bench/RESULTS.md``
and ``bench/results.png`` as ``python -m bench`` last wrote them (its date, machine and
command included), not figures copied by hand."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

PAGE = "explanation/performance.md"
MARK = "<!-- bench-results -->"
BENCH = Path(__file__).parents[1] / "bench"


def on_files(files: Files, config: Any) -> Files:
    image = File.generated(
        config, "explanation/results.png", abs_src_path=str(BENCH / "results.png")
    )
    files.append(image)
    return files


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    report = (BENCH / "RESULTS.md").read_text()
    report = report.split("\n", 1)[1]  # its title: the page has one
    report = re.sub(r"^(#+) ", r"#\1 ", report, flags=re.M)  # under the page's section
    return markdown.replace(MARK, report)
