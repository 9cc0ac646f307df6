"""The toolkit set: this project beside the toolkit's own package (`toolnexus` 0.21.0 from the
package index, in .venv-toolkit). Both import as ``toolnexus``, so the toolkit never runs in
this process: its Python runs tests/toolkit/toolkit_side.py, and the one module of it with no
dependencies (``toolnexus.types``: its Request and Answer dataclasses) is loaded here from its
file under another name. ``./run test-toolkit`` makes the environment and runs this set."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest
from toolkit_env import Toolkit

ROOT = Path(__file__).resolve().parents[2]
TOOLKIT_VERSION = "0.21.0"


@pytest.fixture(scope="session")
def toolkit() -> Toolkit:
    python = os.environ.get("TOOLNEXUS_TOOLKIT_PYTHON") or str(ROOT / ".venv-toolkit/bin/python")
    if not Path(python).exists():
        pytest.fail(f"no toolkit environment at {python}: ./run test-toolkit makes it")
    found = Toolkit(python)
    version = found.run("where")["version"]
    assert version == TOOLKIT_VERSION, f"the toolkit environment has toolnexus {version}"
    return found


@pytest.fixture(scope="session")
def toolkit_types(toolkit: Toolkit) -> ModuleType:
    """The toolkit's ``toolnexus.types`` (stdlib only), loaded as ``toolkit_types``."""
    path = toolkit.run("where")["types"]
    spec = importlib.util.spec_from_file_location("toolkit_types", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["toolkit_types"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module
