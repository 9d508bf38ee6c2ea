"""``python -m seqbalance.compat --check``: what ``SEQBALANCE_PATCH`` would patch here.

Says which frameworks the variable names, which of them are installed (and their
versions, read from their metadata without importing them), which functions the switch
replaces in each, whether the switch is active in this process, and how it reaches new
processes: the ``seqbalance_switch.pth`` start-up hook in site-packages and verl's
``verl.plugins`` entry point. Exit status 0; 2 when the variable names an unknown
framework or a joint-mode variable (``SEQBALANCE_VERL_MODE``, ``SEQBALANCE_AREAL_MODE``)
holds an invalid value; 1 when it names frameworks but nothing installed would carry it to
new processes.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import site
import sys
from pathlib import Path
from typing import Any, TextIO

#: Distribution names on the package index, per framework name of the switch.
DISTRIBUTIONS = {"verl": "verl", "slime": "slime", "areal": "areal", "openrlhf": "openrlhf"}


def _switch() -> Any:
    # Standard library only; its import installs the hook if the variable is set, which
    # the start-up hook would already have done in this process.
    import _seqbalance_switch

    return _seqbalance_switch


def framework_version(name: str) -> tuple[str | None, str | None]:
    """(version, location) of the framework ``import name`` would load, without running it;
    (None, None) when it is not importable."""
    try:
        spec = importlib.util.find_spec(name)  # top-level: the package's code does not run
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None, None
    locations = list(spec.submodule_search_locations or [])
    where = locations[0] if locations else spec.origin
    if name == "verl":
        from ._verl_dropin import _installed_verl_version

        return _installed_verl_version(), where
    try:
        return importlib.metadata.version(DISTRIBUTIONS[name]), where
    except importlib.metadata.PackageNotFoundError:
        return "unknown (no installed metadata)", where


def pth_files() -> list[Path]:
    """``seqbalance_switch.pth`` in this interpreter's site directories."""
    dirs = list(site.getsitepackages()) if hasattr(site, "getsitepackages") else []
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    found = [Path(d, "seqbalance_switch.pth") for d in dict.fromkeys(dirs)]
    return [p for p in found if p.is_file()]


def verl_plugin() -> str | None:
    """Our ``verl.plugins`` entry point as ``name = value``, if installed metadata has it."""
    for ep in importlib.metadata.entry_points(group="verl.plugins"):
        if ep.value.split(":")[0] == "_seqbalance_switch":
            return f"{ep.name} = {ep.value}"
    return None


def verl_reads_plugins() -> bool | None:
    """Whether the verl ``import verl`` would load discovers ``verl.plugins`` entry points
    (verl 0.9.0 on); read from its ``__init__.py``, not imported. None: no verl."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return None
    return '"verl.plugins"' in Path(spec.origin).read_text(encoding="utf-8", errors="replace")


def replaced_names(framework: str) -> dict[str, list[str]]:
    """Per framework module, the names the drop-in replaces where the module has them."""
    from ._hook import patchers

    out: dict[str, list[str]] = {}
    for p in patchers(framework):
        out[p.module] = sorted({*out.get(p.module, []), *p._replacements()})
    return out


def check(out: TextIO | None = None) -> int:
    """Print the report; the exit status (see the module docstring)."""
    write = (out or sys.stdout).write
    switch = _switch()
    loaded_at_start = _loaded_at_start
    value = os.environ.get(switch.ENV)
    names, unknown = switch.parse(value)
    status = 0
    write(f"{switch.ENV}={value!r}" if value is not None else f"{switch.ENV} is not set")
    write(f": patches {', '.join(names)}\n" if names else ": patches nothing\n")
    if unknown:
        write(f"error: {switch.unknown_message(unknown)}\n")
        status = 2

    pths = pth_files()
    plugin = verl_plugin()
    reads = verl_reads_plugins()
    policy = os.environ.get("VERL_USE_EXTERNAL_PLUGINS", "auto").strip().lower()
    write("\nhow it reaches each new process (spawned workers, Ray actors):\n")
    if pths:
        for p in pths:
            current = p.read_text(encoding="utf-8").strip() == switch.PTH_LINE
            write(f"  start-up hook: {p} ({'current' if current else 'OUTDATED: reinstall'})\n")
    else:
        write(
            "  start-up hook: no seqbalance_switch.pth in this interpreter's site-packages "
            "(seqbalance not installed with pip here: on PYTHONPATH or --target only)\n"
        )
    plugin_works = bool(plugin) and bool(reads) and policy != "none" and (
        policy == "auto" or "seqbalance" in {p.strip() for p in policy.split(",")}
    )
    if plugin:
        write(f"  verl plugin: entry point verl.plugins: {plugin}; ")
        if reads is None:
            write("no verl found\n")
        elif not reads:
            write("this verl does not load plugins (verl 0.9.0 on does)\n")
        else:
            write(
                f"VERL_USE_EXTERNAL_PLUGINS={policy!r}: "
                f"{'loaded by verl' if plugin_works else 'NOT loaded by verl'}\n"
            )
    else:
        write("  verl plugin: no verl.plugins entry point in installed metadata\n")
    if loaded_at_start:
        write("  in this process: the start-up hook ran")
        watching = sorted(switch._finder.targets)
        write(f"; waiting for {', '.join(watching)}\n" if watching else "\n")
    else:
        write("  in this process: the start-up hook did not run\n")
    if names and not pths and not ("verl" in names and plugin_works):
        write(
            f"warning: {switch.ENV} is set, but nothing here carries it into new processes; "
            "install seqbalance with pip (pip install . or pip install -e .), or call "
            "seqbalance.compat.<framework>.patch() in each process\n"
        )
        status = max(status, 1)

    write("\nframeworks (versions from their files, not imported):\n")
    for fw in switch.MODULES:
        version, where = framework_version(fw)
        on = fw in names
        head = f"  {fw}: " + (f"{version} at {where}" if where else "not installed")
        write(head + (" -- patched by the switch\n" if on else "\n"))
        if fw == "verl" and where:
            from ._verl_dropin import RETRY, _count_rule

            rule = _count_rule(True)
            if rule == RETRY:
                how = "0.9.1's count (raised until its split holds the cap)"
            else:
                how = "the count before 0.9.1 (ceil(tokens / cap), no retry; the cap still held)"
            write(f"    match_framework_count=True follows {how}\n")
        mode_ok = True
        if fw in _JOINT_TEXT and (where or on):
            line, joint = joint_mode(fw)
            write(f"    {line}\n")
            mode_ok = joint is not None
        if on and not mode_ok:  # the switch would fail the framework module's import
            write(f"    nothing replaced: importing {', '.join(switch.modules(fw))} would "
                  "fail with that error\n")  # fmt: skip
            status = 2
        elif on:
            for module, fns in replaced_names(fw).items():
                write(f"    {module}: {', '.join(fns)}\n")
    write("\nturn it off: unset SEQBALANCE_PATCH (or set it to 0) before the run starts\n")
    return status


#: What joint mode does, per framework that has one.
_JOINT_TEXT = {
    "verl": "the driver plans ranks x micro-batches per PPO mini-batch; the workers follow "
    "the carried slots",
    "areal": "the controller plans ranks x micro-batches per mini-batch; the workers follow "
    "the carried slots",
}


def joint_mode(framework: str) -> tuple[str, bool | None]:
    """The line on ``framework``'s joint-mode variable, and whether it asks for joint mode
    (None: the value is not valid)."""
    import importlib

    from ._hook import JOINT

    module, var = JOINT[framework]
    try:
        joint = importlib.import_module(module).joint_requested()
    except ValueError as exc:
        return f"error: {exc}", None
    if joint:
        return f"{var}=joint: joint mode ({_JOINT_TEXT[framework]})", True
    return f"{var} unset or dropin: the one-for-one drop-in", False


_loaded_at_start = "_seqbalance_switch" in sys.modules


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m seqbalance.compat",
        description="The SEQBALANCE_PATCH switch of seqbalance's framework drop-ins.",
    )
    ap.add_argument("--check", action="store_true",
                    help="say what SEQBALANCE_PATCH would patch in this environment")  # fmt: skip
    args = ap.parse_args(argv)
    if not args.check:
        ap.print_help()
        return 2
    return check()


if __name__ == "__main__":
    sys.exit(main())
