"""The top-level package: every public name importable, and the core stays light."""

from __future__ import annotations

import subprocess
import sys

import seqbalance


def test_core_names_importable():
    core = [n for n in seqbalance.__all__ if n not in seqbalance._TORCH_NAMES]
    for name in core:
        assert getattr(seqbalance, name) is not None


def test_import_pulls_in_no_heavy_dependency():
    code = (
        "import sys, seqbalance, seqbalance.cli; "
        "heavy = ('torch', 'matplotlib', 'rich', 'pyarrow', 'scipy'); "
        "heavy = [m for m in heavy if m in sys.modules]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_core_works_without_torch():
    # Make `import torch` fail, as on a machine without it.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import seqbalance\n"
        "p = seqbalance.plan([100, 200, 300, 400], 2, 1000)\n"
        "assert p.num_micro_batches == 1\n"
        "try:\n"
        "    seqbalance.rebalance\n"
        "except ImportError as exc:\n"
        "    print('needs torch:', exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert 'pip install ".[torch]"' in out.stdout


def test_unknown_attribute():
    try:
        seqbalance.no_such_name  # noqa: B018
    except AttributeError as exc:
        assert "no_such_name" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")
