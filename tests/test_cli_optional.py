"""Optional dependencies of the CLI: missing (install hint) vs installed but broken."""

from __future__ import annotations

import importlib

import pytest

from seqbalance.cli import optional
from seqbalance.cli.optional import import_optional

HINT = "pip install pyarrow"


def _failing(exc: ImportError):
    def fake(name: str):
        raise exc

    return fake


def test_imports_what_is_there():
    assert import_optional("json", "testing", HINT) is importlib.import_module("json")


@pytest.mark.parametrize("exc", [
    ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow"),
    ModuleNotFoundError("No module named 'pyarrow.parquet'", name="pyarrow.parquet"),
    ModuleNotFoundError("import of pyarrow halted; None in sys.modules"),  # no name
])
def test_a_missing_package_gets_the_install_hint(monkeypatch, exc):
    monkeypatch.setattr(optional.importlib, "import_module", _failing(exc))
    with pytest.raises(ValueError, match=r"^reading x.parquet needs pyarrow; install it with: "
                                         r"pip install pyarrow$"):
        import_optional("pyarrow.parquet", "reading x.parquet", HINT)


@pytest.mark.parametrize("exc", [
    # pyarrow 26 beside numpy 1.26, matplotlib 3.9 beside numpy 1.22: installed, broken.
    ImportError("pyarrow requires NumPy 2.0 or newer, found 1.26.4"),
    # A dependency of the package is what is missing, not the package.
    ModuleNotFoundError("No module named 'kiwisolver'", name="kiwisolver"),
    # The package's own compiled core (a wheel for another Python): installed, broken.
    ModuleNotFoundError("No module named 'pyarrow.lib'", name="pyarrow.lib"),
])
def test_an_installed_package_that_does_not_import_says_why(monkeypatch, exc):
    """Both said "install it with: pip install pyarrow" although it was installed."""
    monkeypatch.setattr(optional.importlib, "import_module", _failing(exc))
    with pytest.raises(ValueError, match="installed but does not import") as info:
        import_optional("pyarrow.parquet", "reading x.parquet", HINT)
    assert str(exc) in str(info.value) and HINT not in str(info.value)


def test_the_real_sys_modules_block_reads_as_missing(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ValueError, match="needs pyarrow; install it with"):
        import_optional("pyarrow", "reading x.parquet", HINT)
