"""The README's example is real: its waiter and responder run against Redis."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.redis
def test_the_readme_waiter_is_answered_by_the_readme_responder(redis_url: str) -> None:
    waiter, responder = python_blocks()[:2]
    assert "wait_for" in waiter and "responder(" in responder
    answering = subprocess.Popen(
        [sys.executable, "-c", responder], stdout=subprocess.PIPE, text=True
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", waiter], capture_output=True, text=True, timeout=30
        )
    finally:
        answering.kill()
        out, _ = answering.communicate()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "approved"
    assert "approving: Deploy to production?" in out
