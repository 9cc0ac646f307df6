"""The benchmark figures the site quotes are the benchmark's own (issue #33): each page that
quotes one writes ``{{ bench:NAME }}``, and docs_hooks/bench_results.py renders it from
``bench/summary.json``, which ``python -m bench`` writes beside RESULTS.md from the same run.
These tests render the pages through the hook as ``mkdocs build`` does."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File
from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH = ROOT / "bench"
PLACEHOLDER = re.compile(r"\{\{\s*bench:([\w.]+)\s*\}\}")
# Figures as the page writes them: 0.306, 14,261, 1.23×, 2026-12-01 20:08 UTC ...
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?[×%]?")


def load_hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "bench_results_hook", ROOT / "docs_hooks" / "bench_results.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


HOOK = load_hook()
SUMMARY: dict[str, str] = json.loads((BENCH / "summary.json").read_text())


def render(src: str) -> str:
    """The page's markdown after the hook, as ``mkdocs build`` hands it on."""
    config = MkDocsConfig()
    config.load_dict({"site_name": "t", "docs_dir": str(DOCS)})
    file = File(src, str(DOCS), "/tmp/site", use_directory_urls=True)
    page = Page(None, file, config)
    rendered: str = HOOK.on_page_markdown((DOCS / src).read_text(), page=page, config=config)
    return rendered


def quoting_pages() -> list[str]:
    return sorted(
        str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if PLACEHOLDER.search(p.read_text())
    )


def test_the_performance_page_quotes_only_figures_of_the_benchmark() -> None:
    """Every figure of the page's own prose (before the included report) is a placeholder,
    and after the hook each stands where it was, with the summary's value."""
    src = "explanation/performance.md"
    text = (DOCS / src).read_text()
    names = PLACEHOLDER.findall(text)
    assert len(names) >= 40, names
    for name in ("run.date", "run.machine", "run.command", "latency.p50_ms"):
        assert name in names

    rendered = render(src)
    assert "{{" not in rendered and "bench:" not in rendered
    # Rendering by hand, placeholder by placeholder, gives the hook's text: each figure is
    # the summary's, in the placeholder's place.
    expected = PLACEHOLDER.sub(lambda m: SUMMARY[m.group(1)], text)
    report = rendered[len(expected.split("<!-- bench-results -->")[0]) :]
    assert rendered.startswith(expected.split("<!-- bench-results -->")[0])
    assert f"p50 **{SUMMARY['latency.p50_ms']} ms**" in rendered
    assert f"`{SUMMARY['run.command']}`" in rendered
    # The report below the prose is of the same run as the quoted figures.
    assert SUMMARY["run.date"] in report
    assert f"{SUMMARY['throughput.serve_per_s']} round trips/s" in report

    # The prose, its placeholders taken out, holds no measured figure typed by hand: what
    # numbers are left are settings and counts of the plan, each listed here.
    prose = PLACEHOLDER.sub("", text.split("## The last run, as the benchmark wrote it")[0])
    prose = re.sub(r"`[^`]*`", "", prose)  # commands and names
    prose = re.sub(r"\]\([^)]*\)", "]", prose)  # link targets
    typed = {m.group(0).strip() for m in NUMBER.finditer(prose)}
    assert typed and typed <= PLAN_NUMBERS, sorted(typed - PLAN_NUMBERS)


# Numbers the page states that are no measurement: the target rules (5% for an internal,
# within 2× of an even share for a Cluster master), the cases' settings and full counts
# (2,000 Cluster round trips by 96 agents over 6 queues ...), defaults (15 s liveness, 20 s
# withdrawal, 8 KiB excerpt, 1 KiB prompt), the 3 masters of a Cluster.
PLAN_NUMBERS = {
    "1",
    "1,000",
    "10",
    "10,000",
    "15",
    "2,000",
    "20",
    "2×",
    "3",
    "4",
    "5%",
    "6",
    "8",
    "96",
}


@pytest.mark.parametrize("src", quoting_pages())
def test_each_quoting_page_renders_every_placeholder(src: str) -> None:
    rendered = render(src)
    assert not PLACEHOLDER.search(rendered)
    for name in PLACEHOLDER.findall((DOCS / src).read_text()):
        assert SUMMARY[name] in rendered


def test_a_figure_the_summary_lacks_fails_the_build_naming_it() -> None:
    with pytest.raises(PluginError, match=r"explanation/x\.md: \{\{ bench:latency\.p51_ms \}\}"):
        HOOK.render_figures("p50 {{ bench:latency.p51_ms }} ms", "explanation/x.md", SUMMARY)
    assert HOOK.render_figures("{{bench:run.date}}", "x.md", SUMMARY) == SUMMARY["run.date"]


def test_the_summary_is_of_the_run_the_report_and_the_data_describe() -> None:
    """summary.json, RESULTS.md and results.json are written together by one run."""
    results = json.loads((BENCH / "results.json").read_text())
    assert SUMMARY["run.date"] == results["machine"]["date"]
    assert SUMMARY["run.commit"] == results["machine"]["commit"]
    report = (BENCH / "RESULTS.md").read_text()
    assert f"- {SUMMARY['run.date']}, run took" in report
    for name in ("latency.p50_ms", "latency.signed_p50_ms", "scale.per_wait_kib"):
        assert SUMMARY[name] in report, name
    assert SUMMARY["run.command"].startswith("python -m bench")
