"""``seqbalance refit``: a cost fitted to saved timing files, written for ``plan --cost``."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest

from seqbalance import workloads
from seqbalance.cli.commands import main
from seqbalance.costs import (
    ContextParallelCost,
    FlopsCost,
    QuadraticCost,
    Timing,
    TimingFileError,
    TimingRecorder,
    TokenCost,
    UlyssesCost,
    load_cost,
)
from seqbalance.costs.feedback import records_from_plan
from seqbalance.planning.cp_plans import piece_costs
from seqbalance.planning.planner import plan

TRUTH = QuadraticCost(per_token=2e-6, per_token_sq=4e-11, per_sequence=2e-4, per_microbatch=5e-3)
LINK = {"bandwidth": 2.5e9, "overlap": 0.5, "kv_bytes_per_token": 1.2e5}


def _dp_timings(path, steps: int = 8, noise: float = 0.0, seed: int = 0, **kwargs):
    """Token-cost plans of rl-math batches on 4 ranks, timed by TRUTH, saved to ``path``."""
    rng = np.random.default_rng(seed)
    rec = TimingRecorder(TokenCost(), **kwargs)
    for step in range(steps):
        lens = workloads.lengths("rl-math", 128, seed=step)
        p = plan(lens, 4, 32768)
        secs = [[TRUTH.microbatch_cost(lens[mb]) * rng.lognormal(0, noise) if noise
                 else TRUTH.microbatch_cost(lens[mb]) for mb in rank]
                for rank in p.micro_batches]  # fmt: skip
        rec.extend(records_from_plan(p.micro_batches, lens, secs, step))
    rec.save(path)
    return rec


def _cp_timings(path, link: dict | None = LINK, mode: str = "dynamic"):
    """Dynamic-CP plans (2 x 8 GPUs) timed by TRUTH over LINK; the recorder knows the link
    (its header carries it) unless ``link`` is None."""
    truth_cp = ContextParallelCost(TRUTH, cost_per_second=1.0, **LINK)
    token_cp = ContextParallelCost(TokenCost(), cost_per_second=1 / TRUTH.per_token, **LINK)
    rec = TimingRecorder(token_cp if link else TokenCost())
    for step in range(4):
        lens = workloads.lengths("long-context", 128, seed=step)
        p = plan(lens, 2, 32768, cp_size=8, cp=mode, cp_cost=token_cp)
        t = piece_costs(p.pieces, np.asarray(p.lengths), truth_cp)
        rec.extend(records_from_plan(p.micro_batches, p.lengths, t.tolist(), step, pieces=p.pieces))
    rec.save(path)
    return rec


def _narrow_timings(path):
    """Every sequence 3,500-4,500 tokens, 5% noise: b and c trade off (poorly determined)."""
    rng = np.random.default_rng(0)
    rec = TimingRecorder()
    for step in range(10):
        for rank in range(4):
            lens = rng.integers(3500, 4500, rng.integers(1, 8))
            rec.record(rank, step, 0, lens, TRUTH.microbatch_cost(lens) * rng.lognormal(0, 0.05))
    return rec.save(path)


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error: ")
    return err[0]


def test_refit_finds_the_true_cost_and_plan_reads_it(tmp_path, capsys):
    timings = tmp_path / "timings.jsonl"
    _dp_timings(timings)
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    err = captured.err
    assert "8 steps (0..7), 4 ranks, sync fsdp" in err
    assert "start: tokens" in err and "refit" in err and f"wrote {out}" in err
    cost = load_cost(str(out))
    np.testing.assert_allclose(cost.polynomial, TRUTH.polynomial, rtol=1e-9)
    assert cost.meta["unit"] == "seconds" and cost.meta["source"] == "refit"
    # The cost plans: `plan --cost` reads it as seconds.
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("".join(f"{x}\n" for x in workloads.lengths("rl-math", 64, seed=9)))
    assert main(["plan", str(lengths), "--dp", "2", "--max-tokens", "32768",
                 "--cost", str(out), "--out", str(tmp_path / "plan.json")]) == 0  # fmt: skip
    assert "seconds" in capsys.readouterr().err


def test_refit_writes_json_to_stdout_without_out(tmp_path, capsys):
    timings = tmp_path / "t.jsonl"
    _dp_timings(timings, steps=3)
    assert main(["refit", str(timings)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "quadratic"
    np.testing.assert_allclose(data["per_token_sq"], TRUTH.per_token_sq, rtol=1e-9)


def test_refit_of_cp_timings_uses_the_saved_link(tmp_path, capsys):
    """The header's link is subtracted: the noise-free fit is the truth. Without a link the
    command says where the communication went, and the fit is not the truth."""
    timings = tmp_path / "cp.jsonl"
    _cp_timings(timings)
    assert main(["refit", str(timings), "--no-per-rank"]) == 0
    captured = capsys.readouterr()
    np.testing.assert_allclose(json.loads(captured.out)["per_token_sq"], TRUTH.per_token_sq,
                               rtol=1e-6)  # fmt: skip
    assert "of context-parallel pieces" in captured.err
    assert "no CP link is known" not in captured.err

    blind = tmp_path / "blind.jsonl"
    _cp_timings(blind, link=None)
    assert main(["refit", str(blind), "--no-per-rank"]) == 0
    captured = capsys.readouterr()
    assert "no CP link is known (--cp-bandwidth)" in captured.err
    assert json.loads(captured.out)["per_token_sq"] > 1.5 * TRUTH.per_token_sq
    # Naming the link on the command line restores the truth.
    flags = ["--cp-bandwidth", "2.5e9", "--kv-bytes-per-token", "1.2e5"]
    assert main(["refit", str(blind), "--no-per-rank", *flags]) == 0
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["per_token_sq"],
                               TRUTH.per_token_sq, rtol=1e-6)  # fmt: skip
    # A wrong link named over the saved one is used: 4x the bandwidth leaves most of the
    # communication in the fit.
    assert main(["refit", str(timings), "--no-per-rank", "--cp-bandwidth", "1e10"]) == 0
    assert json.loads(capsys.readouterr().out)["per_token_sq"] > 2 * TRUTH.per_token_sq


def test_the_held_out_report_includes_records_of_cp_pieces(tmp_path, capsys):
    timings = tmp_path / "cp.jsonl"
    rec = _cp_timings(timings)
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--holdout-steps", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    held = [r for r in rec.records if r.step == 3]
    assert sum(r.pieces is not None for r in held) > 0
    holdout = load_cost(str(out)).report.holdout
    assert holdout.n_samples == len(held)
    assert holdout.max_rel_error < 1e-5 and holdout.r2 > 1 - 1e-9  # noise-free, link known


def test_holdout_steps_fit_the_earlier_steps_and_report_the_rest(tmp_path, capsys):
    timings = tmp_path / "t.jsonl"
    rec = _dp_timings(timings, steps=6, noise=0.05)
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--holdout-steps", "2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "held-out refit" in err and "held-out start: tokens" in err
    # The cost written is the fit of steps 0..3 alone.
    early = TimingRecorder(TokenCost())
    early.extend(r for r in rec.records if r.step < 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = early.refit()
    assert load_cost(str(out)).polynomial == expected.polynomial


def test_poorly_determined_fit_is_written_with_its_warning(tmp_path, capsys):
    """Every sequence 3,500-4,500 tokens with noise: b and c trade off. The cost is written,
    the warning is printed and travels in the cost's meta (plan --cost repeats it)."""
    timings = _narrow_timings(tmp_path / "t.jsonl")
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--out", str(out)]) == 0
    assert "note: refit:" in capsys.readouterr().err
    assert any("poorly determined" in w for w in load_cost(str(out)).meta["warnings"])


@pytest.mark.parametrize(
    ("make", "args", "match"),
    [
        ("same-shape", [], r"refit: .* cannot tell per_microbatch, .* apart .* pass "
         r"--no-per-microbatch / --no-per-sequence\. Nothing written\.$"),
        ("dp", ["--holdout-steps", "3"], "--holdout-steps 3 leaves no step to fit"),
        ("dp", ["--holdout-steps", "-1"], "--holdout-steps must be >= 0"),
        ("dp", ["--cp-overlap", "0.2"], "--cp-overlap describes a CP link: give --cp-bandwidth"),
        ("empty", [], "no timing records in"),
        ("bad", [], r"t\.jsonl:2: unknown key"),
    ],
)
def test_refit_errors_are_one_line(tmp_path, capsys, make, args, match):
    timings = tmp_path / "t.jsonl"
    if make == "dp":
        _dp_timings(timings, steps=3)
    elif make == "same-shape":
        rec = TimingRecorder()
        for step in range(5):
            for rank in range(2):
                rec.record(rank, step, 0, [100, 100], 0.01 * (1 + 0.01 * step))
        rec.save(timings)
    elif make == "empty":
        TimingRecorder().save(timings)
    else:
        timings.write_text('{"rank":0,"step":0,"slot":0,"lengths":[1],"seconds":1}\n{"x":1}\n')
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--out", str(out), *args]) == 2
    assert re.search(match, _error_line(capsys))
    assert not out.exists()


def test_out_may_not_overwrite_a_timing_file(tmp_path, capsys):
    timings = tmp_path / "t.jsonl"
    _dp_timings(timings, steps=2)
    before = timings.read_bytes()
    assert main(["refit", str(timings), "--out", str(timings)]) == 2
    assert "would overwrite" in _error_line(capsys)
    assert timings.read_bytes() == before


# ---- review (helper-53) ------------------------------------------------------------------


def test_files_saved_with_different_costs_refit_with_a_chosen_start_cost(tmp_path, capsys):
    """--cost / --model never reached the header check: disagreeing files could not be
    refit at all, and the message named a Python argument."""
    rec = _dp_timings(tmp_path / "all.jsonl", steps=4)
    a, b = TimingRecorder(TokenCost()), TimingRecorder("qwen2.5-7b")
    a.extend(r for r in rec.records if r.rank < 2)
    b.extend(r for r in rec.records if r.rank >= 2)
    files = [str(a.save(tmp_path / "a.jsonl")), str(b.save(tmp_path / "b.jsonl"))]
    assert main(["refit", *files]) == 2
    assert "give different costs; pass --cost or --model to say which" in _error_line(capsys)
    for start, label in ((["--cost", "tokens"], "start: tokens"),
                         (["--model", "qwen2.5-7b"], "start: FLOPs of qwen2.5-7b")):  # fmt: skip
        assert main(["refit", *files, *start]) == 0
        captured = capsys.readouterr()
        assert label in captured.err
        np.testing.assert_allclose(json.loads(captured.out)["per_token"], TRUTH.per_token,
                                   rtol=1e-9)  # fmt: skip


def test_flags_reach_the_fit(tmp_path, capsys):
    """Each fit flag changes what the library's refit is asked, and gives its answer."""
    timings = tmp_path / "t.jsonl"
    rec = _dp_timings(timings, steps=6, noise=0.05)
    for flags, kwargs in (
        ([], {}),
        (["--no-robust"], {"robust": False}),
        (["--no-per-rank"], {"per_rank": False}),
        (["--no-per-microbatch"], {"per_microbatch": False}),
        (["--no-per-sequence"], {"per_sequence": False}),
    ):
        assert main(["refit", str(timings), *flags]) == 0
        got = json.loads(capsys.readouterr().out)
        again = TimingRecorder(TokenCost())
        again.extend(rec.records)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = again.refit(**kwargs)
        assert [got[k] for k in ("per_microbatch", "per_sequence", "per_token",
                                 "per_token_sq")] == list(want.polynomial), flags  # fmt: skip
    assert main(["refit", str(timings), "--sync", "ddp"]) == 0
    assert "sync ddp" in capsys.readouterr().err


def test_held_out_rows_are_the_reports_of_the_held_out_steps(tmp_path, capsys):
    timings = tmp_path / "t.jsonl"
    rec = _dp_timings(timings, steps=6, noise=0.05)
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--holdout-steps", "2", "--out", str(out),
                 "--no-robust"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    cost = load_cost(str(out))
    held = TimingRecorder(cost)
    held.extend(r for r in rec.records if r.step >= 4)
    report = held.report()
    row = next(line for line in err.splitlines() if line.startswith("held-out refit"))
    assert row.split()[2:5] == [f"{report.model_error:.1%}", f"{report.model_error_p90:.1%}",
                                f"{report.imbalance_predicted:.1%}"]  # fmt: skip
    # The cost's FitReport holds them as its held-out part.
    assert cost.report.holdout is not None and cost.report.holdout.n_samples == len(held)
    assert "held out" in err


def test_cp_errors_and_notes_are_one_line_and_after_the_fit(tmp_path, capsys):
    blind = tmp_path / "blind.jsonl"
    _cp_timings(blind, link=None)
    assert main(["refit", str(blind), "--holdout-steps", "4"]) == 2
    assert "leaves no step to fit" in _error_line(capsys)
    # Flags for a link on records without pieces: said, not silently ignored.
    timings = tmp_path / "t.jsonl"
    _dp_timings(timings, steps=3)
    assert main(["refit", str(timings), "--cp-bandwidth", "1e9",
                 "--kv-bytes-per-token", "1e5"]) == 0  # fmt: skip
    assert "note: no record holds context-parallel pieces: --cp-bandwidth, " \
           "--kv-bytes-per-token change nothing" in capsys.readouterr().err
    # A link that leaves the records no compute time is refused in the command's words
    # (static CP: every sequence split, every record with communication).
    static = tmp_path / "static.jsonl"
    _cp_timings(static, mode="static")
    assert main(["refit", str(static), "--cp-bandwidth", "1e6"]) == 2
    line = _error_line(capsys)
    assert "that the CP link models (--cp-bandwidth 1e+06, --cp-overlap 0.5)" in line, line
    assert "cp_cost" not in line and line.endswith("nothing written.")


def test_poorly_determined_note_under_no_robust_names_the_flag(tmp_path, capsys):
    timings = _narrow_timings(tmp_path / "t.jsonl")
    assert main(["refit", str(timings), "--no-robust"]) == 0
    err = capsys.readouterr().err
    assert "leave out --no-robust to down-weight them" in err
    assert "robust=True" not in err and "=False" not in err


def test_plan_refuses_a_kv_size_without_a_bandwidth(tmp_path, capsys):
    src = tmp_path / "lengths.txt"
    src.write_text("100\n200\n90000\n")
    assert main(["plan", str(src), "--dp", "1", "--max-tokens", "65536", "--cp-size", "2",
                 "--kv-bytes-per-token", "1e5"]) == 2  # fmt: skip
    assert "--kv-bytes-per-token only acts on the CP ring, which is free" in _error_line(capsys)


def test_refit_reads_a_resumed_stream_and_says_which_steps_were_replaced(tmp_path, capsys):
    streamed = tmp_path / "stream.jsonl"
    whole = _dp_timings(tmp_path / "whole.jsonl", steps=6)
    first = TimingRecorder(TokenCost())
    first.stream_to(streamed)  # its steps 2, 3 ran slow (a bad node, since replaced)
    first.extend(Timing(r.rank, r.step, r.slot, r.lengths, r.seconds * (3 if r.step >= 2 else 1))
                 for r in whole.records if r.step < 4)  # fmt: skip
    first.stream_to(None)
    # The job resumed from step 2 and timed steps 2..5; its times of steps 2, 3 are kept.
    resumed = TimingRecorder(TokenCost())
    resumed.stream_to(streamed, resume=True)
    resumed.extend(r for r in whole.records if r.step >= 2)
    resumed.stream_to(None)
    out = tmp_path / "cost.json"
    assert main(["refit", str(streamed), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "6 steps (0..5), 4 ranks" in err
    notes = [line for line in err.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "2 step(s) (2..3) were timed again after a resume" in notes[0]
    assert err.index("model error") < err.index("note: ") < err.index("wrote")  # after the table
    np.testing.assert_allclose(load_cost(str(out)).polynomial, TRUTH.polynomial, rtol=1e-9)


def test_window_fits_the_last_steps_only(tmp_path, capsys):
    whole = _dp_timings(tmp_path / "whole.jsonl", steps=8)
    rec = TimingRecorder(TokenCost())  # steps 0..4 ran three times slower (another model)
    rec.extend(Timing(r.rank, r.step, r.slot, r.lengths, r.seconds * (3 if r.step < 5 else 1))
               for r in whole.records)  # fmt: skip
    timings = rec.save(tmp_path / "t.jsonl")
    out = tmp_path / "cost.json"
    assert main(["refit", str(timings), "--window", "3", "--out", str(out)]) == 0
    assert "3 steps (5..7), 4 ranks" in capsys.readouterr().err
    np.testing.assert_allclose(load_cost(str(out)).polynomial, TRUTH.polynomial, rtol=1e-9)
    assert main(["refit", str(timings), "--out", str(out)]) == 0  # all steps: not the truth
    capsys.readouterr()
    assert not np.allclose(load_cost(str(out)).polynomial, TRUTH.polynomial, rtol=1e-3)
    assert main(["refit", str(timings), "--window", "3", "--holdout-steps", "3"]) == 2
    assert "--holdout-steps 3 leaves no step to fit: --window 3 keeps 3 step(s)" in _error_line(
        capsys
    )
    assert main(["refit", str(timings), "--window", "0"]) == 2
    assert _error_line(capsys) == "error: --window must be >= 1, got 0"


def _split_by_link(rec, folder, first=(), second=()):
    """``rec``'s steps 0-1 saved under LINK changed by ``first``, steps 2-3 under LINK
    changed by ``second`` (two runs, two guesses of the link): two files in ``folder``."""
    folder.mkdir(exist_ok=True)
    files = []
    for name, steps, change in (("a", (0, 1), dict(first)), ("b", (2, 3), dict(second))):
        cp = ContextParallelCost(TokenCost(), cost_per_second=1 / TRUTH.per_token,
                                 **{**LINK, **change})  # fmt: skip
        part = TimingRecorder(cp)
        part.extend(r for r in rec.records if r.step in steps)
        files.append(str(part.save(folder / f"{name}.jsonl")))
    return files


def test_files_saved_under_different_links_refit_when_the_flags_name_the_link(
    tmp_path, capsys
):
    """Files saved under two guesses of the link were refused with "pass the link to use",
    though the flags name it; now the flags for the settings the files differ in are
    asked for by name, and with them the noise-free fit is the truth."""
    rec = _cp_timings(tmp_path / "all.jsonl")  # timed over LINK
    files = _split_by_link(rec, tmp_path, second={"overlap": 0.9, "comm_passes": 1.0})
    assert main(["refit", *files, "--cp-overlap", "0.5"]) == 2
    line = _error_line(capsys)
    assert "give different CP links (they differ in comm passes, overlap): give " \
           "--cp-comm-passes to price every record under one link" in line, line
    # A third file that agrees with the first: the error names the one that differs.
    third = TimingRecorder(ContextParallelCost(TokenCost(), cost_per_second=1 / TRUTH.per_token,
                                               **LINK))  # fmt: skip
    third.extend(r for r in rec.records if r.step == 1)
    (tmp_path / "c").mkdir()
    three = [files[0], str(third.save(tmp_path / "c" / "a2.jsonl")), files[1]]
    assert main(["refit", *three]) == 2
    line = _error_line(capsys)
    assert f"the headers of {files[0]} and {files[1]} give" in line, line
    assert main(["refit", *files, "--no-per-rank", "--cp-overlap", "0.5",
                 "--cp-comm-passes", "3"]) == 0  # fmt: skip
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["per_token_sq"],
                               TRUTH.per_token_sq, rtol=1e-6)  # fmt: skip
    # The settings the files share come from them, not from defaults: a shared wrong
    # bandwidth stays until its flag names the right one.
    both = {"bandwidth": 1e10}
    wrong = _split_by_link(rec, tmp_path / "w", first=both, second={**both, "overlap": 0.9})
    assert main(["refit", *wrong, "--no-per-rank", "--cp-overlap", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["per_token_sq"] > 2 * TRUTH.per_token_sq
    assert main(["refit", *wrong, "--no-per-rank", "--cp-overlap", "0.5",
                 "--cp-bandwidth", "2.5e9"]) == 0  # fmt: skip
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["per_token_sq"],
                               TRUTH.per_token_sq, rtol=1e-6)  # fmt: skip


def test_files_saved_with_different_costs_and_links_need_a_start_cost(tmp_path, capsys):
    rec = _cp_timings(tmp_path / "all.jsonl")
    a_cp = ContextParallelCost(TokenCost(), cost_per_second=1 / TRUTH.per_token, **LINK)
    b_cp = ContextParallelCost(QuadraticCost(per_token=1.0, per_token_sq=1e-5),
                               cost_per_second=1 / TRUTH.per_token, **LINK)  # fmt: skip
    files = []
    for name, steps, cp in (("a", (0, 1), a_cp), ("b", (2, 3), b_cp)):
        part = TimingRecorder(cp)
        part.extend(r for r in rec.records if r.step in steps)
        files.append(str(part.save(tmp_path / f"{name}.jsonl")))
    assert main(["refit", *files]) == 2
    assert "they differ in cost): give --cost or --model" in _error_line(capsys)
    assert main(["refit", *files, "--no-per-rank", "--cost", "tokens"]) == 0
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["per_token_sq"],
                               TRUTH.per_token_sq, rtol=1e-6)  # fmt: skip


def test_comm_passes_flag_reaches_the_refit(tmp_path, capsys):
    """Timed with 3 passes but saved as if forward-only (1): the flag puts the missing
    communication back where it belongs, out of the fitted terms."""
    rec = _cp_timings(tmp_path / "all.jsonl")
    cp = ContextParallelCost(TokenCost(), cost_per_second=1 / TRUTH.per_token,
                             **LINK, comm_passes=1.0)  # fmt: skip
    saved = TimingRecorder(cp)
    saved.extend(rec.records)
    path = str(saved.save(tmp_path / "one_pass.jsonl"))
    assert main(["refit", path, "--no-per-rank"]) == 0
    assert json.loads(capsys.readouterr().out)["per_token_sq"] > 1.5 * TRUTH.per_token_sq
    assert main(["refit", path, "--no-per-rank", "--cp-comm-passes", "3"]) == 0
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["per_token_sq"],
                               TRUTH.per_token_sq, rtol=1e-6)  # fmt: skip
    assert main(["refit", path, "--cp-comm-passes", "-1"]) == 2
    assert "--cp-comm-passes -1.0 is invalid" in _error_line(capsys)


def _with_header(path, out, change):
    """``path`` copied to ``out`` with ``change(header)`` applied to its first line."""
    lines = path.read_text().splitlines()
    head = json.loads(lines[0])
    change(head)
    out.write_text("\n".join([json.dumps(head), *lines[1:]]) + "\n")
    return str(out)


def test_bad_values_in_files_are_named_in_the_files_words(tmp_path, capsys):
    """A bad value inside a timing file's header or a --cost file was reported as the
    flag of the same setting (``--cp-comm-passes -1``), which the user did not give; it
    is now named with the file and the file's key. The flag's own value keeps the flag."""
    saved = tmp_path / "all.jsonl"
    _cp_timings(saved)
    bad = _with_header(saved, tmp_path / "bad.jsonl",
                       lambda h: h["cp_cost"].update(comm_passes=-1))  # fmt: skip
    shown = f"error: {bad}: the header's cp_cost: comm_passes = -1 is invalid; it must be " \
            "finite and >= 0"
    for start in ([], ["--model", "qwen2.5-7b"], ["--cost", "tokens"]):  # any start cost
        assert main(["refit", bad, *start]) == 2
        line = _error_line(capsys)
        assert line == shown, (start, line)
    # The library says so too, with a TimingFileError, whatever cost= is given.
    for cost in (None, FlopsCost.from_name("qwen2.5-7b"), TokenCost()):
        with pytest.raises(TimingFileError, match="the header's cp_cost: comm_passes = -1"):
            TimingRecorder.load(bad, cost=cost)
    # A flag that replaces the bad setting is used instead: the file loads.
    assert main(["refit", bad, "--no-per-rank", "--cp-comm-passes", "3"]) == 0
    np.testing.assert_allclose(json.loads(capsys.readouterr().out)["per_token_sq"],
                               TRUTH.per_token_sq, rtol=1e-6)  # fmt: skip
    # Two files under different links: the bad one is named while their links are compared.
    other = _with_header(saved, tmp_path / "other.jsonl",
                         lambda h: h["cp_cost"].update(overlap=2.0))  # fmt: skip
    assert main(["refit", str(saved), other, "--cp-overlap", "0.5"]) == 2
    line = _error_line(capsys)
    assert line.startswith(f"error: {other}: the header's cp_cost: overlap = 2"), line
    assert "--cp-overlap" not in line, line
    # A --cost file with a bad value: the file is named, not --cp-comm-passes.
    sb_cost = UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), 4, bandwidth=2.5e10).to_dict()
    cost_file = tmp_path / "ulysses.json"
    cost_file.write_text(json.dumps({**sb_cost, "comm_passes": -2}))
    assert main(["refit", str(saved), "--cost", str(cost_file)]) == 2
    line = _error_line(capsys)
    assert line == (f"error: {cost_file}: comm_passes = -2 is invalid; it must be finite "
                    "and >= 0"), line  # fmt: skip
    # The flag's own bad value is still worded as the flag.
    assert main(["refit", str(saved), "--cp-comm-passes", "-1"]) == 2
    assert "error: --cp-comm-passes -1.0 is invalid" in _error_line(capsys)


def test_a_ulysses_start_cost_prices_the_ring_at_its_own_rate():
    """The start cost's row of a CP refit priced a UlyssesCost's ring at 1 FLOP/s (only a
    FlopsCost got 4e14), so its transfers counted for nothing."""
    from seqbalance.cli.refit import _LINK_FLAGS, _with_flags

    flags = {name: None for name, _ in _LINK_FLAGS.values()} | {"cp_bandwidth": 1e10}
    usp = UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), 4, bandwidth=1e11, cost_per_second=3e14)
    assert _with_flags(usp, None, flags, False).cost_per_second == 3e14
    free = UlyssesCost(FlopsCost.from_name("qwen2.5-7b"), 4)  # no all-to-all rate: its FLOPs'
    assert _with_flags(free, None, flags, False).cost_per_second == 4e14
    assert _with_flags(FlopsCost.from_name("qwen2.5-7b"), None, flags, False).cost_per_second \
        == 4e14
    assert _with_flags(TokenCost(), None, flags | {"kv_bytes_per_token": 1.0}, False) \
        .cost_per_second == 1.0  # units unknown: the start row only, as before


def test_refit_of_timings_taken_on_rings_of_ulysses_groups(tmp_path, capsys):
    """USP timings (each CP rank a Ulysses group of 4): the ring over the heads a GPU holds
    is subtracted, the noise-free fit is one GPU's share of the truth, and it says so
    (meta ulysses_sp_size): plan --sp-size 4 --cp-size 8 takes it as it is."""
    sp = 4
    link = {**LINK, "kv_bytes_per_token": LINK["kv_bytes_per_token"] / sp}  # a GPU's heads
    usp_truth = ContextParallelCost(UlyssesCost(TRUTH, sp), cost_per_second=1.0, **link)
    start = ContextParallelCost(UlyssesCost(TokenCost(), sp),
                                cost_per_second=1 / TRUTH.per_token, **link)  # fmt: skip
    rec = TimingRecorder(start)
    for step in range(4):
        lens = workloads.lengths("long-context", 128, seed=step)
        p = plan(lens, 2, sp * 32768, cp_size=8, cp="dynamic", cp_cost=start)
        t = piece_costs(p.pieces, np.asarray(p.lengths), usp_truth)
        rec.extend(records_from_plan(p.micro_batches, p.lengths, t.tolist(), step, pieces=p.pieces))
    saved = rec.save(tmp_path / "usp.jsonl")
    out = tmp_path / "fit.json"
    assert main(["refit", str(saved), "--no-per-rank", "--out", str(out)]) == 0
    capsys.readouterr()
    fitted = load_cost(str(out))
    want = UlyssesCost(TRUTH, sp)  # one GPU's share: a, b, c over sp, c0 kept
    np.testing.assert_allclose(fitted.polynomial[1:], want.polynomial[1:], rtol=1e-6)
    assert fitted.meta["ulysses_sp_size"] == sp
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("".join(f"{x}\n" for x in workloads.lengths("long-context", 64, seed=9)))
    assert main(["plan", str(lengths), "--dp", "2", "--max-tokens", "32768", "--cp-size", "8",
                 "--sp-size", "4", "--cost", str(out), "--out", str(tmp_path / "p.json")]) == 0
    assert "one GPU's share (Ulysses sp=4)" in capsys.readouterr().err
