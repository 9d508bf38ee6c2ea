"""What a new user meets on the first runs of the command line: every check comes before
the planning, errors name flags, the table fits the terminal, units are carried, and
``compare --padded`` pads the baselines too."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import seqbalance.cli._common as common
import seqbalance.cli.commands as cli
from seqbalance import workloads
from seqbalance.cli.checks import MAX_EMPTY_SLOTS, MAX_INT, UserError, check_sizes
from seqbalance.cli.commands import main
from seqbalance.costs import QuadraticCost
from seqbalance.costs import calibrate as cal
from seqbalance.costs.report import FitReport
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.planner import plan
from seqbalance.planning.simulation import Simulation


# Plot paths check that matplotlib imports before planning: without it (or with one that
# does not import, e.g. beside an older numpy) they report that instead.
def _matplotlib_imports() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


NEEDS_MATPLOTLIB = pytest.mark.skipif(not _matplotlib_imports(), reason="needs matplotlib")


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith("error: ") and "Traceback" not in err[0]
    return err[0]


@pytest.fixture
def txt(tmp_path):
    f = tmp_path / "lengths.txt"
    f.write_text("".join(f"{x}\n" for x in workloads.lengths("rl-math", 64, seed=1)))
    return str(f)


@pytest.fixture
def no_planning(monkeypatch):
    """Make any planning fail loudly: a check that passes this ran before the planning."""

    def refuse(*args, **kwargs):
        raise AssertionError("planned before checking the arguments")

    monkeypatch.setattr(cli, "plan", refuse)
    monkeypatch.setattr(cli, "BASELINES", {name: refuse for name in BASELINES})


# ---- compare --padded ------------------------------------------------------------------


def _padded_fsdp_step(micro_batches, lengths) -> float:
    """Sum over slots of the slowest rank, each micro-batch costing count x longest."""
    m = max(len(rank) for rank in micro_batches)
    step = 0
    for j in range(m):
        step += max(
            (len(rank[j]) * int(lengths[rank[j]].max()) if j < len(rank) and rank[j] else 0)
            for rank in micro_batches
        )
    return float(step)


def test_compare_padded_pads_every_strategy(txt, tmp_path, capsys):
    lengths = np.loadtxt(txt, dtype=np.int64)
    out = tmp_path / "cmp.json"
    argv = ["compare", txt, "--dp", "4", "--max-tokens", "32768", "--padded", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "--padded" in text and "then padded" in text
    (setup,) = json.loads(out.read_text())["setups"]
    assert setup["padded"] is True
    rows = {r["strategy"]: r for r in setup["results"]}
    # seqbalance: the library's padded plan, which respects count x longest <= max_tokens.
    own = plan(lengths, 4, 32768, padded=True)
    assert rows["seqbalance"]["step_time"] == pytest.approx(
        _padded_fsdp_step(own.micro_batches, lengths)
    )
    assert rows["seqbalance"]["over_capacity"] == 0
    # Baselines: their own micro-batches, costed and checked padded (recomputed by hand).
    for name, fn in BASELINES.items():
        mbs = fn(lengths, 4, 32768).micro_batches
        assert rows[name]["step_time"] == pytest.approx(_padded_fsdp_step(mbs, lengths))
        over = sum(len(mb) * int(lengths[mb].max()) > 32768 for rank in mbs for mb in rank if mb)
        assert rows[name]["over_capacity"] == over
    assert rows["sequential"]["speedup_vs_sequential"] == pytest.approx(1.0)


@NEEDS_MATPLOTLIB
def test_compare_padded_plot_marks_padded_capacity(txt, tmp_path, monkeypatch):
    seen = {}

    def fake_plot(plans, path, **kwargs):
        seen.update(plans=plans, **kwargs)

    import seqbalance.cli.plotting as plotting

    monkeypatch.setattr(plotting, "plot_timeline", fake_plot)
    argv = ["compare", txt, "--dp", "4", "--max-tokens", "32768", "--padded"]
    assert main([*argv, "--plot", str(tmp_path / "t.png")]) == 0
    assert all(p.padded for p in seen["plans"].values())
    assert seen["title"].endswith("padded")


# ---- numbers too large, sizes too large ------------------------------------------------


@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize(
    ("flag", "value"),
    [("--max-tokens", "99999999999999999999999"), ("--dp", str(10**30)), ("--max-tokens", "0")],
)
def test_huge_or_zero_numbers_are_one_line_errors(txt, capsys, no_planning, command, flag, value):
    args = {"--dp": "2", "--max-tokens": "32768", flag: value}
    assert main([command, txt, *(x for kv in args.items() for x in kv)]) == 2
    line = _error_line(capsys)
    assert flag in line
    assert ("too large" in line and str(MAX_INT) in line) or "must be >= 1" in line


def test_overflow_from_the_library_is_still_one_line(txt, capsys, monkeypatch):
    def overflow(*args, **kwargs):
        raise OverflowError("Python int too large to convert to C long")

    monkeypatch.setattr(cli, "plan", overflow)
    assert main(["plan", txt, "--dp", "2", "--max-tokens", "32768"]) == 2
    assert "too large" in _error_line(capsys)


def test_absurd_allow_empty_size_is_refused_up_front(txt, capsys, no_planning):
    argv = ["plan", txt, "--dp", "100000000", "--max-tokens", "32768", "--allow-empty"]
    assert main(argv) == 2
    line = _error_line(capsys)
    assert "100,000,000 micro-batches for 64 sequences" in line
    assert f"at most {MAX_EMPTY_SLOTS:,} ranks" in line


def test_allow_empty_within_the_limit_still_plans(tmp_path, capsys):
    f = tmp_path / "l.txt"
    f.write_text("5\n7\n9\n")
    assert main(["plan", str(f), "--dp", "64", "--max-tokens", "10", "--allow-empty"]) == 0
    assert json.loads(capsys.readouterr().out)["dp_size"] == 64


# ---- fewer groups (or sequences) than ranks --------------------------------------------


def test_fewer_groups_than_ranks_says_so(tmp_path, capsys, no_planning):
    f = tmp_path / "b.csv"
    f.write_text("n,g\n100,a\n200,a\n300,b\n50,b\n60,c\n")
    argv = ["plan", str(f), "--column", "n", "--groups-column", "g", "--dp", "4"]
    assert main([*argv, "--max-tokens", "1000"]) == 2
    line = _error_line(capsys)
    assert "3 groups for 4 ranks" in line and "1 rank would get no sequence" in line
    assert "--dp 3 or fewer" in line and "--allow-empty" in line
    assert "--max-tokens" not in line  # raising the capacity cannot help


def test_fewer_sequences_than_ranks_says_so(tmp_path, capsys, no_planning):
    f = tmp_path / "l.txt"
    f.write_text("5\n7\n9\n")
    assert main(["plan", str(f), "--dp", "5", "--max-tokens", "100"]) == 2
    line = _error_line(capsys)
    assert "3 sequences for 5 ranks: 2 ranks would get no sequence" in line
    assert "--max-tokens" not in line


def test_too_few_sequences_for_forced_micro_batches_names_the_flag(tmp_path, capsys):
    f = tmp_path / "l.txt"
    f.write_text("5\n7\n9\n")
    assert (
        main(["plan", str(f), "--dp", "1", "--max-tokens", "100", "--min-micro-batches", "5"]) == 2
    )
    line = _error_line(capsys)
    assert "3 sequences cannot fill 1 ranks x 5 micro-batches" in line
    assert "lower --min-micro-batches" in line and "--max-tokens" not in line


def test_too_few_sequences_for_the_capacity_suggests_raising_it(tmp_path, capsys):
    f = tmp_path / "l.txt"
    f.write_text("90\n90\n90\n")  # 270 tokens in 100-token micro-batches: 3 per rank, 6 slots
    assert main(["plan", str(f), "--dp", "2", "--max-tokens", "100"]) == 2
    assert "raise --max-tokens" in _error_line(capsys)


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 12), min_size=1, max_size=9),
    dp=st.integers(1, 5),
    cap=st.integers(12, 30),
    m_min=st.integers(1, 3),
    mult=st.integers(1, 2),
    grouped=st.booleans(),
    size=st.sampled_from(["free", "equal", "balanced"]),
)
def test_size_checks_never_refuse_a_plan_the_library_can_make(
    lengths, dp, cap, m_min, mult, grouped, size
):
    lens = np.asarray(lengths, dtype=np.int64)
    groups = np.arange(len(lengths)) // 2 if grouped else None
    kwargs = dict(min_micro_batches=m_min, micro_batch_multiple=mult, size=size)
    try:
        check_sizes(lens, groups, dp, cap, **kwargs)
    except UserError:
        with pytest.raises(ValueError):
            plan(lens, dp, cap, groups=groups, **kwargs)


# ---- checks before the computation -----------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--json", "{tmp}/no/such/dir/c.json"], "--json"),
        (["--json", "{tmp}"], "is a directory"),
        # A folder to be: abspath dropped the slash, and open() failed after planning.
        (["--json", "{tmp}/newdir/"], "names a folder (it ends in a path separator)"),
        (["--plot", "{tmp}/missing/t.png"], "--plot"),
        pytest.param(["--plot", "{tmp}/t.xyz"], "cannot draw a plot as .xyz",
                     marks=NEEDS_MATPLOTLIB),
        (["--plot", "{tmp}/t.png", "--max-ranks", "0"], "--max-ranks must be >= 1"),
        (["--max-ranks", "0"], "--max-ranks must be >= 1"),
    ],
)
def test_compare_checks_outputs_before_planning(txt, tmp_path, capsys, no_planning, extra, needle):
    argv = ["compare", txt, "--dp", "2", "--max-tokens", "32768"]
    assert main(argv + [a.format(tmp=tmp_path) for a in extra]) == 2
    assert needle in _error_line(capsys)


def test_compare_without_matplotlib_fails_before_planning(
    txt, tmp_path, capsys, no_planning, monkeypatch
):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    argv = ["compare", txt, "--dp", "2", "--max-tokens", "32768", "--plot", str(tmp_path / "t.png")]
    assert main(argv) == 2
    assert 'pip install ".[cli]"' in _error_line(capsys)


def test_plan_refuses_a_folder_as_out_before_planning(txt, tmp_path, capsys, no_planning):
    argv = ["plan", txt, "--dp", "2", "--max-tokens", "32768", "--out", f"{tmp_path}/newdir/"]
    assert main(argv) == 2
    assert "--out" in (line := _error_line(capsys)) and "names a folder" in line


def test_demo_checks_outputs_before_planning(tmp_path, capsys, no_planning):
    assert main(["compare", "--demo", "--plot", str(tmp_path / "nope" / "t.png")]) == 2
    assert "does not exist" in _error_line(capsys)


def test_plan_checks_out_before_planning(txt, tmp_path, capsys, no_planning):
    argv = [
        "plan",
        txt,
        "--dp",
        "2",
        "--max-tokens",
        "32768",
        "--out",
        str(tmp_path / "x" / "p.json"),
    ]
    assert main(argv) == 2
    assert "--out" in _error_line(capsys)


# ---- the table fits ---------------------------------------------------------------------


def _table_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, s in enumerate(lines) if s.startswith("strategy"))
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return lines[start:end]


def test_demo_table_fits_80_columns(capsys, monkeypatch):
    pytest.importorskip("rich")
    monkeypatch.setattr(cli, "DEMO_SETUPS", cli.DEMO_SETUPS[:2])
    assert main(["compare", "--demo"]) == 0
    table = _table_lines(capsys.readouterr().out)
    assert max(len(s) for s in table) <= 80, table
    assert table[1].strip("─ ") == ""  # the rule under the header


@pytest.mark.parametrize("columns", [72, 60])
def test_table_follows_a_narrow_terminal(txt, capsys, monkeypatch, columns):
    pytest.importorskip("rich")
    monkeypatch.setattr(common, "_terminal_width", lambda out: columns)
    assert main(["compare", txt, "--dp", "2", "--max-tokens", "32768"]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = _table_lines("\n".join(lines))
    # Names fold (down to 8 characters); every number and column stays whole.
    narrowest = 80 - len("cost-kk-uncapped") + 8
    assert max(len(s) for s in table) <= max(columns, narrowest)
    assert table[0].split() == [
        "strategy",
        "step",
        "time",
        "speedup",
        "gap",
        "mb/rank",
        "over",
        "cap",
        "empty",
        "idle",
    ]
    text = "\n".join(table)
    assert "cost-kk-" in text and "capped\n" in text.replace(" ", "") + "\n"  # folded, not cut
    prose = [s for s in lines if s and s not in table]
    assert max(len(s) for s in prose) <= columns  # headers wrap at word boundaries


def test_table_to_a_file_is_never_wrapped(txt, tmp_path, monkeypatch):
    pytest.importorskip("rich")
    import io

    buf = io.StringIO()
    rows = [["a-strategy-name-" * 6, "1.0 s"]]
    common._table(["strategy", "step time"], rows, buf)
    assert rows[0][0] in buf.getvalue()  # one line, whatever its length


# ---- units of a calibrated cost --------------------------------------------------------


@pytest.mark.parametrize(
    ("x", "text"),
    [
        (0.0123, "12.3 ms"),
        (4.5678, "4.57 s"),
        (4567.8, "4,568 s"),
        (5e-6, "5 \u00b5s"),
        (0.0, "0 s"),
    ],
)
def test_seconds_format(x, text):
    assert common._si(x, "s") == text


@pytest.mark.parametrize(
    ("x", "unit", "text"),
    [
        (4.2e16, "FLOP", "42.0 PFLOP"),
        (609075, "tok", "609.1 ktok"),
        (12.0, "", "12"),
        # Beyond the largest prefix the number was printed in full, 300 digits long.
        (1.6046e305, "tok", "1.6e+305 tok"),
        (2.5e21, "FLOP", "2.5e+21 FLOP"),
        (float("inf"), "", "inf"),
    ],
)
def test_si_format(x, unit, text):
    assert common._si(x, unit) == text


def _calibrated(tmp_path, warnings=()):
    meta = {"unit": "seconds", "model": "tiny-llama", "device": "cpu (x86_64, 1 threads)"}
    if warnings:
        meta["warnings"] = list(warnings)
    cost = QuadraticCost(1e-6, 1e-10, 1e-5, 2e-3, meta=meta)
    path = tmp_path / "cost.json"
    cost.save(path)
    return str(path)


@NEEDS_MATPLOTLIB
def test_calibrated_cost_unit_reaches_table_json_and_plot(txt, tmp_path, capsys, monkeypatch):
    seen = {}
    import seqbalance.cli.plotting as plotting

    monkeypatch.setattr(plotting, "plot_timeline", lambda plans, path, **kw: seen.update(kw))
    out = tmp_path / "c.json"
    argv = ["compare", txt, "--dp", "2", "--max-tokens", "32768", "--cost", _calibrated(tmp_path)]
    assert main([*argv, "--json", str(out), "--plot", str(tmp_path / "t.png")]) == 0
    text = capsys.readouterr().out
    assert "cost=calibrated seconds of tiny-llama on cpu" in text
    (setup,) = json.loads(out.read_text())["setups"]
    assert setup["unit"] == "seconds"
    step = setup["results"][0]["step_time"]
    assert common._seconds(step) in text
    assert seen["unit"] == "seconds"


def test_plan_summary_in_seconds(txt, tmp_path, capsys):
    argv = ["plan", txt, "--dp", "2", "--max-tokens", "32768", "--cost", _calibrated(tmp_path)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "(calibrated seconds of tiny-llama on cpu" in err
    assert " ms (" in err or " s (" in err


def test_cost_with_fit_warnings_is_noted(txt, tmp_path, capsys):
    path = _calibrated(tmp_path, ["the fit explains the timings poorly (R^2 -0.09 fit)"])
    assert main(["plan", txt, "--dp", "2", "--max-tokens", "32768", "--cost", path]) == 0
    assert f"note: {path}: the fit explains the timings poorly" in capsys.readouterr().err


# ---- calibrate -------------------------------------------------------------------------

COEFS = {"per_microbatch": 1e-3, "per_sequence": 0.0, "per_token": 1e-6, "per_token_sq": 0.0}


def test_calibrate_without_torch_exits_2_with_one_error_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    assert main(["calibrate", "--model", "llama-2-7b"]) == 2
    line = _error_line(capsys)
    assert line.startswith("error: seqbalance calibrate needs PyTorch")
    assert line.count("seqbalance calibrate") == 1  # no doubled prefix
    assert 'pip install ".[torch]"' in line


def _fake_calibration(monkeypatch, report):
    monkeypatch.setattr(cal, "_import_torch", lambda: None)
    cost = QuadraticCost(
        1e-6,
        0.0,
        0.0,
        1e-3,
        meta={
            "unit": "seconds",
            "model": "tiny",
            "device": "cpu",
            "dtype": "float32",
            "layers_timed": [0],
            "num_layers": 2,
            "attention": "sdpa",
            "flops_b_over_c": 1000.0,
        },
        report=report,
    )
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: (cost, report))


def test_calibrate_warns_on_a_poor_fit_and_records_it(monkeypatch, tmp_path, capsys):
    poor = FitReport(-0.09, 0.9, 0.3, 30, COEFS, holdout=FitReport(0.95, 0.1, 0.05, 10, COEFS))
    _fake_calibration(monkeypatch, poor)
    out = tmp_path / "cost.json"
    assert main(["calibrate", "--model", "llama-2-7b", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: the fit explains the timings poorly (R^2 -0.09 fit;" in err
    assert "held out" not in err.split("warning:")[1].split(";")[0]  # 0.95 held out is fine
    saved = json.loads(out.read_text())
    assert saved["meta"]["warnings"] and "R^2 -0.09" in saved["meta"]["warnings"][0]


def test_calibrate_good_fit_has_no_warning(monkeypatch, tmp_path, capsys):
    good = FitReport(0.999, 0.02, 0.01, 30, COEFS, holdout=FitReport(0.99, 0.03, 0.01, 10, COEFS))
    _fake_calibration(monkeypatch, good)
    out = tmp_path / "cost.json"
    assert main(["calibrate", "--model", "llama-2-7b", "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert "warnings" not in json.loads(out.read_text())["meta"]


def test_fit_warnings_thresholds():
    ok = FitReport(cal.MIN_R2, 0.1, 0.1, 10, COEFS)
    assert cal.fit_warnings(ok) == [] and cal.fit_warnings(None) == []
    bad_holdout = FitReport(0.99, 0.1, 0.1, 10, COEFS, holdout=FitReport(0.5, 1, 1, 3, COEFS))
    (w,) = cal.fit_warnings(bad_holdout)
    assert "0.50 held out" in w and "0.99" not in w
    assert cal.fit_warnings(FitReport(float("nan"), 0.1, 0.1, 10, COEFS))


def test_calibrate_checks_out_before_timing(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cal, "_import_torch", lambda: None)

    def refuse(*a, **k):
        raise AssertionError("timed before checking --out")

    monkeypatch.setattr(cal, "calibrate", refuse)
    out = tmp_path / "missing" / "cost.json"
    assert main(["calibrate", "--model", "llama-2-7b", "--out", str(out)]) == 2
    assert "--out" in _error_line(capsys)


# ---- messages in flags, not Python -----------------------------------------------------


def test_library_messages_are_translated_to_flags():
    from seqbalance._notes import Note
    from seqbalance.cli.flags import shown
    from seqbalance.partitioning import partition

    with pytest.raises(ValueError) as info:
        partition([1, 2, 3], 2, size="equal", groups=[0, 1, 2])
    raw = str(info.value)
    assert 'size="equal"' in raw  # the library speaks Python ...
    text = shown(info.value)
    assert "--size equal" in text and "--size balanced" in text  # ... the CLI speaks flags
    assert "size=" not in text and "k=" not in text
    note = Note("x", {}, "pass {@allow_empty=True}; {@padded=True}; under {@size:'free'} and "
                "{@groups}")  # fmt: skip
    assert str(note) == "pass allow_empty=True; padded=True; under size='free' and groups"
    assert shown(note) == "pass --allow-empty; --padded; under --size free and --groups-column"


def test_size_equal_error_speaks_flags(tmp_path, capsys):
    f = tmp_path / "b.csv"
    f.write_text("n,g\n100,a\n200,a\n300,b\n50,b\n60,c\n")
    argv = ["plan", str(f), "--column", "n", "--groups-column", "g", "--dp", "2"]
    assert main([*argv, "--max-tokens", "1000", "--size", "equal"]) == 2
    line = _error_line(capsys)
    assert "--size equal" in line and "--size balanced" in line and "size=" not in line
    g = tmp_path / "l.txt"
    g.write_text("1\n2\n3\n")
    assert main(["plan", str(g), "--dp", "2", "--max-tokens", "10", "--size", "equal"]) == 2
    line = _error_line(capsys)
    assert "--size equal needs the number of sequences (3) to be a multiple of --dp (2)" in line


# ---- Simulation repr --------------------------------------------------------------------


def test_simulation_repr_is_short():
    p = plan(workloads.lengths("sft-chat", 4096), 64, 32768)
    sim = p.simulate()
    text = repr(sim)
    assert len(text) < 200 and "array" not in text
    assert text.startswith("Simulation(sync='fsdp', step_time=")
    assert f"dp=64, micro_batches={p.num_micro_batches})" in text
    assert isinstance(sim, Simulation)


def test_every_int_flag_is_range_checked():
    # check_numbers knows every integer flag the parser has (a new flag must be added there).
    from seqbalance.cli.checks import INT_FLAGS

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    known = {flag for flag, _, _ in INT_FLAGS}
    for name in ("plan", "compare"):
        ints = [a for a in sub.choices[name]._actions if a.type is int]
        assert ints
        for action in ints:
            assert set(action.option_strings) & known, action.option_strings
