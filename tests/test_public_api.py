"""The public surface: ``__all__`` is exactly what the package exports, and sorted."""

from __future__ import annotations

import pytest

import toolnexus


def test_all_lists_every_public_name_sorted() -> None:
    public = {name for name in dir(toolnexus) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(toolnexus, name)).__name__ == "module"}
    assert set(toolnexus.__all__) == public - modules
    assert toolnexus.__all__ == sorted(toolnexus.__all__, key=lambda n: (not n.isupper(), n))


@pytest.mark.slow
def test_the_mcp_client_is_imported_only_when_used() -> None:
    import subprocess
    import sys

    code = "import sys, toolnexus; print('toolnexus.mcp_client' in sys.modules); toolnexus.load_mcp"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.slow
def test_importing_toolnexus_loads_no_mcp_sdk() -> None:
    """Neither generation's SDK (``mcp``, nor 2.x's ``mcp_types``) until a name needs it."""
    import subprocess
    import sys

    code = (
        "import sys, toolnexus; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'mcp', 'mcp_types'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
