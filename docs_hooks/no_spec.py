"""A MkDocs hook: the site speaks of features, not of the project's internal documents. The
docstrings the API reference shows still cite the project's specification ("SPEC §14"); those
citations are dropped from the rendered pages, and any that a new wording slips past fails the
build (mkdocs build --strict turns the warning into an error)."""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger("mkdocs.hooks.no_spec")
CITATIONS = [
    (re.compile(r"\s\(SPEC §\d+\)"), ""),  # "a quorum (SPEC §14), ..." -> "a quorum, ..."
    (re.compile(r", SPEC §\d+\)"), ")"),  # "(or request.durable, SPEC §14)"
    (re.compile(r"SPEC §\d+(?:; |, )"), ""),  # "(SPEC §14; of ...)"
    (re.compile(r"SPEC §\d+: "), ""),  # "SPEC §14: ``on_expiry`` is ..." (question's docstring)
]


def on_page_content(html: str, page: Any, **_: Any) -> str:
    for pattern, replacement in CITATIONS:
        html = pattern.sub(replacement, html)
    if "SPEC §" in html:
        where = html.index("SPEC §")
        log.warning("%s cites SPEC §: ...%s...", page.file.src_uri, html[where - 60 : where + 20])
    return html
