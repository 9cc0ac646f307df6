"""The public surface: ``__all__`` is exactly what the package exports, and sorted; the
top namespace stays small (what an agent author and a worker author need first), the rest
is in the public subpackages and contract modules (tests/test_structure.py checks them)."""

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

    code = (
        "import sys, toolnexus; print('toolnexus.mcp._client' in sys.modules); toolnexus.load_mcp"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


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


def test_the_top_namespace_is_small_and_the_rest_has_a_home() -> None:
    import toolnexus.cli
    import toolnexus.mcp
    import toolnexus.observability
    import toolnexus.redis_broker
    import toolnexus.responders
    import toolnexus.security

    assert len(toolnexus.__all__) <= 35
    homes = [
        toolnexus.cli,
        toolnexus.codec,
        toolnexus.errors,
        toolnexus.keys,
        toolnexus.mcp,
        toolnexus.models,
        toolnexus.observability,
        toolnexus.redis_broker,
        toolnexus.responders,
        toolnexus.security,
    ]
    for home in homes:
        assert home.__all__ == sorted(home.__all__, key=lambda n: (not n.isupper(), n)), home
    # the names workers render with
    assert {"approvals_line", "check_schema", "Terminal", "listen"} <= set(
        toolnexus.responders.__all__
    )
    assert {"Keys", "check_request_id"} <= set(toolnexus.keys.__all__)
    assert (
        "UNAVAILABLE" in toolnexus.models.__all__ and "Metrics" in toolnexus.observability.__all__
    )
