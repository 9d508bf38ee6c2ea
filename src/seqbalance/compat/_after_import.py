"""What the joint modes share: reading their environment variables (the mode, the cost),
and patching a framework's driver module once it has been imported (importing it from
inside the patch would load much of the framework mid-import)."""

from __future__ import annotations

import os
import sys
from typing import Any

from ._inputs import Patcher

__all__ = ["PatchOnImport", "driver_cost", "joint_mode"]


def joint_mode(env: str) -> bool:
    """Whether the variable ``env`` asks for joint mode (``joint``; ``dropin`` or unset:
    the drop-in); a ValueError naming the variable for any other value."""
    value = os.environ.get(env, "").strip().lower()
    if value not in ("", "joint", "dropin"):
        raise ValueError(f"{env}={value!r}: use 'joint' or 'dropin' (or leave it unset)")
    return value == "joint"


def driver_cost(owner: Any, env: str, model_path: Any) -> Any:
    """The cost a joint mode plans with, read once per ``owner`` (the framework's trainer
    or controller, where it is kept): the variable ``env`` (a name, path or JSON, whose
    bad value is the user's to fix, so it raises), else the model's ``config.json`` under
    ``model_path``, else None (the framework's own weighing)."""
    cached = getattr(owner, "_seqbalance_cost", False)
    if cached is not False:
        return cached
    from ..costs import load_cost

    spec = os.environ.get(env)
    cost = None
    if spec:
        cost = load_cost(spec)
    else:
        config_json = os.path.join(str(model_path), "config.json") if model_path else ""
        if config_json and os.path.isfile(config_json):
            try:
                cost = load_cost(config_json)
            except ValueError:  # an architecture the FLOPs model does not know
                cost = None
    try:
        owner._seqbalance_cost = cost
    except AttributeError:
        pass
    return cost


class _PatchingLoader:
    """Runs the module, then has the patcher patch it."""

    def __init__(self, inner: Any, patcher: Patcher) -> None:
        self.inner = inner
        self.patcher = patcher

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        self.patcher.patch()


class PatchOnImport:
    """A ``sys.meta_path`` finder for one module: found by the other finders, then patched
    by ``patcher`` once it has run."""

    def __init__(self, name: str, patcher: Patcher) -> None:
        self.name = name
        self.patcher = patcher

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != self.name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.patcher)
                return spec
        return None

    def patch(self, what: str) -> list[str]:
        """Patch the module now where it is loaded, else when it is imported; the dotted
        names replaced (``what``, with `` (on import)``, while it waits)."""
        done: list[str] = []
        if self.name in sys.modules:
            done += self.patcher.patch()
        elif self not in sys.meta_path:
            sys.meta_path.insert(0, self)
        if self in sys.meta_path and not self.patcher.active:
            done.append(f"{self.name}.{what} (on import)")
        return done

    def unpatch(self) -> None:
        """Stop waiting for the import, and undo the patch."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.patcher.unpatch()
