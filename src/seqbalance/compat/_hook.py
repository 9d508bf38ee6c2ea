"""What the start-up switch (``SEQBALANCE_PATCH``, module ``_seqbalance_switch``) does once
a framework module has loaded, and what ``python -m seqbalance.compat --check`` reports.

The switch itself lives in a top-level module of the standard library only, because it is
imported at every interpreter start-up where the variable is set, and by every ``import
verl`` (as a plugin) where it is not: importing seqbalance there would cost ~0.3 s a
process. This module is imported only when a framework module named by the variable loads.
"""

from __future__ import annotations

import importlib
from typing import Any

from ._inputs import Patcher

__all__ = ["drop_in_module", "patch_module", "patchers"]

#: seqbalance.compat module of each framework name the switch accepts.
DROP_INS = {
    "verl": "seqbalance.compat.verl",
    "slime": "seqbalance.compat.slime",
    "areal": "seqbalance.compat.areal",
    "openrlhf": "seqbalance.compat.openrlhf",
}


def drop_in_module(framework: str) -> Any:
    """The drop-in module of ``framework`` (``"verl"``, ``"slime"``, ``"areal"``,
    ``"openrlhf"``); ValueError naming the valid names otherwise."""
    if framework not in DROP_INS:
        raise ValueError(
            f"framework={framework!r} has no drop-in; valid values are {', '.join(DROP_INS)}"
        )
    return importlib.import_module(DROP_INS[framework])


#: Joint-mode module of a framework, and the variable that selects it (the same names as
#: ``_seqbalance_switch.JOINT_MODULES``, which watches the modules only joint mode patches).
JOINT = {
    "verl": ("seqbalance.compat.joint_verl", "SEQBALANCE_VERL_MODE"),
    "areal": ("seqbalance.compat.joint_areal", "SEQBALANCE_AREAL_MODE"),
}


def patchers(framework: str) -> list[Patcher]:
    """The :class:`Patcher` objects of ``framework``'s drop-in, then (where its joint-mode
    variable says ``joint``) those of its joint mode, applied after the drop-in's.

    Raises
    ------
    ValueError
        If ``framework`` has no drop-in, or its joint-mode variable holds a value other
        than ``joint`` or ``dropin``.
    """
    modules = [drop_in_module(framework)]
    if framework in JOINT:
        name, _ = JOINT[framework]
        joint = importlib.import_module(name)
        if joint.joint_requested():
            modules.append(joint)
    found: list[Patcher] = []
    for mod in modules:
        for value in vars(mod).values():
            for p in value if isinstance(value, list) else [value]:
                if isinstance(p, Patcher) and p not in found:
                    found.append(p)
    return found


def patch_module(framework: str, module: str) -> list[str]:
    """Put ``framework``'s drop-in into the loaded ``module``; the dotted names replaced.

    Called by the start-up switch right after ``module`` has run. A failure is raised as
    an ImportError of ``module`` that names the switch: with ``SEQBALANCE_PATCH`` set the
    run must not silently train on the framework's own code.
    """
    try:
        found = [p for p in patchers(framework) if p.module == module]
        if not found:
            raise ValueError(f"no drop-in replaces functions of {module}")
        done: list[str] = []
        for p in found:  # the drop-in first, joint mode on top
            done += p.patch()
        return sorted(set(done))
    except Exception as exc:
        raise ImportError(
            f"SEQBALANCE_PATCH names {framework}, but seqbalance could not replace the "
            f"functions of {module}: {type(exc).__name__}: {exc}. Unset SEQBALANCE_PATCH "
            f"to run {framework}'s own code."
        ) from exc
