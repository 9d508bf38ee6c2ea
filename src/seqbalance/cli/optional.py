"""Import an optional dependency, with a message that says what to do when it fails."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["import_optional"]


def import_optional(module: str, purpose: str, install: str) -> Any:
    """``importlib.import_module(module)``, or a ValueError saying how to get it working.

    Parameters
    ----------
    module : str
        The module to import, e.g. ``"pyarrow.parquet"``.
    purpose : str
        What needs it, as the start of the message (``"reading data.parquet"``).
    install : str
        The install hint (``'pip install ".[parquet]" ... or pip install pyarrow'``).

    Raises
    ------
    ValueError
        When the package is not installed (the hint), or is installed but does not import
        (its own error, e.g. a build for another numpy, which a reinstall cannot fix by the
        hint alone).
    """
    package = module.split(".")[0]
    parts = module.split(".")
    # The module asked for or one of its parents: a module the package itself imports
    # (pyarrow.lib, its compiled core, built for another Python) means a broken install.
    wanted = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "") in wanted | {""}
        if missing:
            raise ValueError(f"{purpose} needs {package}; install it with: {install}") from None
        raise ValueError(
            f"{purpose} needs {package}, which is installed but does not import: {exc}. "
            f"Install a version that works with this environment (the error says what it "
            f"lacks)"
        ) from None
