"""The package's shape (issue #32): no import cycle, no private name of one module used by
another, workers on public names only, and the old paths still working for one release.

Each rule is a function over ``{module: source}``, run on the real tree and, to show it
can fail, on a snippet that breaks it.
"""

from __future__ import annotations

import ast
import functools
import importlib
import sys
import types
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

import toolnexus
from toolnexus import _compat

ROOT = Path(__file__).resolve().parent.parent
BRIDGE = ROOT / "bridge"
WORKERS = ROOT / "workers"

PUBLIC_MODULES = (
    "toolnexus",
    "toolnexus.models",
    "toolnexus.codec",
    "toolnexus.errors",
    "toolnexus.keys",
    "toolnexus.lifecycle",
    "toolnexus.settings",
    "toolnexus.redis_broker",
    "toolnexus.mcp",
    "toolnexus.security",
    "toolnexus.responders",
    "toolnexus.rendering",
    "toolnexus.frameworks",
    "toolnexus.cli",
    "toolnexus.observability",
    "toolnexus.frameworks",
    "toolnexus.frameworks.a2a",
)
"""The namespaces with an ``__all__``: a worker imports only what they list."""


def sources(root: Path, package: str) -> dict[str, str]:
    """``{module: source}`` of every module of ``package`` under ``root``."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts[-1:] = []
        out[".".join(parts)] = path.read_text()
    return out


@functools.cache
def parsed(source: str) -> ast.Module:
    """``source`` parsed, once: the rules only read the trees."""
    return ast.parse(source)


PACKAGE = sources(BRIDGE, "toolnexus")
WORKER_SOURCES = sources(WORKERS, "toolnexus_workers")
for _source in (*PACKAGE.values(), *WORKER_SOURCES.values()):
    parsed(_source)  # at collection, before any test: no other test's garbage is collected inside


def package_of(module: str, packages: set[str]) -> str:
    return module if module in packages else module.rpartition(".")[0]


def absolute(module: str, node: ast.ImportFrom, packages: set[str]) -> str:
    if not node.level:
        return node.module or ""
    base = package_of(module, packages).split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run when the module is imported: not in functions or classes, not
    under ``if TYPE_CHECKING``."""
    for node in body:
        if isinstance(node, ast.If):
            if not is_type_checking(node.test):
                yield from module_level(node.body)
            yield from module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from module_level(block)
            for handler in node.handlers:
                yield from module_level(handler.body)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            yield from module_level(node.body)
        else:
            yield node


def ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_at_import_time(modules: Mapping[str, str]) -> dict[str, set[str]]:
    """Which modules of ``modules`` each one imports when it is imported (importing
    ``a.b.c`` runs ``a`` and ``a.b`` first, unless they are the importer's own parents)."""
    packages = {
        m for m in modules if m == "toolnexus" or any(k.startswith(m + ".") for k in modules)
    }
    graph: dict[str, set[str]] = {}
    for module, source in modules.items():
        edges: set[str] = set()
        own = set(ancestors(module))
        for node in module_level(parsed(source).body):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = absolute(module, node, packages)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.append(sub if sub in modules else base)
            for target in targets:
                if target not in modules:
                    continue
                edges.add(target)
                edges.update(a for a in ancestors(target) if a not in own and a in modules)
        edges.discard(module)
        graph[module] = edges
    return graph


def cycles(modules: Mapping[str, str]) -> list[list[str]]:
    """The import cycles among ``modules`` (strongly connected components, Tarjan)."""
    graph = imports_at_import_time(modules)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(modules: Mapping[str, str]) -> list[str]:
    """Private names (``_x``) one module takes from another: imported, or read as an
    attribute of an imported module. Private *modules* are the package's implementation:
    any module of the package may import their public names (workers may not: see
    :func:`non_public_imports`)."""
    packages = {
        m for m in modules if m == "toolnexus" or any(k.startswith(m + ".") for k in modules)
    }
    problems = []
    for module, source in modules.items():
        tree = parsed(source)
        aliases: dict[str, str] = {}  # local name -> imported toolnexus module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("toolnexus"):
                        aliases[alias.asname or alias.name.split(".")[0]] = alias.name
            elif isinstance(node, ast.ImportFrom):
                base = absolute(module, node, packages)
                if not base.startswith("toolnexus"):
                    continue
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        aliases[alias.asname or alias.name] = sub
                    elif is_private(alias.name):
                        problems.append(f"{module} imports {alias.name} from {base}")
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and is_private(node.attr)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and f"{aliases[node.value.id]}.{node.attr}" not in modules
            ):
                problems.append(f"{module} reads {aliases[node.value.id]}.{node.attr}")
    return problems


def public_names() -> dict[str, set[str]]:
    names = {}
    for module in PUBLIC_MODULES:
        try:
            names[module] = set(importlib.import_module(module).__all__)
        except ModuleNotFoundError:
            continue  # a contract module not written yet
    return names


def non_public_imports(modules: Mapping[str, str], public: Mapping[str, set[str]]) -> list[str]:
    """Every ``toolnexus`` name a module of ``modules`` imports that no public namespace
    lists in its ``__all__``."""
    problems = []
    for module, source in modules.items():
        tree = parsed(source)
        plain = False
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "toolnexus" and not alias.asname:
                        plain = True
                    elif alias.name.startswith("toolnexus.") and alias.name not in public:
                        problems.append(f"{module} imports {alias.name}")
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                if node.module != "toolnexus" and not node.module.startswith("toolnexus."):
                    continue
                exported = public.get(node.module)
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    if exported is None or (alias.name not in exported and sub not in public):
                        problems.append(f"{module} imports {alias.name} from {node.module}")
        if plain:
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name)
                    and node.value.id == "toolnexus"
                    and node.attr not in public["toolnexus"]
                    and f"toolnexus.{node.attr}" not in public
                ):
                    problems.append(f"{module} uses toolnexus.{node.attr}")
    return problems


# --- the rules on the real tree ---------------------------------------------------------------


def test_no_import_cycle_in_the_package() -> None:
    assert cycles(PACKAGE) == []


def test_no_module_uses_another_modules_private_names() -> None:
    assert private_uses(PACKAGE) == []


def test_workers_import_only_public_names() -> None:
    assert len(WORKER_SOURCES) > 10
    assert non_public_imports(WORKER_SOURCES, public_names()) == []


def test_every_public_namespace_lists_only_names_it_has() -> None:
    for module, names in public_names().items():
        namespace = importlib.import_module(module)
        assert names == set(dir(namespace)) & names, module
        assert not any(is_private(n) for n in names), module


@pytest.mark.parametrize("old", sorted(_compat.OLD_MODULES))
def test_an_old_module_path_warns_and_still_resolves(old: str) -> None:
    assert deprecated_path_problems(old, _compat.OLD_MODULES[old]) == []


@pytest.mark.parametrize("name", sorted(_compat.MOVED_NAMES))
def test_a_name_gone_from_the_top_warns_and_still_resolves(name: str) -> None:
    home = importlib.import_module(_compat.MOVED_NAMES[name])
    assert name not in toolnexus.__all__ and name in home.__all__
    with pytest.warns(DeprecationWarning, match=f"toolnexus.{name} is deprecated") as caught:
        value = getattr(toolnexus, name)
    assert value is getattr(home, name)
    assert caught[0].filename == __file__  # the warning points at the line using the name


def test_importing_an_old_path_leaves_the_function_of_the_same_name() -> None:
    for name in ("serve", "question"):
        function = getattr(toolnexus, name)
        old = f"toolnexus.{name}"
        assert deprecated_path_problems(old, _compat.OLD_MODULES[old]) == []
        assert getattr(toolnexus, name) is function and callable(function)


def test_the_moved_packages_forward_their_old_names_with_a_warning() -> None:
    import toolnexus.cli
    import toolnexus.redis_broker

    with pytest.warns(DeprecationWarning, match="toolnexus.redis_broker.boundary"):
        boundary = toolnexus.redis_broker.boundary  # type: ignore[attr-defined]
    assert callable(boundary)
    with pytest.raises(AttributeError):
        toolnexus.cli.no_such_name  # type: ignore[attr-defined]  # noqa: B018


def deprecated_path_problems(old: str, new: str) -> list[str]:
    """What is wrong with the old path ``old`` of ``new``: it must import, warn, and be
    the new module itself."""
    saved = sys.modules.pop(old, None)
    parent, _, leaf = old.rpartition(".")
    problems = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = importlib.import_module(old)
        if not any(
            issubclass(w.category, DeprecationWarning) and old in str(w.message) for w in caught
        ):
            problems.append(f"importing {old} does not warn")
        if module is not importlib.import_module(new):
            problems.append(f"{old} is not {new}")
    except ImportError:
        problems.append(f"cannot import {old}")
    finally:
        sys.modules.pop(old, None)
        if saved is not None:
            sys.modules[old] = saved
        elif isinstance(vars(sys.modules[parent]).get(leaf), types.ModuleType):
            delattr(sys.modules[parent], leaf)  # as before the import
    return problems


# --- each rule can fail -----------------------------------------------------------------------


def test_a_cycle_is_found() -> None:
    snippet = {
        "toolnexus": "",
        "toolnexus.a": "from .b import x\n",
        "toolnexus.b": "from . import c\n",
        "toolnexus.c": "import toolnexus.a\n",
        "toolnexus.d": "import typing\nif typing.TYPE_CHECKING:\n    from .a import y\n",
    }
    assert cycles(snippet) == [["toolnexus.a", "toolnexus.b", "toolnexus.c"]]
    # under TYPE_CHECKING or in a function, an import is no cycle
    snippet["toolnexus.c"] = "def f():\n    import toolnexus.a\n"
    assert cycles(snippet) == []


def test_a_package_init_importing_back_is_a_cycle() -> None:
    snippet = {
        "toolnexus": "",
        "toolnexus.p": "from ._impl import X\n",
        "toolnexus.p._impl": "X = 1\n",
        "toolnexus.q": "from .p._impl import X\n",
    }
    assert cycles(snippet) == []
    snippet["toolnexus.p._impl"] = "from ..q import Y\n"
    assert cycles(snippet) == [["toolnexus.p", "toolnexus.p._impl", "toolnexus.q"]]


def test_a_private_name_used_across_modules_is_found() -> None:
    snippet = {
        "toolnexus": "",
        "toolnexus.a": "from .b import _secret\nfrom . import b\nb._other()\n",
        "toolnexus.b": "def _secret(): ...\ndef _other(): ...\n",
        "toolnexus.p": "from ._impl import X\n",
        "toolnexus.p._impl": "from .. import b\nX = b._secret\n",
        "toolnexus.q": "from .p._impl import X\nfrom .p import _impl\n",
    }
    assert private_uses(snippet) == [
        "toolnexus.a imports _secret from toolnexus.b",
        "toolnexus.a reads toolnexus.b._other",
        "toolnexus.p._impl reads toolnexus.b._secret",
    ]


def test_a_worker_importing_a_private_name_is_found() -> None:
    public = {"toolnexus": {"Broker"}, "toolnexus.responders": {"approvals_line"}}
    worker = {
        "w": (
            "import toolnexus\n"
            "from toolnexus import Broker\n"
            "from toolnexus.responders import approvals_line\n"
            "from toolnexus.responders._serve import Worker\n"
            "from toolnexus import Keys\n"
            "toolnexus.Broker, toolnexus.metrics\n"
        )
    }
    assert non_public_imports(worker, public) == [
        "w imports Worker from toolnexus.responders._serve",
        "w imports Keys from toolnexus",
        "w uses toolnexus.metrics",
    ]


def test_a_path_that_does_not_resolve_is_found() -> None:
    assert deprecated_path_problems("toolnexus.hops", "toolnexus.codec") == [
        "toolnexus.hops is not toolnexus.codec"
    ]
    assert deprecated_path_problems("toolnexus.no_such_module", "toolnexus.codec") == [
        "cannot import toolnexus.no_such_module"
    ]
