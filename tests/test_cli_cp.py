"""``seqbalance compare --cp-size``: CP plans side by side, in-process through ``main``."""

from __future__ import annotations

import json

import pytest

from seqbalance import workloads
from seqbalance.cli.commands import main
from seqbalance.planning.cp_baselines import megatron_cp, static_cp


def test_compare_cp_table_and_json(tmp_path, capsys):
    lengths = workloads.lengths("long-context", 400, seed=1)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    out = tmp_path / "cp.json"
    args = [
        "compare",
        str(src),
        "--dp",
        "2",
        "--max-tokens",
        "32768",
        "--cp-size",
        "8",
        "--model",
        "qwen2.5-7b",
        "--cp-bandwidth",
        "2.5e10",
        "--json",
        str(out),
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    for name in ("seqbalance", "static-cp", "megatron-cp"):
        assert name in text
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["setups"][0]["results"]}
    kw = {
        "cp_size": 8,
        "cost": "qwen2.5-7b",
        "cp_cost": {"bandwidth": 2.5e10, "cost_per_second": 4e14, "overlap": 0.5},
    }
    # the table's numbers are the library's plans, simulated with the same cost
    assert rows["static-cp"]["step_time"] == static_cp(lengths, 2, 32768, **kw).simulate().step_time
    assert rows["megatron-cp"]["step_time"] == (
        megatron_cp(lengths, 2, 32768, **kw).simulate().step_time
    )
    assert rows["seqbalance"]["vs_static"] <= 1 and rows["seqbalance"]["vs_megatron"] <= 1
    assert all(r["over_capacity"] == 0 for r in rows.values())


def test_compare_cp_errors(tmp_path, capsys):
    src = tmp_path / "lengths.txt"
    src.write_text("100\n200\n90000\n")
    assert main(["compare", str(src), "--dp", "1", "--max-tokens", "8192", "--cp-size", "4"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: sequence 2 has 90000 tokens") and "--cp-size=4 GPUs" in err
    assert main(["compare", str(src), "--dp", "1", "--max-tokens", "8192", "--cp-size", "3"]) == 2
    assert "--cp-size must be a power of two" in capsys.readouterr().err


@pytest.mark.slow
def test_demo_cp_runs(capsys):
    assert main(["compare", "--demo", "--cp-size", "8"]) == 0
    text = capsys.readouterr().out
    assert text.count("static-cp") == 3 and "long-context" in text and "long-mix" in text


def test_cp_options_without_cp_size_are_refused(tmp_path, capsys):
    # --cp-* options only act with --cp-size > 1; without it they used to be dropped silently.
    src = tmp_path / "lengths.txt"
    src.write_text("100\n200\n300\n")
    base = ["compare", str(src), "--dp", "1", "--max-tokens", "1000"]
    for extra in (["--cp-bandwidth", "1e9"], ["--cp", "static"], ["--cp-overlap", "0.3"],
                  ["--cost-per-second", "3"]):  # fmt: skip
        assert main(base + extra) == 2, extra
        err = capsys.readouterr().err
        assert err.startswith(f"error: {extra[0]}") and "--cp-size" in err, err
        assert "Traceback" not in err


def test_compare_cp_refuses_or_honours_the_plan_options(tmp_path, capsys):
    src = tmp_path / "lengths.txt"
    src.write_text("\n".join(["3000", "100", "200", "50", "700", "20"]) + "\n")
    base = ["compare", str(src), "--dp", "1", "--max-tokens", "1000", "--cp-size", "4"]
    # The CP strategies compared do not honour these: refused, as --padded is, not ignored.
    for extra in (["--size", "equal"], ["--extra-micro-batches", "2"]):
        for mode in ("static", "dynamic"):
            assert main([*base, *extra, "--cp", mode]) == 2, extra
            err = capsys.readouterr().err
            assert err.startswith("error: compare --cp-size does not take " + extra[0]), err
            assert "plan --cp-size C --cp static does" in err
    # These it does take: seqbalance's row keeps them.
    out = tmp_path / "cp.json"
    args = [*base, "--min-micro-batches", "3", "--micro-batch-multiple", "2", "--json", str(out)]
    assert main(args) == 0
    capsys.readouterr()
    rows = {r["strategy"]: r for r in json.loads(out.read_text())["setups"][0]["results"]}
    slots = rows["seqbalance"]["slots"]
    assert slots >= 3 and slots % 2 == 0, slots


@pytest.mark.slow
def test_compare_cp_row_is_the_plan_plan_would_make(tmp_path, capsys):
    # seqbalance's row is `plan(cp_size=C)` with the same options, --allow-empty included
    # (it used to allow empty GPU-slots always, so the table and `plan` could disagree).
    import seqbalance as sb

    lengths = workloads.lengths("long-context", 2048)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    cp_cost = {"bandwidth": 4e11, "cost_per_second": 4e14, "overlap": 0.5}
    for extra in ([], ["--allow-empty"]):
        out = tmp_path / f"cp{len(extra)}.json"
        args = ["compare", str(src), "--dp", "4", "--max-tokens", "32768", "--cp-size", "8",
                "--model", "qwen2.5-7b", "--cp-bandwidth", "4e11", "--json", str(out), *extra]
        assert main(args) == 0
        capsys.readouterr()
        row = next(r for r in json.loads(out.read_text())["setups"][0]["results"]
                   if r["strategy"] == "seqbalance")  # fmt: skip
        p = sb.plan(lengths, 4, 32768, cost="qwen2.5-7b", cp_size=8, cp="dynamic",
                    cp_cost=cp_cost, allow_empty=bool(extra))  # fmt: skip
        assert row["step_time"] == p.simulate().step_time
        assert row["empty"] == p.violations()["empty"]
        if not extra:
            assert row["empty"] == 0


def test_plan_cp_writes_the_library_cp_plan(tmp_path, capsys):
    import seqbalance as sb

    lengths = workloads.lengths("long-context", 300, seed=2)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    out = tmp_path / "plan.json"
    args = ["plan", str(src), "--dp", "2", "--max-tokens", "32768", "--cp-size", "8",
            "--model", "qwen2.5-7b", "--cp-bandwidth", "2.5e10", "--cp", "static",
            "--out", str(out)]  # fmt: skip
    assert main(args) == 0
    err = capsys.readouterr().err
    assert "2 replicas x 8 GPUs" in err and "static CP" in err and f"wrote {out}" in err
    want = sb.plan(lengths, 2, 32768, cost="qwen2.5-7b", cp_size=8, cp="static",
                   cp_cost={"bandwidth": 2.5e10, "cost_per_second": 4e14, "overlap": 0.5})
    assert out.read_text() == want.to_json()
    back = sb.Plan.from_json(str(out))
    assert back.cp_size == 8 and set(back.degrees()) == {8}


def test_plan_cp_errors(tmp_path, capsys):
    src = tmp_path / "lengths.txt"
    src.write_text("100\n200\n90000\n")
    base = ["plan", str(src), "--dp", "1", "--max-tokens", "8192"]
    assert main(base) == 2  # a sequence above the cap: the message offers CP
    assert "--cp-size C" in capsys.readouterr().err
    assert main([*base, "--cp-bandwidth", "1e9"]) == 2
    assert (
        "--cp-bandwidth only applies with --cp-size > 1 (context parallelism); pass "
        "--cp-size C, or drop it" in capsys.readouterr().err
    )
    assert main([*base, "--cp-size", "16", "--pp-size", "2"]) == 2
    # dynamic CP (the command line's default) gives a stage's GPUs different slots
    assert "only under --cp static (pipeline stages that are CP rings" in capsys.readouterr().err
    assert main([*base, "--cp-size", "16", "--padded"]) == 2
    assert "--padded does not combine with --cp-size > 1" in capsys.readouterr().err
    assert main([*base, "--cp-size", "16"]) == 0  # 90,000 tokens over 16 GPUs fit


def test_bad_cp_values_are_named_by_their_flags(tmp_path, capsys):
    # They were refused in the library's words: "overlap = 2.0 is invalid", "bandwidth must
    # be > 0 bytes/s (or None for free communication)".
    src = tmp_path / "lengths.txt"
    src.write_text("100\n200\n90000\n")
    for command in ("plan", "compare"):
        base = [command, str(src), "--dp", "1", "--max-tokens", "65536", "--cp-size", "2"]
        for extra, words in (
            (["--cp-overlap", "2"], "error: --cp-overlap 2.0 is invalid; it must be in [0, 1]"),
            (["--cp-bandwidth", "-1"], "error: --cp-bandwidth -1.0 is invalid"),
            (["--cp-bandwidth", "0"], "error: --cp-bandwidth must be > 0 bytes/s (leave it "
                                      "out for free communication)"),
            (["--cp-bandwidth", "1e9", "--cost-per-second", "-3"],
             "error: --cost-per-second -3.0 is invalid"),
        ):  # fmt: skip
            assert main([*base, *extra]) == 2
            err = capsys.readouterr().err
            assert err.startswith(words), err


def test_plan_cp_with_a_seconds_cost_takes_the_kv_size_by_flag(tmp_path, capsys):
    """A calibrated or refit cost (seconds) knows no architecture: with --cp-bandwidth the
    K/V size must be given. It was refused in the library's words (kv_bytes_per_token=),
    with no flag to give it."""
    import seqbalance as sb
    from seqbalance.costs import QuadraticCost

    cost = QuadraticCost(per_token=2e-6, per_token_sq=4e-11, meta={"unit": "seconds"})
    cost_file = tmp_path / "cost.json"
    cost_file.write_text(cost.to_json())
    lengths = workloads.lengths("long-context", 200, seed=4)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    base = ["plan", str(src), "--dp", "2", "--max-tokens", "32768", "--cp-size", "8",
            "--cost", str(cost_file), "--cp-bandwidth", "2.5e9"]  # fmt: skip
    assert main(base) == 2
    assert capsys.readouterr().err.startswith(
        "error: with --cp-bandwidth and a cost that is not a model's FLOPs (--model), pass "
        "--kv-bytes-per-token"
    )
    assert main([*base, "--kv-bytes-per-token", "-1"]) == 2
    assert capsys.readouterr().err.startswith("error: --kv-bytes-per-token -1.0 is invalid")
    out = tmp_path / "plan.json"
    assert main([*base, "--kv-bytes-per-token", "1.2e5", "--out", str(out)]) == 0
    want = sb.plan(lengths, 2, 32768, cost=cost, cp_size=8, cp="dynamic",
                   cp_cost={"bandwidth": 2.5e9, "cost_per_second": 1.0, "overlap": 0.5,
                            "kv_bytes_per_token": 1.2e5})  # fmt: skip
    assert out.read_text() == want.to_json()
    # A token cost prices no communication unless the K/V size is given, and then needs
    # its tokens a second (it took 1: a second of transfer cost one token, next to free).
    tokens = ["plan", str(src), "--dp", "2", "--max-tokens", "32768", "--cp-size", "8",
              "--cp-bandwidth", "2.5e9", "--kv-bytes-per-token", "1.2e5"]  # fmt: skip
    assert main(tokens) == 2
    assert "with --cp-bandwidth and a token cost (its tokens a second are unknown), pass " \
        "--cost-per-second" in capsys.readouterr().err
    assert main([*tokens, "--cost-per-second", "1e4", "--out", str(out)]) == 0
    want = sb.plan(lengths, 2, 32768, cp_size=8, cp="dynamic",
                   cp_cost={"bandwidth": 2.5e9, "cost_per_second": 1e4, "overlap": 0.5,
                            "kv_bytes_per_token": 1.2e5})  # fmt: skip
    assert out.read_text() == want.to_json()


def test_plan_cp_comm_passes_by_flag(tmp_path, capsys):
    """A forward-only pass (reference log-probs) sends K/V around the ring once, not 3
    times: --cp-comm-passes reaches the planner's link, and needs a bandwidth."""
    import seqbalance as sb

    lengths = workloads.lengths("long-context", 200, seed=4)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    base = ["plan", str(src), "--dp", "2", "--max-tokens", "32768", "--cp-size", "8",
            "--model", "qwen2.5-7b"]  # fmt: skip
    assert main([*base, "--cp-comm-passes", "1"]) == 2
    assert capsys.readouterr().err.startswith(
        "error: --cp-comm-passes only acts on the CP ring, which is free without "
        "--cp-bandwidth"
    )
    assert main([*base, "--cp-bandwidth", "2.5e10", "--cp-comm-passes", "-1"]) == 2
    assert capsys.readouterr().err.startswith("error: --cp-comm-passes -1.0 is invalid")
    cost = sb.costs.FlopsCost.from_name("qwen2.5-7b")
    plans = {}
    for passes in (1.0, 3.0):
        out = tmp_path / f"plan{passes}.json"
        assert main([*base, "--cp-bandwidth", "2.5e10", "--cp-comm-passes", str(passes),
                     "--out", str(out)]) == 0  # fmt: skip
        want = sb.plan(lengths, 2, 32768, cost=cost, cp_size=8, cp="dynamic",
                       cp_cost={"bandwidth": 2.5e10, "cost_per_second": 4e14,
                                "overlap": 0.5, "comm_passes": passes})  # fmt: skip
        assert out.read_text() == want.to_json()
        plans[passes] = want
    # One pass over a slow link exposes less communication than three.
    assert plans[1.0].simulate().step_time < plans[3.0].simulate().step_time
    # Without --cp-size it is refused like the other CP options.
    assert main(["plan", str(src), "--dp", "2", "--max-tokens", "32768",
                 "--cp-comm-passes", "1"]) == 2  # fmt: skip
    assert "--cp-comm-passes" in capsys.readouterr().err


def test_compare_pipelines_of_static_cp_rings(tmp_path, capsys):
    """``--cp static --pp-size P``: every plan through the same pipeline, seqbalance's against
    the static plan made without the pipeline (at the schedule's multiple) and verl's
    micro-batching of the largest pieces, each in its own slot order; no megatron-cp (its
    stages' GPUs would run different slots)."""
    import numpy as np

    import seqbalance as sb
    from seqbalance.costs.context_parallel import balanced_layout, largest_piece_tokens
    from seqbalance.planning.cp_pipeline import CPPipelineSetup
    from seqbalance.planning.cp_plans import CPPlan
    from seqbalance.planning.pipeline import check_pipeline

    lengths = workloads.lengths("long-mix", 160, seed=3)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    out = tmp_path / "pp.json"
    argv = ["compare", str(src), "--dp", "2", "--max-tokens", "16384", "--cp-size", "4",
            "--cp", "static", "--pp-size", "2", "--model", "qwen2.5-7b", "--cp-bandwidth",
            "2.5e10", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "dp=2 x cp=4 x pp=2 (1f1b)" in text and "bubble" in text
    setup = json.loads(out.read_text())["setups"][0]
    assert setup["pipeline"] == {"pp_size": 2, "schedule": "1f1b", "virtual_stages": 1,
                                 "pp_comm": 0.0}  # fmt: skip
    rows = {r["strategy"]: r for r in setup["results"]}
    assert set(rows) == {"seqbalance", "static-cp", "verl-static-cp"}  # 1f1b runs any count
    kw = {"cost": "qwen2.5-7b", "cp_size": 4, "cp_cost": {"bandwidth": 2.5e10,
          "cost_per_second": 4e14, "overlap": 0.5, "comm_passes": 3.0}}  # fmt: skip
    pipe = CPPipelineSetup(check_pipeline(2))
    # static-cp: the static plan without the pipeline, run in its own order
    flat = sb.plan(lengths, 2, 16384, cp="static", **kw)
    mine = CPPlan(flat.pieces, flat.lengths, max_tokens=16384, cp_size=4, cp="static",
                  cp_cost=flat.cp_cost, pipeline=pipe)  # fmt: skip
    assert rows["static-cp"]["step_time"] == mine.simulate_pipeline().step_time
    # verl-static-cp: verl's micro-batches of the largest pieces, each sequence over the
    # replica's 4 GPUs in the balanced layout (built here from the baseline's grid)
    grid = sb.planning.baselines.verl(largest_piece_tokens(lengths, 4), 2, 16384).micro_batches
    pieces = [[[(int(i), s, e) for i in mb for s, e in balanced_layout(int(lengths[i]), 4)[g % 4]]
               for mb in grid[g // 4]] for g in range(8)]  # fmt: skip
    verl = CPPlan(pieces, lengths, max_tokens=16384, cp_size=4, cp="static",
                  cp_cost=flat.cp_cost, pipeline=pipe)  # fmt: skip
    assert rows["verl-static-cp"]["slots"] == len(grid[0])
    assert np.isclose(rows["verl-static-cp"]["step_time"], verl.simulate_pipeline().step_time)
    # seqbalance's row is the plan `plan` makes (the pipeline count search included)
    ours = sb.plan(lengths, 2, 16384, cp="static", pp_size=2, **kw)
    assert rows["seqbalance"]["step_time"] == ours.simulate_pipeline().step_time
    ref = rows["static-cp"]["step_time"]
    for r in rows.values():
        assert r["over_capacity"] == 0 and r["vs_static"] == r["step_time"] / ref
        assert r["lower_bound"] <= r["step_time"] * (1 + 1e-12)
    # seqbalance tried the flat plan too and orders exactly up to 8 slots: never slower
    if rows["seqbalance"]["slots"] <= 8:
        assert rows["seqbalance"]["step_time"] <= ref * (1 + 1e-12)
    # interleaved needs a multiple of pp_size: a baseline that misses it is left out, said
    argv[argv.index("--pp-size") + 1] = "3"
    assert main([*argv, "--schedule", "interleaved", "--virtual-stages", "2"]) == 0
    setup = json.loads(out.read_text())["setups"][0]
    for r in setup["results"]:
        assert r["slots"] % 3 == 0
    if len(grid[0]) % 3:
        assert [r["strategy"] for r in setup["results"]] == ["seqbalance", "static-cp"]
        assert "left out: verl-static-cp (1 slots, which the interleaved schedule cannot " \
            "run: not a multiple of 3)" in capsys.readouterr().out


def test_compare_pipelines_take_extra_counts_for_seqbalance(tmp_path, capsys):
    """A pipeline trades micro-batches for bubble, so ``--extra-micro-batches`` is honoured
    (seqbalance only, said in the header) with ``--pp-size`` and refused without it."""
    import pytest

    from seqbalance.planning.cp_baselines import verl_static_cp

    lengths = workloads.lengths("long-mix", 160, seed=3)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    out = tmp_path / "pp.json"
    argv = ["compare", str(src), "--dp", "2", "--max-tokens", "16384", "--cp-size", "4",
            "--cp", "static", "--model", "qwen2.5-7b", "--json", str(out)]  # fmt: skip
    steps = []
    for extra in ("0", "3"):
        assert main([*argv, "--pp-size", "2", "--extra-micro-batches", extra]) == 0
        rows = {r["strategy"]: r for r in json.loads(out.read_text())["setups"][0]["results"]}
        steps.append((rows["seqbalance"]["slots"], rows["seqbalance"]["step_time"]))
    assert "--extra-micro-batches apply to seqbalance only" in capsys.readouterr().out
    assert steps[1][0] >= steps[0][0] and steps[1][1] <= steps[0][1]
    assert main([*argv, "--extra-micro-batches", "3"]) == 2  # no pipeline: refused, as before
    assert "does not take --extra-micro-batches" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"sequence 0 .* largest piece has 25000 tokens"):
        verl_static_cp([100000, 10], 1, 16384, cp_size=4)
