"""The documentation site covers the public API and every page is reachable.

The API reference pages (docs/reference/*.md) hold one mkdocstrings directive
(``::: package.name``) per public name. A name added to a package's ``__all__`` without an
entry, or an entry whose name left ``__all__``, fails here, before ``mkdocs build`` would.
``__all__`` is read from the source (no import), so the torch package is checked without
torch.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "seqbalance"
DOCS = ROOT / "docs"

# Public packages and modules whose __all__ is the public API, by dotted name.
PUBLIC = {
    "seqbalance": SRC / "__init__.py",
    "seqbalance.costs": SRC / "costs" / "__init__.py",
    "seqbalance.partitioning": SRC / "partitioning" / "__init__.py",
    "seqbalance.planning": SRC / "planning" / "__init__.py",
    "seqbalance.torch": SRC / "torch" / "__init__.py",
    "seqbalance.workloads": SRC / "workloads.py",
    "seqbalance.compat.verl": SRC / "compat" / "verl.py",
    "seqbalance.compat.areal": SRC / "compat" / "areal.py",
    "seqbalance.compat.slime": SRC / "compat" / "slime.py",
    "seqbalance.compat.openrlhf": SRC / "compat" / "openrlhf.py",
    "seqbalance.compat.joint_verl": SRC / "compat" / "joint_verl.py",
    "seqbalance.compat.joint_areal": SRC / "compat" / "joint_areal.py",
}


def _all_of(path: Path) -> list[str]:
    """The literal ``__all__`` list of a module's source."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path} has no literal __all__")


def _directives() -> dict[str, str]:
    """Every ``::: target`` of the reference pages, with the page it is on."""
    found: dict[str, str] = {}
    for page in sorted((DOCS / "reference").glob("*.md")):
        for m in re.finditer(r"^::: *([\w.]+) *$", page.read_text(encoding="utf-8"), re.M):
            assert m.group(1) not in found, f"{m.group(1)} documented twice"
            found[m.group(1)] = page.name
    return found


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_every_public_name_has_a_reference_entry(package):
    documented = _directives()
    names = _all_of(PUBLIC[package])
    missing = [n for n in names if f"{package}.{n}" not in documented]
    assert not missing, f"add to docs/reference/: {[f'::: {package}.{n}' for n in missing]}"


def test_every_reference_entry_is_a_public_name():
    exported = {f"{pkg}.{n}" for pkg, path in PUBLIC.items() for n in _all_of(path)}
    stray = [
        target
        for target in _directives()
        if target not in exported and target not in PUBLIC  # a whole module is fine
    ]
    assert not stray, f"not in any __all__: {stray}"


def test_every_page_is_in_the_navigation():
    # mkdocs.yml lists pages as `title: path.md`; every page under docs/ must be one.
    nav = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", (ROOT / "mkdocs.yml").read_text(), re.M))
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), f"pages missing from the nav: {sorted(pages - nav)}"
    assert nav - pages == set(), f"nav entries without a page: {sorted(nav - pages)}"
