"""The SEQBALANCE_PATCH start-up switch, on a fake verl module tree, in fresh interpreters
and in a process they start with multiprocessing's spawn method.

The switch reaches a process through ``seqbalance_switch.pth`` in site-packages (installed
by ``pip install .`` and ``pip install -e .``) or verl's ``verl.plugins`` entry point. The
tests put a copy of the repository's ``.pth`` into a site directory of their own (a
``sitecustomize`` adds it at start-up, in spawned children too), so they run whether or
not this checkout is installed; :func:`test_the_installed_start_up_hook` also runs the one
pip installed, where there is one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import _seqbalance_switch as switch

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"

FAKE_BALANCING = '''
def get_seqlen_balanced_partitions(seqlen_list, k_partitions, equal_size):
    return "verl's own"


def rearrange_micro_batches(batch, max_token_len, **kwargs):
    return "verl's own"
'''

# Run in a fresh interpreter: what the process got at start-up, then what a spawned child
# gets when it imports verl's balancing module (also through a module that imported a
# function by name, as verl's workers do).
PROBE = '''
import multiprocessing as mp
import sys


def child(q):
    import verl.user
    from verl.utils.seqlen_balancing import rearrange_micro_batches
    q.put((rearrange_micro_batches.__module__, verl.user.get_seqlen_balanced_partitions.__module__))


if __name__ == "__main__":
    print("at start:", sorted(m for m in ("verl", "seqbalance", "numpy", "_seqbalance_switch")
                              if m in sys.modules))
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print("spawned child:", *q.get())
    p.join()
    assert p.exitcode == 0
'''


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A fake verl (three modules, a version file), a site directory holding a copy of the
    repository's .pth, and a sitecustomize that adds that directory at start-up."""
    fw = tmp_path / "fw"
    _write(fw / "verl" / "__init__.py", "")
    _write(fw / "verl" / "version" / "version", "0.0.1.fake\n")
    _write(fw / "verl" / "utils" / "__init__.py", "")
    _write(fw / "verl" / "utils" / "seqlen_balancing.py", FAKE_BALANCING)
    _write(fw / "verl" / "user.py",
           "from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions\n")  # fmt: skip
    _write(fw / "probe.py", PROBE)
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "seqbalance_switch.pth").write_text((SRC / "seqbalance_switch.pth").read_text())
    _write(tmp_path / "boot" / "sitecustomize.py",
           f"import site\nsite.addsitedir({str(site_dir)!r})\n")  # fmt: skip
    return tmp_path


def _run(tree: Path, value: str | None, *args: str, boot: bool = True,
         extra_path: tuple[Path, ...] = ()) -> subprocess.CompletedProcess[str]:  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != switch.ENV}
    if value is not None:
        env[switch.ENV] = value
    path = [*(tree / "boot",) * boot, *extra_path, tree / "fw", SRC]
    env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    args = args or (str(tree / "fw" / "probe.py"),)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True,
                          timeout=120, cwd=tree)  # fmt: skip


def test_set_before_start_a_spawned_child_gets_seqbalances_functions(tree):
    r = _run(tree, "verl")
    assert r.returncode == 0, r.stderr
    # Nothing heavy at start-up: the switch only registered its import hook.
    assert "at start: ['_seqbalance_switch']" in r.stdout
    assert "spawned child: seqbalance.compat.verl seqbalance.compat.verl" in r.stdout


@pytest.mark.parametrize("value", [None, "", "0", "off"])
def test_unset_a_spawned_child_gets_verls_own_and_nothing_is_imported(tree, value):
    r = _run(tree, value)
    assert r.returncode == 0, r.stderr
    # Unset or empty, the .pth line imports nothing; "0"/"off" load the switch, which
    # registers nothing.
    assert r.stdout.startswith("at start: []" if not value else "at start: ['_seqbalance_switch']")
    assert "spawned child: verl.utils.seqlen_balancing verl.utils.seqlen_balancing" in r.stdout


def test_unknown_names_are_named_with_the_valid_values(tree):
    r = _run(tree, "verl, VeRL,torchtitan")
    assert r.returncode == 0, r.stderr
    assert "spawned child: seqbalance.compat.verl seqbalance.compat.verl" in r.stdout
    # At start-up a warning (every process starts this way); --check exits with 2.
    assert ("SEQBALANCE_PATCH names unknown frameworks ['torchtitan']; valid values are "
            "verl, slime, areal, openrlhf") in r.stderr  # fmt: skip


def test_a_framework_module_that_cannot_be_patched_fails_its_import(tree):
    _write(tree / "fw" / "verl" / "utils" / "seqlen_balancing.py", "def unrelated(): pass\n")
    r = _run(tree, "verl", "-c", "import verl.utils.seqlen_balancing")
    assert r.returncode == 1
    assert "ImportError: SEQBALANCE_PATCH names verl, but seqbalance could not replace" in r.stderr
    assert "Unset SEQBALANCE_PATCH to run verl's own code" in r.stderr


def _verl_loading_plugins(tree):
    """verl 0.9 loads every "verl.plugins" entry point from verl/__init__.py; a stand-in
    distribution under ``tree / "meta"`` declares seqbalance's (as pyproject.toml does)."""
    _write(tree / "fw" / "verl" / "__init__.py", """
        from importlib.metadata import entry_points

        for ep in entry_points(group="verl.plugins"):
            ep.load()
        """)
    meta = tree / "meta" / "seqbalance_stand_in-0.dist-info"
    _write(meta / "METADATA", "Metadata-Version: 2.1\nName: seqbalance-stand-in\nVersion: 0\n")
    _write(meta / "entry_points.txt", "[verl.plugins]\nseqbalance = _seqbalance_switch\n")


def test_verls_plugin_entry_point_switches_it_on_without_the_start_up_hook(tree):
    # verl 0.9 loads every "verl.plugins" entry point from verl/__init__.py; a stand-in
    # distribution declares seqbalance's (as pyproject.toml does, checked below).
    _verl_loading_plugins(tree)
    code = ("import sys, verl.utils.seqlen_balancing as m; "
            "print(m.rearrange_micro_batches.__module__, 'seqbalance' in sys.modules)")  # fmt: skip
    on = _run(tree, "verl", "-c", code, boot=False, extra_path=(tree / "meta",))
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["seqbalance.compat.verl", "True"]
    off = _run(tree, None, "-c", code, boot=False, extra_path=(tree / "meta",))
    assert off.stdout.split() == ["verl.utils.seqlen_balancing", "False"], off.stderr


def test_pyproject_declares_the_entry_point_and_the_module():
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    plugins = project["project"]["entry-points"]["verl.plugins"]
    assert plugins == {"seqbalance": "_seqbalance_switch"}
    assert project["tool"]["setuptools"]["py-modules"] == ["_seqbalance_switch"]
    assert "seqbalance_switch.pth" in (ROOT / "setup.py").read_text()


def test_the_pth_line_is_the_one_the_check_expects():
    assert (SRC / "seqbalance_switch.pth").read_text().strip() == switch.PTH_LINE
    # site runs a .pth line only if it starts with "import".
    assert switch.PTH_LINE.startswith("import ")


def test_the_installed_start_up_hook(tree):
    from seqbalance.compat.__main__ import pth_files

    if not pth_files():
        pytest.skip("seqbalance is not pip-installed in this interpreter (pip install -e . "
                    "puts seqbalance_switch.pth into site-packages)")  # fmt: skip
    r = _run(tree, "verl", boot=False)
    assert r.returncode == 0, r.stderr
    assert "spawned child: seqbalance.compat.verl seqbalance.compat.verl" in r.stdout
    r = _run(tree, None, boot=False)
    assert "spawned child: verl.utils.seqlen_balancing verl.utils.seqlen_balancing" in r.stdout


@pytest.mark.parametrize(
    ("value", "names", "unknown"),
    [
        (None, [], []),
        ("", [], []),
        ("0", [], []),
        ("verl", ["verl"], []),
        (" Verl , slime,verl,, areal ,OpenRLHF", ["verl", "slime", "areal", "openrlhf"], []),
        ("verl,trl", ["verl"], ["trl"]),
    ],
)
def test_parse(value, names, unknown):
    assert switch.parse(value) == (names, unknown)


def test_every_name_has_a_drop_in_with_a_patcher_per_module():
    from seqbalance.compat._hook import DROP_INS, patchers

    assert set(DROP_INS) == set(switch.MODULES)
    for fw, modules in switch.MODULES.items():
        assert sorted(p.module for p in patchers(fw)) == sorted(modules), fw
    with pytest.raises(ValueError, match="valid values are verl, slime, areal, openrlhf"):
        patchers("trl")


def test_check_reports_the_switch_the_versions_and_the_wiring(tree):
    r = _run(tree, "verl,trl", "-m", "seqbalance.compat", "--check")
    assert r.returncode == 2, r.stdout + r.stderr
    out = r.stdout
    assert "SEQBALANCE_PATCH='verl,trl': patches verl" in out
    assert "error: SEQBALANCE_PATCH names unknown frameworks ['trl']" in out
    assert f"verl: 0.0.1.fake at {tree / 'fw' / 'verl'} -- patched by the switch" in out
    assert "verl.utils.seqlen_balancing: calculate_workload, ceildiv," in out
    assert "match_framework_count=True follows the count before 0.9.1" in out
    assert "in this process: the start-up hook ran; waiting for verl.utils.seqlen_balancing" in out
    assert "slime: not installed" in out
    assert "turn it off: unset SEQBALANCE_PATCH" in out

    r = _run(tree, None, "-m", "seqbalance.compat", "--check", boot=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SEQBALANCE_PATCH is not set: patches nothing" in r.stdout
    assert "in this process: the start-up hook did not run" in r.stdout


# ---- verl's joint mode through the switch (SEQBALANCE_VERL_MODE) ----------------------

FAKE_TRAINER = '''
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions


class RayPPOTrainer:
    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        return "verl's own"
'''

# A spawned child imports verl's trainer and its engine-worker helpers (which import
# rearrange_micro_batches by name, as verl 0.9.1's verl.workers.engine.utils does); in
# joint mode it then runs the trainer's _balance_batch on a stand-in batch and a rank's
# worker split of its first mini-batch (the stand-ins of tests/test_compat_joint_verl.py).
JOINT_PROBE = '''
import multiprocessing as mp
import sys


def child(q, tests):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer
    from verl.workers.engine import utils as engine_utils

    found = [RayPPOTrainer._balance_batch.__module__,
             engine_utils.rearrange_micro_batches.__module__]
    if found[0] == "seqbalance.compat.joint_verl":
        sys.path.insert(0, tests)
        import numpy as np
        from test_compat_joint_verl import LENS, FakeTD, fake_batch, fake_trainer

        from seqbalance.compat import joint_verl as jv

        batch, metrics = fake_batch(LENS), {}
        RayPPOTrainer._balance_batch(fake_trainer(2, 1024, 16), batch, metrics)
        table = batch.meta_info[jv.SLOTS_KEY]
        rank0 = batch.chunk(2)[0]  # verl's dispatch: equal contiguous chunks
        td = FakeTD(rank0.batch[slice(0, 8)].data, {jv.SLOTS_KEY: table})  # mini-batch 1
        sizes = table[jv.slots_key(td["attention_mask"].sum(1).numpy())]
        _, idx = engine_utils.rearrange_micro_batches(td, 1024)
        bounds = np.cumsum([0, *sizes]).tolist()
        planned = [list(range(a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
        found += [f"joint={metrics['seqbalance/joint']}", f"follows={idx == planned}",
                  f"micro-batches={len(idx)}"]
    q.put(found)


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q, sys.argv[1]))
    p.start()
    p.join(120)
    assert p.exitcode == 0, p.exitcode
    print("spawned child:", *q.get())
'''


def _joint_tree(tree: Path) -> None:
    fw = tree / "fw" / "verl"
    for pkg in ("trainer", "trainer/ppo", "workers", "workers/engine"):
        _write(fw / pkg / "__init__.py", "")
    _write(fw / "trainer" / "ppo" / "ray_trainer.py", FAKE_TRAINER)
    _write(fw / "workers" / "engine" / "utils.py",
           "from verl.utils.seqlen_balancing import rearrange_micro_batches\n")  # fmt: skip
    _write(tree / "fw" / "joint_probe.py", JOINT_PROBE)


def _run_joint(tree: Path, mode: str | None, *args: str, **kw: object):
    old = os.environ.get("SEQBALANCE_VERL_MODE")
    os.environ.pop("SEQBALANCE_VERL_MODE", None)
    if mode is not None:
        os.environ["SEQBALANCE_VERL_MODE"] = mode
    try:
        args = args or (str(tree / "fw" / "joint_probe.py"), str(ROOT / "tests"))
        return _run(tree, "verl", *args, **kw)  # type: ignore[arg-type]
    finally:
        os.environ.pop("SEQBALANCE_VERL_MODE", None)
        if old is not None:
            os.environ["SEQBALANCE_VERL_MODE"] = old


def test_verl_joint_mode_reaches_a_spawned_child(tree):
    pytest.importorskip("torch", reason="the driver and worker stand-ins hold torch tensors")
    _joint_tree(tree)
    r = _run_joint(tree, "joint")
    assert r.returncode == 0, r.stderr
    # The driver's method is joint mode's; the worker function, bound by name in the
    # engine helpers, is joint mode's and follows the boundaries the driver carried.
    assert ("spawned child: seqbalance.compat.joint_verl seqbalance.compat.joint_verl "
            "joint=1 follows=True micro-batches=") in r.stdout  # fmt: skip


@pytest.mark.parametrize("mode", [None, "dropin", " DropIn "])
def test_without_verl_joint_mode_only_the_drop_in(tree, mode):
    _joint_tree(tree)
    r = _run_joint(tree, mode)
    assert r.returncode == 0, r.stderr
    assert ("spawned child: verl.trainer.ppo.ray_trainer seqbalance.compat.verl\n"
            in r.stdout)  # fmt: skip


def test_an_invalid_verl_mode_fails_the_import_with_the_valueerror(tree):
    _joint_tree(tree)
    r = _run_joint(tree, "fast", "-c", "import verl.trainer.ppo.ray_trainer")
    assert r.returncode == 1
    assert "ImportError: SEQBALANCE_PATCH names verl, but seqbalance could not replace" in r.stderr
    assert ("ValueError: SEQBALANCE_VERL_MODE='fast': use 'joint' or 'dropin' (or leave it "
            "unset)") in r.stderr  # fmt: skip
    from seqbalance.compat import _hook

    old = os.environ.get("SEQBALANCE_VERL_MODE")
    os.environ["SEQBALANCE_VERL_MODE"] = "fast"
    try:
        with pytest.raises(ValueError, match="SEQBALANCE_VERL_MODE='fast': use 'joint' or"):
            _hook.patchers("verl")
    finally:
        os.environ.pop("SEQBALANCE_VERL_MODE")
        if old is not None:
            os.environ["SEQBALANCE_VERL_MODE"] = old


def test_verls_plugin_entry_point_switches_on_joint_mode(tree):
    _joint_tree(tree)
    _verl_loading_plugins(tree)
    code = ("from verl.trainer.ppo.ray_trainer import RayPPOTrainer as T; "
            "from verl.workers.engine import utils as u; "
            "print(T._balance_batch.__module__, u.rearrange_micro_batches.__module__)")  # fmt: skip
    on = _run_joint(tree, "joint", "-c", code, boot=False, extra_path=(tree / "meta",))
    assert on.returncode == 0, on.stderr
    assert on.stdout.split() == ["seqbalance.compat.joint_verl"] * 2
    off = _run_joint(tree, None, "-c", code, boot=False, extra_path=(tree / "meta",))
    assert off.returncode == 0, off.stderr
    assert off.stdout.split() == ["verl.trainer.ppo.ray_trainer", "seqbalance.compat.verl"]


def test_check_reports_verls_joint_mode_and_its_modules(tree):
    _joint_tree(tree)
    # Status 1 where this interpreter has no installed .pth (nothing carries the switch).
    r = _run_joint(tree, "joint", "-m", "seqbalance.compat", "--check")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    out = r.stdout
    assert ("SEQBALANCE_VERL_MODE=joint: joint mode (the driver plans ranks x micro-batches "
            "per PPO mini-batch; the workers follow the carried slots)") in out  # fmt: skip
    assert "    verl.trainer.ppo.ray_trainer: RayPPOTrainer._balance_batch\n" in out
    assert ("waiting for verl.trainer.ppo.ray_trainer, verl.utils.seqlen_balancing"
            in out)  # fmt: skip
    r = _run_joint(tree, None, "-m", "seqbalance.compat", "--check")
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert "SEQBALANCE_VERL_MODE unset or dropin: the one-for-one drop-in" in r.stdout
    assert "ray_trainer" not in r.stdout
    r = _run_joint(tree, "fast", "-m", "seqbalance.compat", "--check")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "error: SEQBALANCE_VERL_MODE='fast': use 'joint' or 'dropin'" in r.stdout
    assert ("nothing replaced: importing verl.utils.seqlen_balancing would fail with that "
            "error") in r.stdout  # fmt: skip


def test_the_switch_watches_verls_trainer_in_joint_mode_only(monkeypatch):
    from seqbalance.compat import _hook
    from seqbalance.compat import joint_verl as jv

    monkeypatch.delenv("SEQBALANCE_VERL_MODE", raising=False)
    assert switch.modules("verl") == ("verl.utils.seqlen_balancing",)
    assert jv._trainer_patcher not in _hook.patchers("verl")
    monkeypatch.setenv("SEQBALANCE_VERL_MODE", "joint")
    assert switch.modules("verl") == ("verl.utils.seqlen_balancing",
                                      "verl.trainer.ppo.ray_trainer")  # fmt: skip
    found = _hook.patchers("verl")
    # The drop-in first, joint mode on top of it.
    assert found.index(jv._worker_patcher) > 0 and jv._trainer_patcher in found
    assert sorted({p.module for p in found}) == sorted(switch.modules("verl"))


def test_the_switch_and_the_hook_name_the_same_joint_modes():
    # The start-up switch cannot import seqbalance, so it keeps its own copy of the names.
    from seqbalance.compat import _hook

    assert {fw: env for fw, (env, _) in switch.JOINT_MODULES.items()} == {
        fw: env for fw, (_, env) in _hook.JOINT.items()
    }
