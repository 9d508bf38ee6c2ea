"""Installing and first use: the test extra leaves torch out, CI still runs the torch tests,
install hints work from a checkout, and the core works without torch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def _extras() -> dict[str, list[str]]:
    """``[project.optional-dependencies]`` of pyproject.toml."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    try:
        import tomllib
    except ImportError:  # Python < 3.11
        tomllib = pytest.importorskip("tomli", reason="reading pyproject.toml needs tomli")
    return tomllib.loads(text)["project"]["optional-dependencies"]


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", README, flags=re.S)


def test_test_extra_does_not_pull_torch():
    # A pinned torch resolves to the multi-GB CUDA build on a normal Linux machine and
    # replaces the user's own torch.
    names = [re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower() for req in _extras()["test"]]
    assert "torch" not in names, names
    assert {"pytest", "hypothesis"} <= set(names)


def test_torch_extra_is_unpinned():
    (req,) = _extras()["torch"]
    assert req.startswith("torch>="), req  # any torch the user already has will do


def test_ci_runs_exactly_the_readme_test_command_after_installing_torch():
    test_cmd = 'pip install -e ".[test]" && python -m pytest'
    assert test_cmd in _readme_commands()
    lines = [ln.strip() for ln in (ROOT / ".ci" / "run").read_text().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("#")]
    assert test_cmd in lines
    torch_lines = [i for i, ln in enumerate(lines) if re.match(r"pip install .*torch", ln)]
    assert torch_lines and torch_lines[0] < lines.index(test_cmd), "install torch first"


def test_readme_says_how_to_get_a_cpu_only_torch():
    assert CPU_TORCH in README.replace("\n", " ")


def test_install_hints_work_from_a_checkout():
    # "seqbalance[cli]" is not on the package index yet; ".[cli]" works in a checkout.
    offenders = []
    for path in [*(ROOT / "src").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"pip install [\"'`]?seqbalance\[", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _without_torch(code: str) -> subprocess.CompletedProcess[str]:
    prelude = "import sys; sys.modules['torch'] = None  # as if torch were not installed\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=60
    )


def test_star_import_works_without_torch():
    out = _without_torch(
        "from seqbalance import *\n"
        "print(plan([100, 200, 300, 400], 2, 1000).num_micro_batches)\n"
        "print('torch' in sys.modules and sys.modules['torch'] is not None)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["1", "False"]


def test_torch_names_still_reachable_and_say_how_to_install():
    out = _without_torch(
        "import seqbalance\n"
        "try:\n"
        "    seqbalance.rebalance\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert out.returncode == 0, out.stderr
    assert 'pip install ".[torch]"' in out.stdout and CPU_TORCH in out.stdout


def test_star_import_exports_only_names_that_exist():
    import seqbalance

    for name in seqbalance.__all__:
        assert name not in seqbalance._TORCH_NAMES
        assert hasattr(seqbalance, name), name


def test_without_torch_the_torch_tests_skip_with_the_reason():
    # A pytest run with torch hidden: torch tests skip and say why, the doctests of
    # seqbalance.torch are not collected (they would fail to import), the header says so.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import pytest\n"
        "sys.exit(pytest.main(['-rs', '-p', 'no:cacheprovider', '-p', 'no:randomly', "
        "'tests/test_torch_loss.py', 'src/seqbalance/torch']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode in (0, 5), out.stdout + out.stderr  # 5: everything skipped
    assert "torch is not installed" in out.stdout  # the header
    assert re.search(r"SKIPPED .*needs torch \(not in the test extra\)", out.stdout), out.stdout
    assert "error" not in out.stdout.lower(), out.stdout
