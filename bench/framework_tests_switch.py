"""``bench/framework_tests.py --switch``: the frameworks' own tests with their imports
unchanged and ``SEQBALANCE_PATCH=<framework>`` set (see that script's docstring)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from _common import ROOT, machine_info, write_json
from framework_tests import _CONFTEST, _STUBS, keep_classes, pytest_run, read

_STUB_NUMBA = (
    "def njit(*a, **k):\n"
    "    return a[0] if a and callable(a[0]) else (lambda f: f)\n"
    "prange = range\n"
)

# Written into each run's directory: package __init__ files skipped (``packages``: name ->
# directory), logging-only modules stood in for, and at the end of the run a record of
# which functions are seqbalance's.
_SWITCH_CONFTEST = """
import json, logging, sys, types
from pathlib import Path

for name, where in {packages!r}.items():
    mod = types.ModuleType(name)
    mod.__path__ = [where]
    sys.modules[name] = mod
for name in {loggers!r}:
    mod = types.ModuleType(name)
    mod.getLogger = logging.getLogger
    sys.modules[name] = mod


def pytest_sessionfinish(session, exitstatus):
    import _seqbalance_switch as switch

    report = {{"switch_loaded": "_seqbalance_switch" in sys.modules, "modules": {{}}}}
    watched = [m for ms in switch.MODULES.values() for m in ms]
    for name, mod in list(sys.modules.items()):
        if mod is None or not (name in watched or name.startswith("test_")):
            continue
        ours = sorted(k for k, v in vars(mod).items() if callable(v)
                      and str(getattr(v, "__module__", "")).startswith("seqbalance.compat."))
        if ours:
            report["modules"][name] = ours
    Path("switch_report.json").write_text(json.dumps(report, indent=1))
"""

# Replaces OpenRLHF's ``_experience_module = _load_experience_module()``: the same module,
# imported by its name (the test's own loader runs it under a private name, by path).
_OPENRLHF_IMPORT = """

def _import_experience_module():
    import importlib

    utils_module = types.ModuleType("openrlhf.utils.utils")
    utils_module.zero_pad_sequences = _zero_pad_sequences
    sys.modules["openrlhf.utils.utils"] = utils_module
    return importlib.import_module("openrlhf.trainer.ppo_utils.experience")


def _zero_pad_sequences(sequences, side="left", value=0, stack=False):
    max_len = max(sequence.size(-1) for sequence in sequences)
    padded = []
    for sequence in sequences:
        pad_len = max_len - sequence.size(-1)
        padding = (pad_len, 0) if side == "left" else (0, pad_len)
        padded.append(F.pad(sequence, padding, value=value))
    return torch.stack(padded) if stack else torch.cat(padded)


_experience_module = _import_experience_module()
"""


# AReaL's ``areal.utils.data`` imported as is, for tests/test_utils.py: stand-ins for what it
# imports but the split does not use, and ``MicroBatchSpec`` compiled from AReaL's
# ``cli_args.py`` (whose module imports hydra, uvloop and much of AReaL).
_AREAL_DATA_CONFTEST = """
import ast, dataclasses
mod = types.ModuleType("einops")
mod.rearrange = None
sys.modules["einops"] = mod
for name in ("torchdata", "torchdata.stateful_dataloader"):
    sys.modules[name] = types.ModuleType(name)
sys.modules[name].StatefulDataLoader = type("StatefulDataLoader", (), {{}})
mod = types.ModuleType("areal.infra.platforms")
mod.current_platform = types.SimpleNamespace(device_type="cpu", current_device=lambda: "cpu")
sys.modules["areal.infra.platforms"] = mod
cli = types.ModuleType("areal.api.cli_args")
sys.modules["areal.api.cli_args"] = cli
_src = Path({cli_args!r}).read_text()
_node = next(n for n in ast.parse(_src).body
             if isinstance(n, ast.ClassDef) and n.name == "MicroBatchSpec")
cli.__dict__.update(dataclass=dataclasses.dataclass, field=dataclasses.field,
                    PACKING_ALGORITHMS={{"ffd", "kk"}}, NormConfig=type("NormConfig", (), {{}}))
exec(compile("@dataclass\\n" + ast.get_source_segment(_src, _node), "<MicroBatchSpec>", "exec"),
     cli.__dict__)
"""


def switch_run(
    python: str, d: Path, framework: str, files: dict[str, str], path: list[str],
    extra: list[str], packages: dict[str, str] | None = None, loggers: tuple[str, ...] = (),
    env: dict[str, str] | None = None, conftest: str = "",
) -> dict:  # fmt: skip
    """One pytest run in ``d`` with SEQBALANCE_PATCH=framework (and ``env``), and its
    switch record; ``conftest`` is appended to the run's conftest."""
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (d / name).write_text(text)
    (d / "conftest.py").write_text(
        _SWITCH_CONFTEST.format(packages=packages or {}, loggers=list(loggers)) + conftest
    )
    (d / "switch_report.json").unlink(missing_ok=True)
    env = {"SEQBALANCE_PATCH": framework, **(env or {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        out = pytest_run(d, list(files), path, extra, python=python)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    out["python"] = python
    out["env"] = env
    rep = d / "switch_report.json"
    out["switch"] = json.loads(rep.read_text()) if rep.is_file() else None
    mods = (out["switch"] or {}).get("modules", {})
    n = sum(len(v) for v in mods.values())
    print(f"    -> seqbalance's functions in {len(mods)} modules ({n} names): "
          + ", ".join(f"{m} ({len(v)})" for m, v in sorted(mods.items())))  # fmt: skip
    if not n:
        out["summary"] += "  [THE SWITCH DID NOT APPLY]"
        print("       THE SWITCH DID NOT APPLY")
    return out


def run_switch(args: object) -> None:
    work = Path(args.work) / "switch"
    stubs = work / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    pth = ROOT / "src" / "seqbalance_switch.pth"
    probe = subprocess.run(
        [args.python, "-c", "import os, site; print(any(os.path.isfile(os.path.join(d, "
         "'seqbalance_switch.pth')) for d in site.getsitepackages()))"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    installed = probe.stdout.strip() == "True"
    sitecustomize = _CONFTEST
    if installed:
        print(f"start-up hook: seqbalance_switch.pth installed for {args.python}")
    else:
        site_dir = work / "site"
        site_dir.mkdir(exist_ok=True)
        (site_dir / pth.name).write_text(pth.read_text())
        sitecustomize += f"\nimport site\nsite.addsitedir({str(site_dir)!r})\n"
        print(f"start-up hook: no .pth installed for {args.python}; a copy in {site_dir}, "
              "added by the stubs' sitecustomize")  # fmt: skip
    (stubs / "sitecustomize.py").write_text(sitecustomize)
    for name, text in {**_STUBS, "numba.py": _STUB_NUMBA}.items():
        (stubs / name).write_text(text)
    src = str(ROOT / "src")
    results: dict = {"start_up_hook": "installed" if installed else "site directory added"}

    only = set(args.only.split(",")) if getattr(args, "only", None) else None
    if only is None or "verl" in only:
        _run_verl(args, work, src, stubs, results)
    if only is None or "areal" in only:
        _run_areal(args, work, src, stubs, results)
    if only is None or "slime" in only:
        _run_slime(args, work, src, stubs, results)
    if only is None or "openrlhf" in only:
        _run_openrlhf(args, work, src, stubs, results)
    path = args.json or "bench/results/framework_tests_switch.json"
    if only is not None and Path(path).is_file():  # the other frameworks' entries stay
        previous = json.loads(Path(path).read_text())
        hook = results.pop("start_up_hook")
        for entry in results.values():
            entry["start_up_hook"] = hook
        results = {**previous.get("results", {}), **results}
        python = previous.get("python")
    else:
        python = args.python
    write_json(path, {"machine": machine_info(), "python": python, "results": results})


def _run_verl(args: Any, work: Path, src: str, stubs: Path, results: dict) -> None:
    t = read(args.verl, "tests/utils/test_seqlen_balancing.py")
    gloo = t.replace("get_torch_device().set_device(rank)", "pass")
    gloo = gloo.replace("backend=get_nccl_backend()", 'backend="gloo"')
    gloo = re.sub(r'device=f"\{get_device_name\(\)\}:\{rank\}"', 'device="cpu"', gloo)
    for code in args.verl_code or [args.ext]:
        version = Path(code, "verl", "version", "version").read_text().strip()
        print(f"verl {version} from {code} (tests/utils/test_seqlen_balancing.py, imports as is)")
        path = [src, code, args.td, str(stubs)]
        results[f"verl {version}"] = switch_run(
            args.python, work / f"verl_{version}", "verl",
            {"test_verl_seqlen_balancing.py": t}, path, [])  # fmt: skip
        results[f"verl {version} gloo variant"] = switch_run(
            args.python, work / f"verl_{version}_gloo", "verl",
            {"test_verl_seqlen_balancing_gloo.py": gloo}, path,
            ["-k", "distributed_params"])  # fmt: skip



def _run_areal(args: Any, work: Path, src: str, stubs: Path, results: dict) -> None:
    print("AReaL (tests/test_kk_allocate.py, seqpack classes of tests/test_seqpack.py; "
          "package __init__ files skipped)")  # fmt: skip
    sp = keep_classes(read(args.areal, "tests/test_seqpack.py"),
                      {"TestBalancedGreedyPartition", "TestFFDAllocate"})  # fmt: skip
    files = {"test_areal_kk_allocate.py": read(args.areal, "tests/test_kk_allocate.py"),
             "test_areal_seqpack.py": sp}  # fmt: skip
    results["areal"] = switch_run(
        args.python, work / "areal", "areal", files,
        [src, args.ext, str(stubs)], ["-k", "not TestKKSet and not TestKKState"],
        packages={p: str(Path(args.ext, *p.split("."))) for p in ("areal", "areal.utils")},
        loggers=("areal.utils.logging",),
    )  # fmt: skip
    print("AReaL joint mode (SEQBALANCE_AREAL_MODE=joint): the same, and tests/test_utils.py "
          "(the micro-batch split of areal.utils.data, imported as is)")  # fmt: skip
    results["areal joint mode"] = switch_run(
        args.python, work / "areal_joint", "areal",
        {**files, "test_areal_utils.py": read(args.areal, "tests/test_utils.py")},
        [src, args.ext, str(stubs)], ["-k", "not TestKKSet and not TestKKState"],
        packages={p: str(Path(args.ext, *p.split("."))) for p in
                  ("areal", "areal.utils", "areal.api", "areal.infra")},
        loggers=("areal.utils.logging",), env={"SEQBALANCE_AREAL_MODE": "joint"},
        conftest=_AREAL_DATA_CONFTEST.format(
            cli_args=str(Path(args.ext, "areal", "api", "cli_args.py"))),
    )  # fmt: skip


def _run_slime(args: Any, work: Path, src: str, stubs: Path, results: dict) -> None:
    print("slime (tests/test_dp_schedule.py)")
    results["slime"] = switch_run(
        args.python, work / "slime", "slime",
        {"test_slime_dp_schedule.py": read(args.slime, "tests/test_dp_schedule.py")},
        [src, args.slime, str(stubs)], [])  # fmt: skip


def _run_openrlhf(args: Any, work: Path, src: str, stubs: Path, results: dict) -> None:
    print("OpenRLHF (tests/test_experience.py; experience.py imported by its module name)")
    tree = work / "openrlhf_src"
    exp_dir = tree / "openrlhf" / "trainer" / "ppo_utils"
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "experience.py").write_text(
        read(args.openrlhf, "openrlhf/trainer/ppo_utils/experience.py")
    )
    ex = read(args.openrlhf, "tests/test_experience.py")
    old = "_experience_module = _load_experience_module()\n"
    if old not in ex:
        raise SystemExit("OpenRLHF's test no longer loads experience.py as expected")
    results["openrlhf"] = switch_run(
        args.python, work / "openrlhf", "openrlhf",
        {"test_openrlhf_experience.py": ex.replace(old, _OPENRLHF_IMPORT)},
        [src, str(tree), str(stubs)], [],
        packages={p: str(Path(tree, *p.split("."))) for p in
                  ("openrlhf", "openrlhf.trainer", "openrlhf.trainer.ppo_utils")},
    )  # fmt: skip
