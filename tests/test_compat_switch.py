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


def test_verls_plugin_entry_point_switches_it_on_without_the_start_up_hook(tree):
    # verl 0.9 loads every "verl.plugins" entry point from verl/__init__.py; a stand-in
    # distribution declares seqbalance's (as pyproject.toml does, checked below).
    _write(tree / "fw" / "verl" / "__init__.py", """
        from importlib.metadata import entry_points

        for ep in entry_points(group="verl.plugins"):
            ep.load()
        """)
    meta = tree / "meta" / "seqbalance_stand_in-0.dist-info"
    _write(meta / "METADATA", "Metadata-Version: 2.1\nName: seqbalance-stand-in\nVersion: 0\n")
    _write(meta / "entry_points.txt", "[verl.plugins]\nseqbalance = _seqbalance_switch\n")
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
