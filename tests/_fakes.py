"""A fake module tree for the patch() tests (no framework is installed to patch)."""

from __future__ import annotations

import sys
import types
from typing import Any


def fake_module(monkeypatch: Any, name: str, **attrs: Any) -> types.ModuleType:
    """``sys.modules[name]``, created with its missing parents for this test only, with
    ``attrs`` set on it."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        mod_name = ".".join(parts[:i])
        if mod_name not in sys.modules:
            monkeypatch.setitem(sys.modules, mod_name, types.ModuleType(mod_name))
    mod = sys.modules[name]
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod
