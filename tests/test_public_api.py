"""The public surface: ``__all__`` is exactly what the package exports, and sorted."""

from __future__ import annotations

import toolnexus


def test_all_lists_every_public_name_sorted() -> None:
    public = {name for name in vars(toolnexus) if not name.startswith("_")}
    modules = {name for name in public if type(getattr(toolnexus, name)).__name__ == "module"}
    assert set(toolnexus.__all__) == public - modules
    assert toolnexus.__all__ == sorted(toolnexus.__all__, key=lambda n: (not n.isupper(), n))
