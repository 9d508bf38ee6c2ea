"""``plan`` / ``compare`` with ``--sp-size``: Ulysses groups on the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from seqbalance import workloads
from seqbalance.cli.commands import main
from seqbalance.costs import (
    FlopsCost,
    QuadraticCost,
    TimingRecorder,
    TokenCost,
    UlyssesCost,
    load_cost,
    ulysses_sp_size,
)
from seqbalance.costs.feedback import records_from_plan
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.planner import plan
from seqbalance.planning.plans import Plan

QWEN = FlopsCost.from_name("qwen2.5-7b")  # 28 heads, 4 K/V heads: sp 2, 4 or 28


@pytest.fixture
def long_tail(tmp_path):
    """rl-math lengths, several longer than one GPU's 8k tokens."""
    lengths = workloads.lengths("rl-math", 256, seed=5)
    assert (lengths > 8192).sum() > 3
    path = tmp_path / "lengths.txt"
    path.write_text("".join(f"{x}\n" for x in lengths))
    return lengths, path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def test_plan_is_the_library_plan_of_the_group(long_tail, tmp_path, capsys):
    """--dp groups of --sp-size GPUs, --max-tokens a GPU: the plan of sp x max_tokens a
    micro-batch under the UlyssesCost, with the sequences longer than one GPU's budget."""
    lengths, path = long_tail
    out = tmp_path / "p.json"
    assert main(["plan", str(path), "--dp", "4", "--max-tokens", "8192", "--model",
                 "qwen2.5-7b", "--sp-size", "4", "--sp-bandwidth", "2.5e10",
                 "--out", str(out)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    got = Plan.from_json(out.read_text())
    cost = UlyssesCost(QWEN, 4, bandwidth=2.5e10)
    want = plan(lengths, 4, 4 * 8192, cost=cost)
    assert got.micro_batches == want.micro_batches
    np.testing.assert_array_equal(got.costs, want.costs)
    assert got.max_tokens == 32768 and got.microbatch_tokens().max() > 8192
    assert "4 groups x 4 GPUs (Ulysses)" in err and "32768 tokens a group, 8192 a GPU" in err
    assert "one GPU's share of Ulysses sp=4 (all-to-all at 2.5e+10 B/s)" in err
    # The same flags and --sync ddp, a pipeline: every planner option passes through.
    assert main(["plan", str(path), "--dp", "2", "--max-tokens", "12288", "--model",
                 "qwen2.5-7b", "--sp-size", "2", "--sync", "ddp", "--pp-size", "2",
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    got = Plan.from_json(out.read_text())
    want = plan(lengths, 2, 2 * 12288, cost=UlyssesCost(QWEN, 2), sync="ddp", pp_size=2)
    assert got.micro_batches == want.micro_batches


def test_a_token_cost_prices_no_all_to_all(long_tail, tmp_path, capsys):
    """Without --model the all-to-all has no head sizes: it is free (as --cp-bandwidth
    with tokens), so a bandwidth changes neither the plan nor its costs."""
    _, path = long_tail
    docs = []
    for extra in ([], ["--sp-bandwidth", "1e9"]):
        out = tmp_path / f"p{len(extra)}.json"
        assert main(["plan", str(path), "--dp", "4", "--max-tokens", "12288", "--sp-size",
                     "2", *extra, "--out", str(out)]) == 0  # fmt: skip
        docs.append(Plan.from_json(out.read_text()))
    assert docs[0].micro_batches == docs[1].micro_batches
    np.testing.assert_array_equal(docs[0].costs, docs[1].costs)
    np.testing.assert_array_equal(docs[0].costs, docs[0].lengths / 2)


def test_compare_rows_are_the_strategies_under_the_group_cost(long_tail, tmp_path, capsys):
    lengths, path = long_tail
    out = tmp_path / "c.json"
    assert main(["compare", str(path), "--dp", "4", "--max-tokens", "8192", "--model",
                 "qwen2.5-7b", "--sp-size", "4", "--sp-bandwidth", "2.5e10",
                 "--json", str(out)]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "dp=4 x sp=4, max_tokens=8192/GPU" in text
    setup = json.loads(out.read_text())["setups"][0]
    # max_tokens is a GPU's, as given (and as in CP's JSON); the group's is beside it.
    assert setup["sp_size"] == 4 and setup["max_tokens"] == 8192
    assert setup["group_max_tokens"] == 32768
    cost = UlyssesCost(QWEN, 4, bandwidth=2.5e10)
    steps = {r["strategy"]: r["step_time"] for r in setup["results"]}
    for name in ("verl", "areal", "sequential"):
        p = BASELINES[name](lengths, 4, 32768, cost=cost, sync="fsdp")
        assert steps[name] == pytest.approx(p.simulate(sync="fsdp").step_time, rel=1e-12)
    # The strategies that pack to a capacity keep the group's (token-kk, slime-flops and
    # cost-kk-uncapped balance counts or costs only, and go over it here).
    over = {r["strategy"]: r["over_capacity"] for r in setup["results"]}
    assert [over[k] for k in ("seqbalance", "sequential", "token-ffd", "areal", "verl")] == [0] * 5
    # Without --sp-size the setup is as before.
    assert main(["compare", str(path), "--dp", "4", "--max-tokens", "32768",
                 "--json", str(out)]) == 0  # fmt: skip
    plain = json.loads(out.read_text())["setups"][0]
    assert "sp_size" not in plain and "group_max_tokens" not in plain
    assert plain["max_tokens"] == 32768


def test_compare_demo_takes_sp_size(capsys):
    assert main(["compare", "--demo", "--sp-size", "4"]) == 0
    text = capsys.readouterr().out
    assert "rl-math" in text and "dp=8 x sp=4, max_tokens=32768/GPU" in text
    assert "one GPU's share of Ulysses sp=4 (free all-to-all)" in text


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--sp-bandwidth", "1e10"], "--sp-bandwidth only applies with --sp-size > 1"),
        (["--sp-size", "2", "--sp-comm-passes", "1"],
         "--sp-comm-passes only acts on the all-to-all, which is free without --sp-bandwidth"),
        (["--sp-size", "2", "--cost-per-second", "5"],
         "--cost-per-second only acts on the all-to-all, which is free without --sp-bandwidth"),
        (["--cost-per-second", "5", "--cp-overlap", "0.3"],
         "--cost-per-second only applies with --cp-size > 1 or --sp-size > 1"),
        (["--sp-size", "2", "--sp-bandwidth", "0"], "--sp-bandwidth must be finite and > 0"),
        (["--sp-size", "2", "--sp-bandwidth", "1e9", "--sp-bytes-per-token", "-1"],
         "--sp-bytes-per-token must be finite and >= 0, got -1"),
        (["--sp-size", "0"], "--sp-size must be >= 1, got 0"),
        (["--sp-size", "3", "--model", "qwen2.5-7b"],
         "qwen2.5-7b has 28 heads, not a multiple of --sp-size=3; use --sp-size 2, 4, 28"),
        (["--cost-per-second", "1e9"],
         "--cost-per-second only applies with --cp-size > 1 or --sp-size > 1"),
    ],
)  # fmt: skip
def test_refusals_name_the_flags(long_tail, capsys, args, shown):
    _, path = long_tail
    argv = ["plan", str(path), "--dp", "2", "--max-tokens", "16384", *args]
    assert main(argv) == 2
    line = _error_line(capsys)
    assert shown in line, line


def test_a_sequence_longer_than_the_group_is_named_with_both_flags(long_tail, capsys):
    lengths, path = long_tail
    over = np.flatnonzero(lengths > 8192)
    assert main(["plan", str(path), "--dp", "2", "--max-tokens", "4096", "--sp-size", "2"]) == 2
    assert _error_line(capsys) == (
        f"error: sequence {over[0]} has {lengths[over[0]]} tokens, more than --sp-size x "
        f"--max-tokens=8192 (and {over.size - 1} more): raise --max-tokens or --sp-size, or "
        "split or truncate such sequences"
    )


def test_costs_that_cannot_price_the_all_to_all_are_refused(long_tail, tmp_path, capsys):
    _, path = long_tail
    base = ["plan", str(path), "--dp", "2", "--max-tokens", "16384"]
    quad = tmp_path / "q.json"
    quad.write_text(json.dumps(QuadraticCost(1.0, 1e-5).to_dict()))
    assert main([*base, "--cost", str(quad), "--sp-size", "2", "--sp-bandwidth", "1e9"]) == 2
    assert "pass --sp-bytes-per-token" in _error_line(capsys)
    # A FLOP count without an architecture cannot size the all-to-all either.
    flop = tmp_path / "flop.json"
    flop.write_text(json.dumps({**QuadraticCost(1.0, 1e-5).to_dict(), "meta": {"unit": "FLOP"}}))
    assert main([*base, "--cost", str(flop), "--sp-size", "2", "--sp-bandwidth", "1e9"]) == 2
    assert "pass --sp-bytes-per-token" in _error_line(capsys)
    # Units other than FLOP and seconds: seconds of transfer cannot be added to the cost
    # without a rate (CP's ring too, where 1 cost unit a second was taken); nor to tokens
    # when the bytes a token are given (tokens a second are unknown).
    ms = tmp_path / "ms.json"
    ms.write_text(json.dumps({**QuadraticCost(1.0, 1e-5).to_dict(), "meta": {"unit": "ms"}}))
    for cost, what in ((["--cost", str(quad)], "a --cost of unknown units"),
                       (["--cost", str(ms)], "a --cost in unknown units ('ms')"),
                       ([], "a token cost (its tokens a second are unknown)")):
        for flags in (["--sp-size", "2", "--sp-bandwidth", "1e9", "--sp-bytes-per-token", "10"],
                      ["--cp-size", "2", "--cp-bandwidth", "1e9", "--kv-bytes-per-token", "10"]):
            assert main([*base, *cost, *flags]) == 2
            line = _error_line(capsys)
            assert f"with {flags[2]} and {what}" in line and "pass --cost-per-second" in line, line
            assert main([*base, *cost, *flags, "--cost-per-second", "1e3",
                         "--out", str(tmp_path / "p.json")]) == 0  # fmt: skip
            capsys.readouterr()


def test_a_cost_that_is_already_a_gpus_share_is_not_divided_again(long_tail, tmp_path, capsys):
    """A refit of timings taken under Ulysses is one GPU's share: --sp-size S plans with it
    as it is (S x --max-tokens a group), another S is refused, and without --sp-size a
    note says what it is. It was divided by S a second time."""
    lengths, path = long_tail
    rec = TimingRecorder(UlyssesCost(QWEN, 4, bandwidth=2.5e10), sync="ddp")
    truth = QuadraticCost(per_token=3e-6, per_token_sq=2e-11, per_sequence=1e-4,
                          per_microbatch=2e-3)  # fmt: skip
    for step in range(6):
        batch = workloads.lengths("rl-math", 64, seed=step)
        p = plan(batch, 2, 4 * 8192, cost=rec.cost)
        secs = [[truth.microbatch_cost(batch[mb]) for mb in rank] for rank in p.micro_batches]
        rec.extend(records_from_plan(p.micro_batches, batch, secs, step))
    saved = rec.save(tmp_path / "sp.jsonl")
    fitted = tmp_path / "fit.json"
    assert main(["refit", str(saved), "--out", str(fitted)]) == 0
    capsys.readouterr()
    cost = load_cost(str(fitted))
    assert cost.meta["ulysses_sp_size"] == 4 and ulysses_sp_size(cost) == 4
    base = ["plan", str(path), "--dp", "2", "--max-tokens", "8192", "--cost", str(fitted)]
    out = tmp_path / "p.json"
    assert main([*base, "--sp-size", "4", "--out", str(out)]) == 0
    assert "one GPU's share (Ulysses sp=4)" in capsys.readouterr().err
    got = Plan.from_json(out.read_text())
    want = plan(lengths, 2, 4 * 8192, cost=cost)  # the cost as it is, the group's capacity
    assert got.micro_batches == want.micro_batches
    np.testing.assert_array_equal(got.costs, want.costs)
    assert main([*base, "--sp-size", "2"]) == 2
    assert "one GPU's share of a Ulysses group of 4 GPUs, not 2; pass --sp-size 4" in \
        _error_line(capsys)
    assert main([*base, "--sp-size", "4", "--sp-bandwidth", "1e9"]) == 2
    assert "already prices the all-to-all" in _error_line(capsys)
    assert main([*base[:5], "32768", *base[6:], "--out", str(out)]) == 0
    assert "note: the cost is one GPU's share of a Ulysses group of 4 GPUs; pass --sp-size 4" \
        in capsys.readouterr().err
    # A UlyssesCost JSON is kept the same way.
    shared = tmp_path / "u.json"
    shared.write_text(json.dumps(UlyssesCost(TokenCost(), 2).to_dict()))
    base = ["plan", str(path), "--dp", "2", "--max-tokens", "12288", "--cost", str(shared)]
    assert main([*base, "--sp-size", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    got = Plan.from_json(out.read_text())
    assert got.max_tokens == 24576
    np.testing.assert_array_equal(got.costs, got.lengths / 2)
    assert main([*base, "--sp-size", "4"]) == 2
    assert "group of 2 GPUs, not 4" in _error_line(capsys)


def test_ring_cp_over_ulysses_groups(tmp_path, capsys):
    """--cp-size C with --sp-size S (USP): each of the C ranks of a ring is a Ulysses group
    of S GPUs, holding S x --max-tokens tokens a slot; the plan is the library's."""
    import seqbalance as sb

    lengths = workloads.lengths("long-context", 256, seed=3)
    src = tmp_path / "lengths.txt"
    src.write_text("".join(f"{x}\n" for x in lengths))
    flags = ["--dp", "2", "--max-tokens", "16384", "--cp-size", "8", "--sp-size", "4",
             "--model", "llama-3-8b", "--cp-bandwidth", "2.5e10", "--sp-bandwidth", "1.5e11"]
    out = tmp_path / "usp.json"
    assert main(["plan", str(src), *flags, "--out", str(out)]) == 0
    assert "2 replicas x 8 Ulysses groups of 4 GPUs" in capsys.readouterr().err
    cost = UlyssesCost(FlopsCost.from_name("llama-3-8b"), 4, bandwidth=1.5e11)
    want = sb.plan(lengths, 2, 4 * 16384, cost=cost, cp_size=8, cp="dynamic",
                   cp_cost={"bandwidth": 2.5e10, "overlap": 0.5, "cost_per_second": 4e14})
    assert out.read_text() == want.to_json()
    assert want.microbatch_tokens().max() > 16384  # a slot holds a group's tokens
    table = tmp_path / "c.json"
    assert main(["compare", str(src), *flags, "--json", str(table)]) == 0
    assert "dp=2 x cp=8 x sp=4, max_tokens=16384/GPU" in capsys.readouterr().out
    setup = json.loads(table.read_text())["setups"][0]
    assert (setup["max_tokens"], setup["sp_size"], setup["group_max_tokens"]) == (16384, 4, 65536)
    row = next(r for r in setup["results"] if r["strategy"] == "seqbalance")
    assert row["step_time"] == want.simulate().step_time
    # --cost-per-second prices the ring here, with or without --sp-bandwidth.
    assert main(["plan", str(src), *flags[:-2], "--cost-per-second", "3e14",
                 "--out", str(out)]) == 0  # fmt: skip
    capsys.readouterr()
    slow = sb.plan(lengths, 2, 4 * 16384, cost=UlyssesCost(FlopsCost.from_name("llama-3-8b"), 4),
                   cp_size=8, cp="dynamic", cp_cost={"bandwidth": 2.5e10, "overlap": 0.5,
                                                     "cost_per_second": 3e14})  # fmt: skip
    assert out.read_text() == slow.to_json()
    # A UlyssesCost JSON plans rings too: its units are its inner cost's (FLOP), and
    # --cost-per-second is the ring's rate, not a second price for its all-to-all.
    shared = tmp_path / "u.json"
    shared.write_text(UlyssesCost(FlopsCost.from_name("llama-3-8b"), 4, bandwidth=1.5e11).to_json())
    cli = ["plan", str(src), *flags[:8], "--cost", str(shared), "--cp-bandwidth", "2.5e10"]
    assert main([*cli, "--out", str(out)]) == 0
    assert "one GPU's share of Ulysses sp=4 from" in capsys.readouterr().err
    assert out.read_text() == want.to_json()
    assert main([*cli, "--cost-per-second", "3e14", "--out", str(out)]) == 0
    capsys.readouterr()


def test_planner_errors_over_ulysses_groups_name_the_group(tmp_path, capsys):
    """Under --sp-size the planner's capacity is --sp-size x --max-tokens and, in a CP
    ring, its "GPUs" are Ulysses groups: its messages say so."""
    src = tmp_path / "long.txt"
    src.write_text("600000\n")
    base = ["plan", str(src), "--dp", "1", "--max-tokens", "16384", "--cp-size", "8",
            "--model", "llama-3-8b"]  # fmt: skip
    assert main([*base, "--sp-size", "4"]) == 2
    assert _error_line(capsys) == (
        "error: sequence 0 has 600000 tokens: split over --cp-size=8 Ulysses groups its "
        "largest piece has 75000 tokens, more than --sp-size x --max-tokens=65536; raise "
        "--cp-size, --sp-size or --max-tokens, or truncate it"
    )
    assert main(base) == 2  # without --sp-size, as before
    assert "split over --cp-size=8 GPUs its largest piece has 75000 tokens, more than " \
        "--max-tokens=16384; raise --cp-size or --max-tokens" in _error_line(capsys)
