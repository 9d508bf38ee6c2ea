"""Start-up switch for seqbalance's framework drop-ins: ``SEQBALANCE_PATCH=verl`` (also
``slime``, ``areal``, ``openrlhf``, comma-separated).

Imported at interpreter start-up by ``seqbalance_switch.pth`` (only when the variable is
set) and by verl as a ``verl.plugins`` entry point. It needs the standard library only and
imports neither seqbalance nor a framework: it registers an import hook, and when a
framework's balancing module finishes loading, :mod:`seqbalance.compat._hook` swaps its
functions for the drop-in's, before any module that imports them by name can bind them.
Unset, empty or ``0``: nothing is registered.
"""

# No ``from __future__ import annotations``: importing __future__ costs a tenth of this
# module's import time; the annotations that need it are strings.
import os
import sys

ENV = "SEQBALANCE_PATCH"

#: The framework modules each name patches, in the order they usually load.
MODULES = {
    "verl": ("verl.utils.seqlen_balancing",),
    "slime": ("slime.utils.seqlen_balancing", "slime.utils.flops_utils",
              "slime.utils.dp_schedule"),
    "areal": ("areal.utils.seqpack", "areal.utils.data"),
    "openrlhf": ("openrlhf.utils.seqlen_balancing", "openrlhf.trainer.ppo_utils.experience"),
}
#: Modules watched only in joint mode: framework -> (variable, modules). The variable is
#: read here (``joint``), so that the module is not watched, and nothing replaced in it,
#: otherwise.
JOINT_MODULES = {
    "verl": ("SEQBALANCE_VERL_MODE", ("verl.trainer.ppo.ray_trainer",)),
    "areal": ("SEQBALANCE_AREAL_MODE", ("areal.infra.controller.train_controller",)),
}
OFF = ("", "0", "off", "none", "false")


def modules(framework: str) -> "tuple[str, ...]":
    """The modules the switch patches for ``framework`` in this environment."""
    extra = JOINT_MODULES.get(framework)
    if extra and os.environ.get(extra[0], "").strip().lower() == "joint":
        return MODULES[framework] + extra[1]
    return MODULES[framework]
#: The line of ``seqbalance_switch.pth`` (site-packages): the variable is read before
#: anything is imported, so an unset switch costs one dictionary lookup at start-up.
PTH_LINE = (
    'import os; os.environ.get("SEQBALANCE_PATCH", "").strip() '
    'and __import__("_seqbalance_switch")'
)


def parse(value: "str | None") -> "tuple[list[str], list[str]]":
    """The framework names in ``value`` (known ones, in order, once each) and the unknown
    ones. Case and spaces are ignored; unset, empty, ``0``, ``off``, ``none`` or ``false``
    mean none."""
    names = [] if value is None else [v.strip().lower() for v in value.split(",")]
    names = [v for v in dict.fromkeys(names) if v not in OFF]
    return [v for v in names if v in MODULES], [v for v in names if v not in MODULES]


def unknown_message(unknown: "list[str]") -> str:
    return (
        f"{ENV} names unknown frameworks {unknown}; valid values are "
        f"{', '.join(MODULES)} (comma-separated), or unset/0 for none"
    )


class _Finder:
    """A ``sys.meta_path`` entry that finds nothing itself: for a target module it asks the
    other finders for the spec and wraps its loader, so that the drop-in is put in place
    right after the module's own code has run."""

    def __init__(self) -> None:
        self.targets: dict[str, str] = {}  # module name -> framework name

    def find_spec(self, name: str, path: object = None, target: object = None) -> object:
        if name not in self.targets:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader, self.targets[name])
        return spec


class _Loader:
    """The framework module's own loader, followed by the patch."""

    def __init__(self, loader: object, framework: str) -> None:
        self._loader = loader
        self._framework = framework

    def create_module(self, spec: object) -> object:
        return self._loader.create_module(spec)  # type: ignore[attr-defined]

    def exec_module(self, module: object) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        _patch(self._framework, module.__name__)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:  # get_source, get_filename, ...
        return getattr(self._loader, name)


_finder = _Finder()
#: What :func:`install` set up: framework name -> module names, and the modules patched.
installed: "dict[str, tuple[str, ...]]" = {}
patched: "list[str]" = []


def _patch(framework: str, module: str) -> None:
    from seqbalance.compat._hook import patch_module

    patched.extend(patch_module(framework, module))


def install(names: "list[str]") -> None:
    """Patch ``names``' balancing modules now where loaded, else as soon as each loads.

    Idempotent. The framework is never imported here.
    """
    for fw in names:
        if fw in installed:
            continue
        installed[fw] = modules(fw)
        for module in installed[fw]:
            if module in sys.modules:
                _patch(fw, module)
            else:
                _finder.targets[module] = fw
    if _finder.targets and _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def _from_environment() -> None:
    names, unknown = parse(os.environ.get(ENV))
    if unknown:
        # A warning, not an error: this runs at every interpreter start-up.
        sys.stderr.write(f"seqbalance: warning: {unknown_message(unknown)}\n")
    if names:
        install(names)


_from_environment()
