"""Run the frameworks' own unit tests against seqbalance.compat, imports changed only.

    pip install --no-deps --target /work/ext9 verl==0.9.1 areal==1.0.4
    pip install --no-deps --target /work/ext9/td tensordict cloudpickle orjson pyvers \
        importlib_metadata                                # verl.protocol needs tensordict
    git clone https://github.com/volcengine/verl      /tmp/verl      # or bare mirrors
    git clone https://github.com/inclusionAI/AReaL    /tmp/areal
    git clone https://github.com/THUDM/slime          /tmp/slime
    git clone https://github.com/OpenRLHF/OpenRLHF    /tmp/openrlhf
    python bench/framework_tests.py --ext /work/ext9 --verl /tmp/verl --areal /tmp/areal \
        --slime /tmp/slime --openrlhf /tmp/openrlhf [--work /tmp/i9fw/runs]

The test files are read from the checkouts (a work tree, or a bare/mirror git directory:
then from its HEAD), copied to ``--work`` (outside the repository; nothing of theirs is
committed here), and the imports of the balancing module are rewritten to
``seqbalance.compat.<framework>``. Nothing else in a test changes, except in two named,
printed variants:

- verl ``test_seqlen_balancing_distributed_params`` spawns NCCL ranks on CUDA devices; a
  second copy of the file with ``nccl -> gloo`` and ``cuda -> cpu`` runs it on CPU.
- AReaL ``tests/test_seqpack.py`` mostly tests RPC/controller code: only its seqpack
  classes (``TestBalancedGreedyPartition``, ``TestFFDAllocate``) and data generators are
  kept. ``TestKKSet`` / ``TestKKState`` (private KK data structures) are deselected.

verl's heavy imports that these tests never call (transformers, ray, omegaconf, ...) are
stubbed by ``--work``/stubs (a ``sitecustomize``, so that spawned ranks get them too).
Prints pytest's summary per framework and writes bench/results/framework_tests.json.

``--switch``: the same tests with their imports *unchanged*, run with
``SEQBALANCE_PATCH=<framework>`` set, so that the frameworks' own modules are imported and
the start-up switch puts the drop-ins into them (what a user gets from the one-line
switch)::

    pip install --no-deps --target /tmp/td tensordict cloudpickle orjson pyvers \
        importlib_metadata
    python bench/framework_tests.py --switch --ext /work/ext --td /tmp/td \
        --verl-code /work/ext --verl-code /work/verl_main --verl /work/verl_main \
        --areal AREAL_TREE --slime /work/slime_main --openrlhf OPENRLHF_TREE \
        [--python VENV/bin/python]

``--python`` is an interpreter where seqbalance is pip-installed (its
``seqbalance_switch.pth`` in site-packages); where there is none, the stubs'
sitecustomize adds a site directory holding a copy of the repository's ``.pth`` (the same
line, run by the same ``site`` machinery). The verl tests run once per ``--verl-code``
tree (the verl that is imported: 0.9.1 from ``--ext``, main from a source tree). Each run
records at the end of its pytest run which functions of the frameworks' modules (and of the
test modules, which import them by name) are seqbalance's; a run where none is fails its
row. Named variants, printed: the package ``__init__`` files of AReaL and OpenRLHF are
skipped (their trainers' dependencies are not installed; the balancing modules are still
imported by their own names, through the import system), and OpenRLHF's test, which loads
``experience.py`` by file path under a private name (no import hook sees that), imports it
by its module name instead.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, machine_info, write_json

# Heavy packages verl imports at module level for features these tests do not touch.
_HEAVY = ("transformers", "peft", "accelerate", "safetensors", "huggingface_hub",
          "flash_attn", "codetiming", "hydra", "datasets", "pydantic", "torchdata")  # fmt: skip

_CONFTEST = f'''"""Stand-ins for heavy imports the copied framework tests never call."""
import importlib.abc, importlib.machinery, sys, types

HEAVY = {_HEAVY!r}


class _Anything(types.ModuleType):
    __path__ = []

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {{"__init__": lambda self, *a, **k: None}})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in HEAVY:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return _Anything(spec.name)

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, _Finder())
'''

_STUBS = {
    "ray.py": "class ObjectRef: pass\n"
    "def get(x): return x\n"
    "def put(x): return x\n"
    "def remote(*a, **k): return (lambda f: f) if not a or not callable(a[0]) else a[0]\n",
    "omegaconf.py": "class DictConfig(dict): pass\n"
    "class ListConfig(list): pass\n"
    "class OmegaConf:\n"
    "    @staticmethod\n"
    "    def to_container(x, **k): return x\n"
    "    @staticmethod\n"
    "    def create(x=None, **k): return x\n",
}


def read(repo: str, path: str) -> str:
    """A file of a checkout: from its work tree, or from HEAD of a (bare) git directory."""
    p = Path(repo, path)
    if p.is_file():
        return p.read_text()
    git = Path(repo, ".git") if Path(repo, ".git").exists() else Path(repo)
    return subprocess.run(["git", "--git-dir", str(git), "show", f"HEAD:{path}"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip


def rewrite(src: str, module: str, compat: str) -> str:
    """Point every import of ``module`` at ``compat``; nothing else changes."""
    out = src.replace(f"from {module} import", f"from {compat} import")
    if out == src:
        raise SystemExit(f"no `from {module} import` found: has the test file moved on?")
    return out


def keep_classes(src: str, classes: set[str]) -> str:
    """Module-level imports of numpy/pytest, every top-level function, and ``classes``."""
    tree = ast.parse(src)
    parts = []
    for node in tree.body:
        seg = ast.get_source_segment(src, node)
        if isinstance(node, ast.Import) and all(a.name in ("numpy", "pytest", "random")
                                               for a in node.names):  # fmt: skip
            parts.append(seg)
        elif isinstance(node, ast.ImportFrom) and node.module == "areal.utils.seqpack":
            parts.append(seg)
        elif isinstance(node, ast.FunctionDef) or (
            isinstance(node, ast.ClassDef) and node.name in classes
        ):
            parts.append(seg)
    return "\n\n\n".join(parts) + "\n"


def pytest_run(work: Path, files: list[str], pythonpath: list[str], extra: list[str],
               python: str = sys.executable) -> dict:  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(pythonpath))
    cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W", "ignore",
           "-rf", *files, *extra]  # fmt: skip
    r = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=1800)
    lines = r.stdout.strip().splitlines()
    failed = [ln.split(" ", 1)[1] for ln in lines if ln.startswith("FAILED ")]
    summary = lines[-1] if lines else r.stderr[-500:]
    print(f"  {' '.join(files)} {' '.join(extra)}\n    -> {summary}")
    for f in failed:
        print(f"       FAILED {f}")
    return {"files": files, "extra": extra, "summary": summary, "failed": failed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for name in ("verl", "areal", "slime", "openrlhf"):
        ap.add_argument(f"--{name}", help=f"{name} checkout (work tree or git dir)")
    ap.add_argument("--only", default=None,
                    help="--switch: comma-separated frameworks to run (default: all four)")
    ap.add_argument("--ext", default="/work/ext9", help="pip --target of verl 0.9.1 / areal 1.0.4")
    ap.add_argument("--work", default="/tmp/i9fw/runs")
    ap.add_argument("--json", default=None,
                    help="default bench/results/framework_tests[_switch].json")  # fmt: skip
    ap.add_argument("--switch", action="store_true",
                    help="imports unchanged, SEQBALANCE_PATCH=<framework> set")  # fmt: skip
    ap.add_argument("--td", default=None, help="tensordict & co. (default EXT/td)")
    ap.add_argument("--verl-code", action="append", default=None,
                    help="--switch: a verl tree to import (repeat; default --ext)")  # fmt: skip
    ap.add_argument("--python", default=sys.executable,
                    help="--switch: the interpreter that runs the tests")  # fmt: skip
    args = ap.parse_args()
    args.td = args.td or str(Path(args.ext, "td"))
    need = set(args.only.split(",")) if (args.switch and args.only) else {
        "verl", "areal", "slime", "openrlhf"}
    missing = [n for n in sorted(need) if not getattr(args, n)]
    if missing:
        ap.error(f"--{' --'.join(missing)} required")
    if args.switch:
        from framework_tests_switch import run_switch

        run_switch(args)
        return
    args.json = args.json or "bench/results/framework_tests.json"
    work = Path(args.work)
    (work / "stubs").mkdir(parents=True, exist_ok=True)
    (work / "stubs" / "sitecustomize.py").write_text(_CONFTEST)
    for name, text in _STUBS.items():
        (work / "stubs" / name).write_text(text)
    src = str(ROOT / "src")
    results = {}

    print("verl (tests/utils/test_seqlen_balancing.py)")
    t = rewrite(read(args.verl, "tests/utils/test_seqlen_balancing.py"),
                "verl.utils.seqlen_balancing", "seqbalance.compat.verl")  # fmt: skip
    (work / "test_verl_seqlen_balancing.py").write_text(t)
    gloo = t.replace("get_torch_device().set_device(rank)", "pass")
    gloo = gloo.replace("backend=get_nccl_backend()", 'backend="gloo"')
    gloo = re.sub(r'device=f"\{get_device_name\(\)\}:\{rank\}"', 'device="cpu"', gloo)
    (work / "test_verl_seqlen_balancing_gloo.py").write_text(gloo)
    path = [src, args.ext, args.td, str(work / "stubs")]
    results["verl"] = pytest_run(work, ["test_verl_seqlen_balancing.py"], path, [])
    results["verl_gloo_variant"] = pytest_run(
        work, ["test_verl_seqlen_balancing_gloo.py"], path, ["-k", "distributed_params"]
    )

    print("AReaL (tests/test_kk_allocate.py, seqpack classes of tests/test_seqpack.py)")
    kk = rewrite(read(args.areal, "tests/test_kk_allocate.py"),
                 "areal.utils.seqpack", "seqbalance.compat.areal")  # fmt: skip
    kk = re.sub(r"\n    _KKSet,\n    _KKState,", "", kk)  # private classes, deselected below
    (work / "test_areal_kk_allocate.py").write_text(kk)
    sp = keep_classes(read(args.areal, "tests/test_seqpack.py"),
                      {"TestBalancedGreedyPartition", "TestFFDAllocate"})  # fmt: skip
    (work / "test_areal_seqpack.py").write_text(
        rewrite(sp, "areal.utils.seqpack", "seqbalance.compat.areal")
    )
    results["areal"] = pytest_run(
        work, ["test_areal_kk_allocate.py", "test_areal_seqpack.py"], [src, args.ext],
        ["-k", "not TestKKSet and not TestKKState"],
    )  # fmt: skip

    print("slime (tests/test_dp_schedule.py)")
    sl = rewrite(read(args.slime, "tests/test_dp_schedule.py"),
                 "slime.utils.dp_schedule", "seqbalance.compat.slime")  # fmt: skip
    (work / "test_slime_dp_schedule.py").write_text(sl)
    results["slime"] = pytest_run(work, ["test_slime_dp_schedule.py"], [src], [])

    print("OpenRLHF (tests/test_experience.py)")
    # The test loads OpenRLHF's experience.py by file path for its Experience class; that
    # file is copied beside it, and balance_experiences comes from the drop-in.
    exp_dir = work / "openrlhf_src" / "openrlhf" / "trainer" / "ppo_utils"
    exp_dir.mkdir(parents=True, exist_ok=True)
    (exp_dir / "experience.py").write_text(
        read(args.openrlhf, "openrlhf/trainer/ppo_utils/experience.py")
    )
    ex = read(args.openrlhf, "tests/test_experience.py")
    ex = ex.replace("root = Path(__file__).resolve().parents[1]",
                    f"root = Path({str(work / 'openrlhf_src')!r})")  # fmt: skip
    ex = ex.replace("balance_experiences = _experience_module.balance_experiences",
                    "from seqbalance.compat.openrlhf import balance_experiences")  # fmt: skip
    (work / "test_openrlhf_experience.py").write_text(ex)
    results["openrlhf"] = pytest_run(work, ["test_openrlhf_experience.py"], [src], [])
    write_json(args.json, {"machine": machine_info(), "results": results})


if __name__ == "__main__":
    main()
