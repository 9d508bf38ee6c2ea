"""The package layers import downwards only (DESIGN.md, "The three layers").

Every ``import`` in ``src/seqbalance``, including the lazy ones inside functions, is resolved
to the module it names and checked against the layer table below. A module may import from a
lower layer or from its own package; costs and partitioning sit side by side and know nothing
of each other; integrations (cli, torch, compat) may use each other and the facade.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import seqbalance

ROOT = Path(seqbalance.__file__).parent

# package (or module) under seqbalance -> layer; higher numbers sit on top.
LAYERS = {
    "_validate": 0,
    "_notes": -1,  # notes and messages as data: below _validate, whose errors carry them
    "workloads": 1,  # seeded data sets, beside the costs
    "costs": 1,
    "partitioning": 1,
    "planning": 2,
    "cli": 3,
    "torch": 3,
    "compat": 3,
    "streaming": 3,  # streaming plans, on top of plan()
    "": 3,  # the facade: seqbalance/__init__.py and __main__.py
}


def _unit(module: str) -> str:
    """The layer unit of a dotted module name under seqbalance ('' for the facade)."""
    parts = module.split(".")
    assert parts[0] == "seqbalance", module
    if len(parts) == 1 or parts[1] in ("__init__", "__main__"):
        return ""
    return parts[1]


def _module_name(path: Path, root: Path = ROOT) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, absolute module) for every seqbalance import in the file."""
    name = _module_name(path, root)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
            found += [(node.lineno, n) for n in names if n.split(".")[0] == "seqbalance"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "seqbalance":
                continue
            if node.module is None or target == "seqbalance":
                # `from . import x` / `from seqbalance import x`: x may be a submodule.
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def upward_imports(root: Path = ROOT) -> list[str]:
    """Every import that points up or sideways across the layer table, as readable lines."""
    bad = []
    for path in sorted(root.rglob("*.py")):
        src_unit = _unit(_module_name(path, root))
        for line, target in _imports(path, root):
            dst_unit = _unit(target)
            if dst_unit not in LAYERS:  # e.g. `from seqbalance import __version__`
                dst_unit = ""
            if dst_unit == src_unit:
                continue
            src_layer, dst_layer = LAYERS[src_unit], LAYERS[dst_unit]
            if dst_layer < src_layer or (src_layer == dst_layer == 3):
                continue
            bad.append(f"{path.relative_to(root.parent)}:{line} imports {target}")
    return bad


def test_every_module_has_a_layer():
    units = {_unit(_module_name(p)) for p in ROOT.rglob("*.py")}
    assert units <= set(LAYERS), f"add {sorted(units - set(LAYERS))} to LAYERS"


def test_imports_point_down_only():
    bad = upward_imports()
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_check_catches_an_upward_import(tmp_path):
    # A copy of the tree with one planted upward import must be reported.
    import shutil

    tree = tmp_path / "seqbalance"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    stats = tree / "partitioning" / "stats.py"
    stats.write_text(stats.read_text() + "\n\ndef _f():\n    from ..planning import plan\n")
    assert upward_imports(tree) == [
        f"seqbalance/partitioning/stats.py:{len(stats.read_text().splitlines())} "
        "imports seqbalance.planning"
    ]


@pytest.mark.parametrize(
    ("package", "sibling"), [("costs", "partitioning"), ("partitioning", "costs")]
)
def test_siblings_do_not_import_each_other(package, sibling):
    for path in (ROOT / package).rglob("*.py"):
        assert all(_unit(t) != sibling for _, t in _imports(path)), path


# ---- no import circles inside a package ---------------------------------------------------


def _runtime_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """:func:`_imports` less those under ``if TYPE_CHECKING:`` (read by type checkers
    only, never run). Lazy imports inside functions count: an import moved into a function
    "to avoid a cycle" is still a cycle of the design."""
    tree = ast.parse(path.read_text(), str(path))
    typing_only = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    lines = {
        n.lineno for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) in typing_only
    }  # fmt: skip
    return [(line, target) for line, target in _imports(path, root) if line not in lines]


def import_graph(root: Path = ROOT) -> dict[str, dict[str, int]]:
    """module -> {module of the same package it imports: first line}, for every module.

    A target is resolved to the deepest module that exists (``from .plans import Plan`` is
    ``...plans``); a package's ``__init__`` is left out as a source (it gathers its
    modules' names) but kept as a target.
    """
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for name, path in sorted(modules.items()):
        if path.name == "__init__.py":
            continue
        package = name.rsplit(".", 1)[0]
        edges = graph.setdefault(name, {})
        for line, target in _runtime_imports(path, root):
            while target not in modules and "." in target:
                target = target.rsplit(".", 1)[0]
            inside = target == package or target.rsplit(".", 1)[0] == package
            if inside and target != name:
                edges.setdefault(target, line)
    return graph


def import_cycles(root: Path = ROOT) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    graph = import_graph(root)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
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
    return sorted(found)


def _describe(cycle: list[str], root: Path = ROOT) -> str:
    graph = import_graph(root)
    edges = [f"  {a} -> {b} (line {graph[a][b]})" for a in cycle for b in graph[a] if b in cycle]
    return "\n".join([" <-> ".join(cycle), *edges])


#: Circles still to break, each a set of modules; the test fails when a new one appears and
#: when one listed here is gone (then delete it from this list).
KNOWN_CYCLES: list[list[str]] = []


def test_no_import_circles_inside_a_package():
    cycles = import_cycles()
    new = [c for c in cycles if c not in KNOWN_CYCLES]
    assert not new, "import circles:\n" + "\n".join(_describe(c) for c in new)
    gone = [c for c in KNOWN_CYCLES if c not in cycles]
    assert not gone, f"no longer circles, delete from KNOWN_CYCLES: {gone}"


def test_the_circle_check_catches_a_lazy_import(tmp_path):
    import shutil

    tree = tmp_path / "seqbalance"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns("__pycache__"))
    request = tree / "planning" / "request.py"
    request.write_text(request.read_text() + "\n\ndef _f():\n    from .planner import plan\n")
    cycles = import_cycles(tree)
    assert any("seqbalance.planning.request" in c for c in cycles)
    # a typing-only import is not a circle
    request.write_text(
        request.read_text().replace(
            "def _f():\n    from .planner import plan\n",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .planner import plan\n",
        )
    )
    assert not any("seqbalance.planning.request" in c for c in import_cycles(tree))
