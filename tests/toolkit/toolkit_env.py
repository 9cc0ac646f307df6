"""The toolkit's Python (.venv-toolkit), running tests/toolkit/toolkit_side.py commands."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

SIDE = Path(__file__).with_name("toolkit_side.py")


class Toolkit:
    """The toolkit's Python interpreter, running toolkit_side.py commands."""

    def __init__(self, python: str) -> None:
        self.python = python

    def run(self, command: str, payload: Any = None) -> Any:
        out = subprocess.run(
            [self.python, "-I", str(SIDE), command],  # -I: none of this project's paths
            input=json.dumps(payload, ensure_ascii=False).encode(),
            capture_output=True,
            timeout=60,
        )
        if out.returncode != 0:
            raise AssertionError(f"toolkit_side.py {command} failed:\n{out.stderr.decode()}")
        return json.loads(out.stdout)
