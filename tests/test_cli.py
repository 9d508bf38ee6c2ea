"""Tests of the ``seqbalance`` command line (in-process through ``main`` and once as a process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from seqbalance import Note, workloads
from seqbalance.cli.commands import DEMO_SETUPS, main
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.planner import plan
from seqbalance.planning.plans import Plan

STRATEGIES = ["seqbalance", *BASELINES]


@pytest.fixture
def rl(tmp_path):
    """A small RL batch as a txt file and as a CSV with a group column."""
    w = workloads.load("rl-math", 256, seed=3)
    txt = tmp_path / "lengths.txt"
    txt.write_text("".join(f"{x}\n" for x in w.lengths))
    csv = tmp_path / "batch.csv"
    rows = "".join(f"{i},{x},p{g}\n" for i, (x, g) in enumerate(zip(w.lengths, w.groups)))
    csv.write_text("id,tokens,prompt\n" + rows)
    return w, txt, csv


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, no traceback
    assert err[0].startswith("error: ")
    return err[0]


# ---- plan ------------------------------------------------------------------------------


def test_plan_writes_a_valid_plan(rl, tmp_path, capsys):
    w, txt, _ = rl
    out = tmp_path / "plan.json"
    assert main(["plan", str(txt), "--dp", "4", "--max-tokens", "32768", "--out", str(out)]) == 0
    p = Plan.from_json(str(out))
    assert p.dp_size == 4
    assert p.lengths.tolist() == w.lengths.tolist()
    assert all(v == 0 for v in p.violations().values())
    assert sorted(p.order().tolist()) == list(range(256))
    tokens = p.microbatch_tokens()
    assert tokens.max() <= 32768
    # Same plan as the library makes; and the JSON round trip is exact.
    assert p == plan(w.lengths, 4, 32768)
    assert Plan.from_json(p.to_json()) == p
    err = capsys.readouterr().err
    assert "256 sequences -> 4 ranks x" in err and "wrote" in err


def test_plan_to_stdout_with_model_and_options(rl, capsys):
    w, txt, _ = rl
    argv = ["plan", str(txt), "--dp", "2", "--max-tokens", "32768", "--model", "qwen2.5-7b"]
    argv += ["--sync", "ddp", "--micro-batch-multiple", "4", "--padded"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    p = Plan.from_json(captured.out)
    assert p.sync == "ddp" and p.padded
    assert p.num_micro_batches % 4 == 0
    assert (p.microbatch_tokens() <= 32768).all()  # padded: count x longest
    # FLOPs, not tokens: a 4096-token sequence costs more than 4096 one-token ones.
    i = int(np.argmax(w.lengths))
    assert p.costs[i] > 1e9 * w.lengths[i]
    assert "training FLOPs of qwen2.5-7b" in captured.err


def test_plan_groups_column_keeps_groups_on_one_rank(rl, capsys):
    w, _, csv = rl
    argv = ["plan", str(csv), "--column", "tokens", "--groups-column", "prompt"]
    assert main([*argv, "--dp", "4", "--max-tokens", "32768"]) == 0
    p = Plan.from_json(capsys.readouterr().out)
    rank_of = np.empty(256, dtype=np.int64)
    for r in range(p.dp_size):
        rank_of[p.rank_indices(r)] = r
    for g in np.unique(w.groups):
        assert len(set(rank_of[w.groups == g].tolist())) == 1


def test_plan_cost_json(rl, tmp_path, capsys):
    _, txt, _ = rl
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"kind": "quadratic", "per_token": 2.0, "per_token_sq": 0.0}))
    assert main(["plan", str(txt), "--dp", "4", "--max-tokens", "32768", "--cost", str(cost)]) == 0
    p = Plan.from_json(capsys.readouterr().out)
    np.testing.assert_array_equal(p.costs, 2.0 * p.lengths)



@pytest.mark.parametrize(
    ("change", "shown"),
    [
        ({"comm_passes": -1}, "comm_passes = -1 is invalid; it must be finite and >= 0"),
        ({"cost_per_second": -3}, "cost_per_second = -3 is invalid"),
        ({"kind": "cubic"}, "cost kind 'cubic' is unknown"),
    ],
)
def test_a_bad_cost_file_is_named_in_its_own_words(rl, tmp_path, capsys, change, shown):
    """A bad value in a --cost file was reported as the flag of the same name
    (``--cp-comm-passes -1``), a flag the user never gave; the file is named instead."""
    from seqbalance.costs import FlopsCost, UlyssesCost

    _, txt, _ = rl
    doc = UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), 4, bandwidth=2.5e10).to_dict()
    cost = tmp_path / "sp.json"
    cost.write_text(json.dumps({**doc, **change}))
    for cmd in ("plan", "compare"):
        assert main([cmd, str(txt), "--dp", "4", "--max-tokens", "32768", "--cost", str(cost)]) == 2
        line = _error_line(capsys)
        assert line.startswith(f"error: {cost}: {shown}"), line
        assert "--cp-" not in line and "--cost-per-second" not in line, line


# ---- errors ----------------------------------------------------------------------------


def test_too_long_sequence_names_it(tmp_path, capsys):
    f = tmp_path / "l.txt"
    f.write_text("10\n50\n20\n")
    assert main(["plan", str(f), "--dp", "1", "--max-tokens", "40"]) == 2
    line = _error_line(capsys)
    assert "sequence 1 has 50 tokens" in line and "--max-tokens=40" in line


def test_too_long_sequences_named_before_the_count_checks(tmp_path, capsys):
    # 1,000 tokens over a cap of 100 also "need" 10 micro-batches that 4 sequences cannot
    # fill; the message must name the real problem, not suggest --allow-empty.
    f = tmp_path / "l.txt"
    f.write_text("100\n200\n300\n400\n")
    assert main(["plan", str(f), "--dp", "1", "--max-tokens", "100"]) == 2
    line = _error_line(capsys)
    assert "sequence 1 has 200 tokens" in line and "(and 2 more)" in line
    assert "--allow-empty" not in line


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["plan", "{missing}", "--dp", "2", "--max-tokens", "9"], "No such file"),
        (["plan", "{csv}", "--dp", "2", "--max-tokens", "40000"], "say which one"),
        (
            ["plan", "{csv}", "--column", "x", "--dp", "2", "--max-tokens", "40000"],
            "available columns: 'id', 'tokens', 'prompt'",
        ),
        (["plan", "{txt}", "--dp", "0", "--max-tokens", "40000"], "--dp must be >= 1"),
        (["plan", "{txt}", "--dp", "1000", "--max-tokens", "40000"], "--allow-empty"),
        (
            ["plan", "{txt}", "--dp", "2", "--max-tokens", "40000", "--model", "nope"],
            "unknown cost 'nope'",
        ),
        (["compare", "{txt}"], "needs --dp and --max-tokens"),
        (["compare"], "either a LENGTHS file or --demo"),
        (["compare", "{txt}", "--demo"], "either a LENGTHS file or --demo"),
    ],
)
def test_user_errors_exit_2_with_one_line(rl, tmp_path, capsys, argv, needle):
    _, txt, csv = rl
    paths = {"missing": str(tmp_path / "absent.txt"), "txt": str(txt), "csv": str(csv)}
    assert main([a.format(**paths) for a in argv]) == 2
    assert needle in _error_line(capsys)


def test_usage_errors_exit_2(rl, capsys):
    _, txt, _ = rl
    argv = ["plan", str(txt), "--dp", "2", "--max-tokens", "9", "--model", "a", "--cost", "b"]
    assert main(argv) == 2
    assert "not allowed with" in capsys.readouterr().err
    assert main(["plan", str(txt)]) == 2  # --dp and --max-tokens are required
    assert main([]) == 2
    assert main(["--help"]) == 0


# ---- compare ---------------------------------------------------------------------------


def test_compare_table_and_json(rl, tmp_path, capsys):
    w, txt, _ = rl
    out = tmp_path / "cmp.json"
    argv = ["compare", str(txt), "--dp", "4", "--max-tokens", "32768", "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    positions = [text.index(f"{name} ") for name in STRATEGIES]
    assert positions == sorted(positions)  # seqbalance first, then the baselines

    data = json.loads(out.read_text())
    assert data["format"] == "seqbalance.compare/1"
    (setup,) = data["setups"]
    assert (setup["n"], setup["dp"], setup["max_tokens"]) == (256, 4, 32768)
    rows = {r["strategy"]: r for r in setup["results"]}
    assert list(rows) == STRATEGIES
    # Recompute every step time and speedup from the library, independently of the CLI.
    plans = {"seqbalance": plan(w.lengths, 4, 32768)}
    plans.update({k: f(w.lengths, 4, 32768) for k, f in BASELINES.items()})
    ref = plans["sequential"].simulate().step_time
    for name, p in plans.items():
        sim = p.simulate()
        assert rows[name]["step_time"] == pytest.approx(sim.step_time)
        assert rows[name]["speedup_vs_sequential"] == pytest.approx(ref / sim.step_time)
        assert rows[name]["over_capacity"] == int((p.microbatch_tokens() > 32768).sum())
        assert rows[name]["idle_fraction"] == pytest.approx(sim.idle_fraction)
    assert rows["sequential"]["speedup_vs_sequential"] == pytest.approx(1.0)
    assert rows["seqbalance"]["over_capacity"] == 0
    assert f"{rows['seqbalance']['speedup_vs_sequential']:.2f}x" in text


def test_compare_plain_text_without_rich(rl, capsys, monkeypatch):
    _, txt, _ = rl
    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.console", None)
    monkeypatch.setitem(sys.modules, "rich.table", None)
    assert main(["compare", str(txt), "--dp", "4", "--max-tokens", "32768"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head = next(i for i, s in enumerate(lines) if s.startswith("strategy"))
    assert lines[head].split() == [
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
    assert set(lines[head + 1].replace(" ", "")) == {"-"}
    table = lines[head + 2 : head + 2 + len(STRATEGIES)]
    assert [row.split()[0] for row in table] == STRATEGIES
    assert len({len(row) for row in [lines[head], *table]}) == 1  # right-aligned columns


def test_compare_demo(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert main(["compare", "--demo", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for s in DEMO_SETUPS:
        assert f"{s.workload} (" in text and f"dp={s.dp}, max_tokens={s.max_tokens}" in text
    data = json.loads(out.read_text())
    assert [s["input"] for s in data["setups"]] == [s.workload for s in DEMO_SETUPS]
    for setup, s in zip(data["setups"], DEMO_SETUPS):
        rows = {r["strategy"]: r for r in setup["results"]}
        assert setup["n"] == s.n
        assert rows["seqbalance"]["over_capacity"] == rows["seqbalance"]["empty"] == 0
        # The demo is meant to show an FSDP speedup over the sequential default.
        assert rows["seqbalance"]["speedup_vs_sequential"] > 1.0


def test_compare_demo_falls_back_to_tokens(capsys, monkeypatch):
    import seqbalance.cli.commands as cli

    monkeypatch.setattr(cli, "DEMO_COST", "no-such-model")
    monkeypatch.setattr(cli, "DEMO_SETUPS", cli.DEMO_SETUPS[:1])
    assert main(["compare", "--demo"]) == 0
    captured = capsys.readouterr()
    # The note goes to stderr, as it does without --demo; stdout holds the tables.
    assert "unavailable" in captured.err and "using tokens" in captured.err
    assert "cost = tokens" in captured.out and "unavailable" not in captured.out


# ---- as a process ----------------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONHASHSEED": "random"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_python_dash_m_round_trip_and_determinism(rl, tmp_path):
    _, txt, _ = rl
    outs = []
    for k in range(2):
        out = tmp_path / f"p{k}.json"
        r = _run(
            "-m",
            "seqbalance",
            "plan",
            str(txt),
            "--dp",
            "4",
            "--max-tokens",
            "32768",
            "--model",
            "llama-3-8b",
            "--out",
            str(out),
        )
        assert r.returncode == 0, r.stderr
        outs.append(out.read_text())
    assert outs[0] == outs[1]  # same bytes from two processes
    assert Plan.from_json(outs[0]).num_sequences == 256

    bad = _run(
        "-m",
        "seqbalance.cli",
        "plan",
        str(tmp_path / "absent.txt"),
        "--dp",
        "2",
        "--max-tokens",
        "10",
    )
    assert bad.returncode == 2
    assert bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr


def test_cli_import_is_light():
    code = (
        "import sys; from seqbalance.cli.commands import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'matplotlib', 'rich', 'pyarrow') if m in sys.modules))"
    )
    r = _run("-c", code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_calibrate_is_wired():
    pytest.importorskip("seqbalance.costs.calibrate")
    r = _run("-m", "seqbalance", "calibrate", "--help")
    assert r.returncode == 0, r.stderr
    assert "calibrate" in r.stdout


def test_compare_pipeline_orders(rl, tmp_path, capsys):
    from seqbalance.planning.pipeline_plans import reorder

    w, txt, _ = rl
    out = tmp_path / "pp.json"
    argv = [
        "compare",
        str(txt),
        "--dp",
        "2",
        "--max-tokens",
        "32768",
        "--pp-size",
        "4",
        "--min-micro-batches",
        "6",
        "--json",
        str(out),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "pipeline:" in text and "light-ends" in text
    # Why seqbalance's row of the first table may trail a baseline's.
    assert "seqbalance plans for the pipeline step (the second table)" in text
    (setup,) = json.loads(out.read_text())["setups"]
    rows = {r["order"]: r for r in setup["pipeline"]}
    p = plan(w.lengths, 2, 32768, pp_size=4, min_micro_batches=6)
    assert rows["seqbalance"]["step_time"] == pytest.approx(p.simulate_pipeline().step_time)
    for name in ("input", "largest-first", "smallest-first", "light-ends"):
        ref = reorder(p, name).simulate_pipeline().step_time
        assert rows[name]["step_time"] == pytest.approx(ref)
        assert rows[name]["step_time"] >= rows["seqbalance"]["step_time"] * (1 - 1e-12)


def test_compare_pipeline_plot(rl, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    _, txt, _ = rl
    png = tmp_path / "pp.png"
    argv = [
        "compare",
        str(txt),
        "--dp",
        "2",
        "--max-tokens",
        "32768",
        "--pp-size",
        "2",
        "--schedule",
        "interleaved",
        "--virtual-stages",
        "2",
        "--plot",
        str(png),
    ]
    assert main(argv) == 0
    assert png.stat().st_size > 10_000
    assert (
        main(
            [
                "compare",
                str(txt),
                "--dp",
                "2",
                "--max-tokens",
                "32768",
                "--pp-size",
                "2",
                "--schedule",
                "interleaved",
            ]
        )
        == 2
    )
    # The library's message names flags, the schedule's value among them.
    assert (
        "--schedule interleaved needs --virtual-stages >= 2, got 1; pass the number of model "
        "chunks per stage, or use --schedule 1f1b" in capsys.readouterr().err
    )


@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--schedule", "gpipe"], "--schedule only applies with --pp-size > 1"),
        (["--virtual-stages", "2"], "--virtual-stages only applies with --pp-size > 1"),
        (
            ["--schedule", "interleaved", "--virtual-stages", "2", "--pp-comm", "1"],
            "--schedule, --virtual-stages, --pp-comm only apply with --pp-size > 1 (pipeline "
            "parallelism); pass --pp-size P, or drop them",
        ),
    ],
)
def test_pipeline_options_without_stages_are_refused(rl, capsys, command, extra, said):
    # `--schedule gpipe` alone was planned without a word, as if it had not been given.
    _, txt, _ = rl
    argv = [command, str(txt), "--dp", "2", "--max-tokens", "32768", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1


def test_plan_with_pipeline_writes_its_layout(rl, tmp_path, capsys):
    _, txt, _ = rl
    out = tmp_path / "plan.json"
    argv = ["plan", str(txt), "--dp", "2", "--max-tokens", "32768", "--pp-size", "2",
            "--schedule", "interleaved", "--virtual-stages", "2", "--out", str(out)]
    assert main(argv) == 0
    assert "pipeline: 2 stages, interleaved" in capsys.readouterr().err
    p = Plan.from_json(str(out))
    assert p.pipeline.spec.to_dict() == {"pp_size": 2, "schedule": "interleaved",
                                         "virtual_stages": 2}
    assert p.num_micro_batches % 2 == 0


def test_plan_pp_comm_reaches_the_plan(rl, tmp_path, capsys):
    _, txt, _ = rl
    out = tmp_path / "plan.json"
    argv = ["plan", str(txt), "--dp", "2", "--max-tokens", "32768", "--pp-size", "2",
            "--pp-comm", "0.25", "--out", str(out)]
    assert main(argv) == 0
    assert Plan.from_json(str(out)).pipeline.comm_per_token == 0.25
    # Without stages there is nothing to send: the library's error names the flag.
    argv = ["plan", str(txt), "--dp", "2", "--max-tokens", "32768", "--pp-comm", "0.25"]
    assert main(argv) == 2
    assert "--pp-comm" in capsys.readouterr().err


def test_compare_refuses_pipelines_with_dynamic_context_parallelism(rl, capsys):
    _, txt, _ = rl
    for command in ("compare", "plan"):
        argv = [command, str(txt), "--dp", "2", "--max-tokens", "32768", "--cp-size", "2",
                "--pp-size", "2"]  # fmt: skip
        assert main(argv) == 2
        assert (
            "combine with --cp-size > 1 only under --cp static (pipeline stages that are CP "
            "rings; dynamic CP gives the GPUs of a stage different slots); pass --cp static"
            in capsys.readouterr().err
        )


def test_outputs_never_overwrite_the_lengths_file_or_each_other(tmp_path, capsys):
    # `--out in.txt` replaced the lengths with plan JSON, exit 0; `--plot x` wrote x.png
    # and said "wrote x".
    src = tmp_path / "in.txt"
    src.write_text("100\n200\n300\n400\n")
    base = [str(src), "--dp", "2", "--max-tokens", "1000"]
    assert main(["plan", *base, "--out", str(src)]) == 2
    assert "would overwrite the lengths file" in capsys.readouterr().err
    assert src.read_text() == "100\n200\n300\n400\n"
    same = str(tmp_path / "x.png")
    assert main(["compare", *base, "--json", same, "--plot", same]) == 2
    assert "would overwrite the --json file" in capsys.readouterr().err
    assert main(["compare", *base, "--plot", str(tmp_path / "x")]) == 2
    assert "give the file an extension" in capsys.readouterr().err
    assert main(["compare", *base, "--json", "-"]) == 2  # it wrote a file named "-"
    assert "give --json a file name" in capsys.readouterr().err
    assert not list(tmp_path.glob("x*"))


def test_padded_summary_states_the_padded_minimum(tmp_path, capsys):
    # It said "capacity minimum 2" where padded bins need 3 (min_padded_bins).
    src = tmp_path / "in.txt"
    src.write_text("1000\n" * 3 + "10\n" * 30)
    assert main(["plan", str(src), "--dp", "1", "--max-tokens", "2000", "--padded",
                 "--out", str(tmp_path / "p.json")]) == 0  # fmt: skip
    assert "3 micro-batches of <= 2000 tokens (capacity minimum 3)" in capsys.readouterr().err
    p = Plan.from_json(str(tmp_path / "p.json"))
    assert p.min_micro_batches_bound() == 3
    assert plan([1000] * 3 + [10] * 30, 1, 2000).min_micro_batches_bound() == 2  # not padded


@pytest.mark.parametrize(
    ("message", "shown_as"),
    [
        (Note("argument", {"value": 0}, "{@dp_size} must be >= 1, got {value}"),
         "--dp must be >= 1, got 0"),
        (Note("argument", {"k": 3}, '{@size:"equal"} needs n divisible by {@k:{k}}'),
         "--size equal needs n divisible by --dp=3"),
        (Note("argument", {}, "pass {@allow_empty=True} or {@padded=True}"),
         "pass --allow-empty or --padded"),
        (Note("argument", {}, "raise {@cp_size or max_tokens}."),
         "raise --cp-size or --max-tokens."),
        # The user's own names are values or plain text, never terms: they stay as they are.
        (Note("columns", {"c": "'dp_size', 'k=3'"}, "available columns: {c}"),
         "available columns: 'dp_size', 'k=3'"),
        ("pp_size.txt:1: not a number", "pp_size.txt:1: not a number"),
        ("cp_size/lengths.txt: missing", "cp_size/lengths.txt: missing"),
        (Note("json", {"v": '{"dp_size":4}'}, "got {v}"), 'got {"dp_size":4}'),
    ],
)  # fmt: skip
def test_messages_name_flags_but_leave_the_users_names(message, shown_as):
    from seqbalance.cli.flags import shown

    assert shown(message) == shown_as


def test_a_cost_json_with_one_warning_string_gives_one_note(tmp_path, capsys):
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"kind": "quadratic", "per_token": 1, "per_token_sq": 0,
                                "meta": {"warnings": "fitted on one rank only"}}))  # fmt: skip
    src = tmp_path / "in.txt"
    src.write_text("100\n200\n300\n400\n")
    assert main(["plan", str(src), "--dp", "2", "--max-tokens", "1000", "--cost", str(cost),
                 "--out", str(tmp_path / "p.json")]) == 0  # fmt: skip
    notes = [ln for ln in capsys.readouterr().err.splitlines() if "fitted on" in ln]
    assert notes == [f"note: {cost}: fitted on one rank only"]
