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
    "workloads": 1,  # seeded data sets, beside the costs
    "costs": 1,
    "partitioning": 1,
    "planning": 2,
    "cli": 3,
    "torch": 3,
    "compat": 3,
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
