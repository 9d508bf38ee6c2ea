"""Timing records on disk: TimingRecorder.save / load (seqbalance.costs.timing_files)."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.costs import (
    ContextParallelCost,
    FlopsCost,
    QuadraticCost,
    Timing,
    TimingFileError,
    TimingRecorder,
    TokenCost,
)
from seqbalance.costs.feedback import records_from_plan
from seqbalance.costs.timing_files import FORMAT, VERSION
from seqbalance.planning.cp_plans import piece_costs
from seqbalance.planning.planner import plan

TRUTH = QuadraticCost(per_token=2e-5, per_token_sq=4e-10, per_sequence=1e-3, per_microbatch=5e-3)
LINK = {"bandwidth": 5e10, "overlap": 0.5, "kv_bytes_per_token": 114688.0, "cost_per_second": 1.0}


def _recorder(steps: int = 4, ranks: int = 3, seed: int = 0, **kwargs) -> TimingRecorder:
    rng = np.random.default_rng(seed)
    rec = TimingRecorder(**kwargs)
    for step in range(steps):
        for rank in range(ranks):
            for slot in range(2):
                lens = rng.integers(1, 5000, rng.integers(1, 6))
                secs = TRUTH.microbatch_cost(lens) * rng.lognormal(0, 0.05)
                rec.record(rank, step, slot, lens, secs)
    return rec


def _cp_recorder(steps: int = 3) -> TimingRecorder:
    truth_cp = ContextParallelCost(TRUTH, **LINK)
    rec = TimingRecorder(ContextParallelCost(TokenCost(), **{**LINK, "cost_per_second": 5e4}))
    rng = np.random.default_rng(1)
    for step in range(steps):
        lens = np.concatenate([rng.integers(200, 4000, 40), rng.integers(20000, 120000, 2)])
        p = plan(lens, 2, 32768, cp_size=4, cp="dynamic", cost=TRUTH, cp_cost=LINK)
        t = piece_costs(p.pieces, np.asarray(p.lengths), truth_cp)
        rec.extend(records_from_plan(p.micro_batches, p.lengths, t.tolist(), step, pieces=p.pieces))
    return rec


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_round_trip_keeps_records_and_settings_and_rewrites_the_same_bytes(tmp_path):
    rec = _recorder(cost=FlopsCost.from_name("qwen2.5-7b"), sync="ddp", window=7)
    path = rec.save(tmp_path / "t.jsonl")
    head = _lines(path)[0]
    assert head["format"] == FORMAT and head["version"] == VERSION
    assert head["sync"] == "ddp" and head["window"] == 7
    back = TimingRecorder.load(path)
    assert back.records == rec.records
    assert (back.sync, back.window) == ("ddp", 7)
    assert back.cost.to_dict() == rec.cost.to_dict()
    again = back.save(tmp_path / "again.jsonl")
    assert again.read_bytes() == path.read_bytes()
    # The report and the refit of the loaded records are those of the original, bit for bit.
    assert back.report().metrics() == rec.report().metrics()
    assert back.refit().polynomial == rec.refit().polynomial


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 9), st.integers(0, 99), st.integers(0, 9),
            st.lists(st.integers(0, 2**39), max_size=5),
            st.floats(min_value=1e-300, max_value=1e300, allow_nan=False),
        ),
        max_size=20,
        unique_by=lambda r: r[:3],
    )
)  # fmt: skip
def test_any_records_read_back_exactly(tmp_path_factory, records):
    """Times anywhere in the float range and lengths up to 2**39 come back bit for bit."""
    path = tmp_path_factory.mktemp("t") / "t.jsonl"
    rec = TimingRecorder(window=1000)
    rec.extend(records)
    rec.save(path)
    back = TimingRecorder.load(path)
    assert back.records == rec.records
    assert [r.seconds for r in back.records] == [r.seconds for r in rec.records]


def test_cp_records_and_link_round_trip(tmp_path):
    rec = _cp_recorder()
    path = rec.save(tmp_path / "cp.jsonl")
    head = _lines(path)[0]
    assert "cost" not in head and head["cp_cost"] == rec.cp_cost.to_dict()
    back = TimingRecorder.load(path)
    assert back.records == rec.records
    assert all(r.pieces is not None for r in back.records)
    assert back.cp_cost.to_dict() == rec.cp_cost.to_dict()
    # The link came back: the noise-free refit finds the true cost from the file alone.
    cost = back.refit(per_rank=False)
    np.testing.assert_allclose(cost.polynomial, TRUTH.polynomial, rtol=1e-6)
    assert back.cp_cost.bandwidth == LINK["bandwidth"]


def test_files_of_several_ranks_merge(tmp_path):
    """One file a rank, headerless except the first: the same records as one file."""
    rec = _recorder(cost="tokens", sync="ddp")
    whole = tmp_path / "all.jsonl"
    rec.save(whole)
    lines = whole.read_text().splitlines()
    paths = []
    for rank in range(3):
        p = tmp_path / f"rank{rank}.jsonl"
        body = [ln for ln in lines[1:] if json.loads(ln)["rank"] == rank]
        p.write_text("\n".join(([lines[0]] if rank == 0 else []) + body) + "\n")
        paths.append(p)
    back = TimingRecorder.load(paths)
    assert back.records == rec.records and back.sync == "ddp"
    dup = r"rank1\.jsonl:1: rank 1 step 0 slot 0 is also recorded at .*all\.jsonl:\d+; .* one rank"
    with pytest.raises(ValueError, match=dup):
        TimingRecorder.load([whole, paths[1]])


def test_headerless_file_and_overrides(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"rank": 0, "step": 5, "slot": 0, "lengths": [10, 20], "seconds": 0.5}\n\n'
        '{"rank": 1, "step": 5, "slot": 0, "lengths": [], "seconds": 0.25}\n'
    )
    back = TimingRecorder.load(path)
    assert isinstance(back.cost, TokenCost) and back.sync == "fsdp" and back.window == 1
    assert back.records == [Timing(0, 5, 0, np.array([10, 20]), 0.5),
                            Timing(1, 5, 0, np.array([], dtype=np.int64), 0.25)]  # fmt: skip
    back = TimingRecorder.load(str(path), cost=TRUTH, sync="ddp", window=3)
    assert back.cost is TRUTH and back.sync == "ddp" and back.window == 3


def test_loading_drops_no_step_unless_a_window_is_given(tmp_path):
    rec = _recorder(steps=6, window=6)
    path = rec.save(tmp_path / "t.jsonl")
    text = path.read_text().replace('"window":6', '"window":2')
    path.write_text(text)
    back = TimingRecorder.load(path)
    assert back.steps == list(range(6)) and back.window == 6
    assert TimingRecorder.load(path, window=2).steps == [4, 5]


def test_headers_that_disagree_need_a_choice(tmp_path):
    a = _recorder(steps=1, sync="ddp").save(tmp_path / "a.jsonl")
    b_rec = TimingRecorder(sync="fsdp")
    b_rec.record(0, 9, 0, [5], 1.0)
    b = b_rec.save(tmp_path / "b.jsonl")
    with pytest.raises(ValueError, match=r"a\.jsonl and .*b\.jsonl give different syncs; pass"):
        TimingRecorder.load([a, b])
    assert TimingRecorder.load([a, b], sync="fsdp").sync == "fsdp"
    c_rec = TimingRecorder(TRUTH)
    c_rec.record(0, 10, 0, [5], 1.0)
    c = c_rec.save(tmp_path / "c.jsonl")
    with pytest.raises(ValueError, match="different costs; pass cost="):
        TimingRecorder.load([b, c], sync="fsdp")
    assert TimingRecorder.load([b, c], cost="tokens").cost == TokenCost()


HEADER = f'{{"format": "{FORMAT}", "version": 1}}'
GOOD = '{"rank": 0, "step": 0, "slot": 0, "lengths": [3], "seconds": 1.0}'


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([GOOD, "{not json"], r"t\.jsonl:2: not a JSON object"),
        (["[1, 2]"], r"t\.jsonl:1: expected a JSON object .* got list"),
        ([GOOD.replace('"seconds"', '"secs"')], r":1: unknown key\(s\) \['secs'\]"),
        ([GOOD.replace(', "seconds": 1.0', "")], r":1: the record lacks \['seconds'\]"),
        ([GOOD.replace("1.0", "NaN")], r":1: seconds must be a positive finite time"),
        ([GOOD.replace("1.0", '"1.0"')], r":1: seconds must be a number"),
        ([GOOD.replace("[3]", "[-3]")], r":1: lengths\[0\] = -3 is negative"),
        ([GOOD.replace('"rank": 0', '"rank": 1.5')], r":1: rank must be a non-negative integer"),
        ([GOOD.replace("}", ', "pieces": null}')], r":1: 'pieces' is null"),
        ([GOOD.replace("}", ', "pieces": [[0, 2, 0, 5]]}')], r":1: pieces .*0 <= start"),
        ([GOOD, GOOD], r"t\.jsonl:2: rank 0 step 0 slot 0 is also recorded at .*t\.jsonl:1; "
                       r"each micro-batch may be recorded once$"),
        ([GOOD, HEADER], r":2: a header after the first line"),
        ([HEADER.replace(FORMAT, "other")], r":1: format 'other' is not"),
        ([HEADER.replace('"version": 1', '"version": 2')], r":1: written as version 2 by a newer"),
        ([HEADER.replace("}", ', "sink": "ddp"}')], r":1: unknown header key\(s\) \['sink'\]"),
        ([HEADER.replace("}", ', "sync": "zero"}')], r":1: sync must be one of"),
        ([HEADER.replace("}", ', "window": 0}')], r":1: window must be a positive integer"),
        ([HEADER.replace("}", ', "cost": "tokens"}')], r":1: 'cost' must be a cost model's"),
        ([HEADER.replace("}", ', "cost": {"kind": "cubic"}}'), GOOD],
         r"t\.jsonl: the header's cost: cost kind 'cubic' is unknown"),
    ],
)  # fmt: skip
def test_malformed_files_are_refused_with_file_and_line(tmp_path, lines, match):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    # A ValueError, and of the class that says the file's own content is at fault.
    with pytest.raises(TimingFileError, match=match):
        TimingRecorder.load(path)


def test_no_files_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="no timing files"):
        TimingRecorder.load([])
    with pytest.raises(FileNotFoundError):
        TimingRecorder.load(tmp_path / "absent.jsonl")


def test_save_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text("old contents that are longer than the new file will be\n" * 100)
    rec = TimingRecorder()
    rec.record(0, 0, 0, [7], 0.1)
    rec.save(path)
    assert TimingRecorder.load(path).records == rec.records
    assert os.listdir(tmp_path) == ["t.jsonl"]
    # A recorder with no records writes a header only, which loads as an empty recorder.
    TimingRecorder(sync="ddp").save(path)
    empty = TimingRecorder.load(path)
    assert len(empty) == 0 and empty.sync == "ddp"


def test_save_into_a_missing_folder_raises_and_writes_nothing(tmp_path):
    with pytest.raises(OSError):
        TimingRecorder().save(tmp_path / "nope" / "t.jsonl")
    assert os.listdir(tmp_path) == []


def test_timing_equality_compares_arrays():
    a = Timing(0, 1, 2, np.array([3, 4]), 0.5)
    assert a == Timing(0, 1, 2, np.array([3, 4]), 0.5)
    assert a != Timing(0, 1, 2, np.array([3, 5]), 0.5)
    assert a != Timing(0, 1, 2, np.array([3, 4]), 0.5, np.array([[0, 1, 0, 3], [1, 1, 0, 4]]))
    assert a != "a timing"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy elementwise-comparison warning
        assert a != Timing(0, 1, 2, np.array([3]), 0.5)


# ---- review (helper-53) ------------------------------------------------------------------


def test_a_plain_cost_given_for_cp_files_keeps_their_link(tmp_path):
    """It was dropped: the refit then put the communication into c (75x the truth)."""
    path = _cp_recorder().save(tmp_path / "cp.jsonl")
    back = TimingRecorder.load(path, cost="tokens")
    assert back.cp_cost is not None and back.cp_cost.bandwidth == LINK["bandwidth"]
    assert back.cp_cost.cost_per_second == 5e4  # the saved cost's rate: it is the same cost
    np.testing.assert_allclose(back.refit(per_rank=False).polynomial, TRUTH.polynomial,
                               rtol=1e-6)  # fmt: skip
    flops = TimingRecorder.load(path, cost="qwen2.5-7b").cp_cost
    assert flops.bandwidth == LINK["bandwidth"] and flops.cost_per_second == 4e14
    with pytest.raises(ValueError, match=r"cp\.jsonl: the files' CP link cannot price this cost"):
        TimingRecorder.load(path, cost=QuadraticCost(per_token=1.0, per_token_sq=0.0))
    other = ContextParallelCost(TokenCost(), bandwidth=1e9, kv_bytes_per_token=1.0,
                                cost_per_second=1.0)  # fmt: skip
    assert TimingRecorder.load(path, cost=other).cp_cost is other


def test_bad_arguments_are_named_as_arguments(tmp_path):
    path = _recorder(steps=1).save(tmp_path / "t.jsonl")
    with pytest.raises(ValueError, match=r"^window must be >= 1"):
        TimingRecorder.load(path, window=0)
    with pytest.raises(ValueError, match=r"^sync must be one of"):
        TimingRecorder.load(path, sync="zero")


def test_files_that_are_not_text_or_repeat_keys(tmp_path):
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(ValueError, match=r"t\.jsonl\.gz: not UTF-8 text"):
        TimingRecorder.load(gz)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + GOOD.encode() + b"\r\n")
    assert len(TimingRecorder.load(bom)) == 1
    for text, match in (
        (GOOD.replace('"rank": 0', '"rank": 0, "rank": 1'), r":1: key 'rank' appears twice"),
        (GOOD.replace("1.0", "1" + "0" * 400), r":1: seconds = 10* is not a finite time"),
        (GOOD.replace('"rank": 0', f'"rank": {2**70}'), r":1: rank = \d+ is too large"),
        (GOOD.replace("}", ', "pieces": [[0, 1, 0, true]]}'), r":1: pieces hold True/False"),
    ):
        path = tmp_path / "t.jsonl"
        path.write_text(text + "\n")
        with pytest.raises(ValueError, match=match):
            TimingRecorder.load(path)


def test_duplicates_are_refused_even_in_steps_the_window_drops(tmp_path):
    rec = _recorder(steps=3)
    path = rec.save(tmp_path / "t.jsonl")
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, lines[1]]) + "\n")  # step 0 again, at the end
    with pytest.raises(ValueError, match=r"also recorded at"):
        TimingRecorder.load(path, window=2)
    with pytest.raises(ValueError, match=r"is given twice"):
        TimingRecorder.load([path, tmp_path / "." / "t.jsonl"])
    # A rank that is not an integer is named so, not taken for rank 0 again.
    path.write_text(GOOD + "\n" + GOOD.replace('"rank": 0', '"rank": 0.0') + "\n")
    with pytest.raises(ValueError, match=r":2: rank must be a non-negative integer, got 0\.0"):
        TimingRecorder.load(path)


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"cost": {"cost": {"kind": "tokens"}}}, r"'cost' must be a cost model's to_dict\(\)"),
        ({"cp_cost": {"kind": "tokens"}}, r"'cp_cost' must be a ContextParallelCost's"),
    ],
)
def test_header_costs_of_the_wrong_shape_are_refused(tmp_path, header, match):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"format": FORMAT, "version": 1, **header}) + "\n" + GOOD + "\n")
    with pytest.raises(ValueError, match=match):
        TimingRecorder.load(path)


def test_save_keeps_permissions_and_symbolic_links(tmp_path):
    old = os.umask(0o022)
    try:
        rec = TimingRecorder()
        rec.record(0, 0, 0, [7], 0.1)
        new = rec.save(tmp_path / "new.jsonl")
        assert new.stat().st_mode & 0o777 == 0o644  # mkstemp's 0600 was kept
        shared = tmp_path / "shared.jsonl"
        shared.write_text("")
        shared.chmod(0o664)
        rec.save(shared)
        assert shared.stat().st_mode & 0o777 == 0o664
        link = tmp_path / "latest.jsonl"
        link.symlink_to(shared)
        rec.save(link)
        assert link.is_symlink() and TimingRecorder.load(shared).records == rec.records
    finally:
        os.umask(old)


def test_load_builds_the_subclass_it_is_called_on(tmp_path):
    class Mine(TimingRecorder):
        pass

    path = _recorder(steps=1).save(tmp_path / "t.jsonl")
    assert type(Mine.load(path)) is Mine


def test_a_context_parallel_cost_replaces_links_that_disagree(tmp_path):
    a = _cp_recorder(steps=1)
    a_path = a.save(tmp_path / "a.jsonl")
    b = TimingRecorder(ContextParallelCost(TokenCost(), **{**LINK, "bandwidth": 1e11,
                                                           "cost_per_second": 5e4}))  # fmt: skip
    b.extend(Timing(r.rank, r.step + 1, r.slot, r.lengths, r.seconds, r.pieces)
             for r in a.records)  # fmt: skip
    b_path = b.save(tmp_path / "b.jsonl")
    with pytest.raises(ValueError, match="give different CP links"):
        TimingRecorder.load([a_path, b_path], cost=TRUTH)
    given = ContextParallelCost(TRUTH, **LINK)
    loaded = TimingRecorder.load([a_path, b_path], cost=given)
    assert loaded.cp_cost == given and loaded.steps == [0, 1]
