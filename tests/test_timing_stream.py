"""TimingRecorder.stream_to: records appended as they arrive, resumed jobs, cut-short lines."""

from __future__ import annotations

import copy
import json
import os
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.costs import ContextParallelCost, QuadraticCost, TimingRecorder, TokenCost
from seqbalance.costs.timing_files import FORMAT, ResumedStepsWarning, TimingStream

LINK = {"bandwidth": 5e10, "overlap": 0.5, "kv_bytes_per_token": 114688.0, "cost_per_second": 1.0}
REFIT = QuadraticCost(per_token=2e-5, per_token_sq=4e-10)


def _step(rec: TimingRecorder, step: int, scale: float = 1.0, ranks: int = 2) -> None:
    """One step as MicroBatchTimer records it: every rank's micro-batches in one extend."""
    rec.extend(
        (rank, step, slot, [10 * (step + 1) + rank, 5 + slot], scale * (1 + step + rank + slot))
        for rank in range(ranks)
        for slot in range(2)
    )


def _load_quietly(path, **kwargs) -> tuple[TimingRecorder, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = TimingRecorder.load(path, **kwargs)
    return loaded, caught


def test_a_stream_keeps_every_step_the_window_drops(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = TimingRecorder("tokens", sync="ddp", window=2)
    every = TimingRecorder("tokens", sync="ddp", window=100)
    assert rec.stream_to(path) == path
    for step in range(6):
        _step(rec, step)
        _step(every, step)
        # written (and flushed) at once: another reader sees the step
        assert len(TimingRecorder.load(path)) == 4 * (step + 1)
    assert rec.steps == [4, 5]
    loaded, caught = _load_quietly(path)
    assert caught == []
    assert loaded.records == every.records
    assert loaded.steps == list(range(6))
    assert (loaded.sync, loaded.cost, loaded.window) == ("ddp", TokenCost(), 6)
    first = json.loads(path.read_text().splitlines()[0])
    assert first == {"format": FORMAT, "version": 1, "sync": "ddp", "window": 2,
                     "cost": {"kind": "tokens"}}  # fmt: skip
    rec.stream_to(None)


def test_records_held_before_go_into_a_new_file_only(tmp_path):
    rec = TimingRecorder()
    _step(rec, 0)
    new = tmp_path / "new.jsonl"
    rec.stream_to(new)
    _step(rec, 1)
    rec.stream_to(None)
    assert TimingRecorder.load(new).records == rec.records
    # An existing file gets only what comes after (the resumed job's new steps), and
    # only when the job says it resumes.
    _step(rec, 2)
    before = new.read_bytes()
    with pytest.raises(ValueError, match=r"new\.jsonl already holds timings; pass resume=True "
                                         r"if this job resumes the one that wrote them"):
        rec.stream_to(new)
    assert new.read_bytes() == before
    rec.stream_to(new, resume=True)
    _step(rec, 3)
    rec.stream_to(None)
    assert TimingRecorder.load(new).steps == [0, 1, 3]
    # An empty file counts as new, as does one of blank lines or a byte-order mark alone.
    for name, content in (("empty", b""), ("blank", b"\n \n"), ("bom", b"\xef\xbb\xbf")):
        path = tmp_path / f"{name}.jsonl"
        path.write_bytes(content)
        rec.stream_to(path)
        rec.stream_to(None)
        assert TimingRecorder.load(path).records == rec.records
        assert path.read_text().startswith('{"format"')


def test_a_resumed_job_replaces_the_steps_it_runs_again(tmp_path):
    path = tmp_path / "t.jsonl"
    first = TimingRecorder("tokens", sync="ddp")
    first.stream_to(path)
    for step in range(5):
        _step(first, step)
    first.stream_to(None)
    lines_before = len(path.read_text().splitlines())
    # Resumed from a checkpoint at step 3, with a refitted cost: steps 3 and 4 run again.
    second = TimingRecorder(REFIT, sync="ddp")
    second.stream_to(path, resume=True)
    for step in range(3, 7):
        _step(second, step, scale=10.0)
    second.stream_to(None)
    marker = json.loads(path.read_text().splitlines()[lines_before])
    assert marker == {**json.loads(path.read_text().splitlines()[0]), "resumed": True}
    loaded, caught = _load_quietly(path)
    assert [w.category for w in caught] == [ResumedStepsWarning]
    msg = str(caught[0].message)
    assert "2 step(s) (3..4) were timed again after a resume" in msg
    assert "their 8 earlier record(s) (from line 14)" in msg  # header + 3 steps of 4
    assert loaded.steps == list(range(7))
    want = [r for r in first.records if r.step < 3] + second.records
    assert loaded.records == want
    assert loaded.cost == TokenCost()  # the file's header: the cost it started with


def test_a_resume_must_keep_the_sync_and_the_link(tmp_path):
    path = tmp_path / "t.jsonl"
    cp = TimingRecorder(ContextParallelCost(TokenCost(), **{**LINK, "cost_per_second": 5e4}))
    cp.stream_to(path)
    _step(cp, 0)
    cp.stream_to(None)
    before = path.read_bytes()[:-1]  # the last newline lost: nothing is mended before the checks
    path.write_bytes(before)
    with pytest.raises(ValueError, match=r"t\.jsonl holds timings recorded with another sync "
                                         r"\('fsdp', not 'ddp'\); stream to a new file"):
        TimingRecorder(ContextParallelCost(REFIT, **LINK), sync="ddp").stream_to(
            path, resume=True
        )
    with pytest.raises(ValueError, match="another CP link"):
        TimingRecorder(ContextParallelCost(REFIT, **{**LINK, "bandwidth": 1e11})).stream_to(
            path, resume=True
        )
    with pytest.raises(ValueError, match="another CP link"):
        TimingRecorder(REFIT).stream_to(path, resume=True)
    assert path.read_bytes() == before  # refused before writing anything
    # The refit of the same link, in seconds (cost_per_second 1): allowed.
    resumed = TimingRecorder(ContextParallelCost(REFIT, **LINK))
    resumed.stream_to(path, resume=True)
    _step(resumed, 1)
    resumed.stream_to(None)
    assert TimingRecorder.load(path).steps == [0, 1]


def test_a_line_cut_short_is_removed_before_appending(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = TimingRecorder()
    rec.stream_to(path)
    _step(rec, 0)
    rec.stream_to(None)
    whole = path.read_text()
    path.write_text(whole + '{"rank": 0, "step": 1, "sl')  # the job died mid-line
    with pytest.raises(ValueError, match=r"t\.jsonl:6: not a JSON object .*it is the last "
                                         r"line and has no newline: cut short"):
        TimingRecorder.load(path)
    with pytest.warns(UserWarning, match=r"removed its last line, cut short \(26 bytes"):
        rec.stream_to(path, resume=True)
    _step(rec, 1)
    rec.stream_to(None)
    assert path.read_text().startswith(whole + '{"format"')
    assert TimingRecorder.load(path).steps == [0, 1]


def test_a_whole_last_line_without_its_newline_is_kept(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(f'{{"format": "{FORMAT}", "version": 1}}\n'
                    '{"rank": 0, "step": 0, "slot": 0, "lengths": [3], "seconds": 1.0}')
    rec = TimingRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec.stream_to(path, resume=True)
    rec.record(0, 1, 0, [4], 2.0)
    rec.stream_to(None)
    assert [(r.step, r.seconds) for r in TimingRecorder.load(path).records] == [(0, 1.0), (1, 2.0)]
    # A header alone, after a byte-order mark (a Windows editor), without its newline.
    alone = tmp_path / "alone.jsonl"
    alone.write_bytes(b"\xef\xbb\xbf" + f'{{"format": "{FORMAT}", "version": 1}}'.encode())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rec.stream_to(alone, resume=True)
    rec.record(0, 2, 0, [5], 3.0)
    rec.stream_to(None)
    assert [r.step for r in TimingRecorder.load(alone).records] == [2]


def test_files_that_cannot_be_resumed(tmp_path):
    headerless = tmp_path / "h.jsonl"
    headerless.write_text('{"rank": 0, "step": 0, "slot": 0, "lengths": [3], "seconds": 1.0}\n')
    with pytest.raises(ValueError, match=r"h\.jsonl holds records without a header"):
        TimingRecorder().stream_to(headerless, resume=True)
    cut = tmp_path / "c.jsonl"
    cut.write_text('{"format": "seqbal')
    with pytest.raises(ValueError, match=r"c\.jsonl:1: not a JSON object .*cut short"):
        TimingRecorder().stream_to(cut, resume=True)
    with pytest.raises(FileNotFoundError):
        TimingRecorder().stream_to(tmp_path / "missing" / "t.jsonl")


def test_save_refuses_the_file_being_streamed(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = TimingRecorder()
    rec.stream_to(path)
    _step(rec, 0)
    link = tmp_path / "link.jsonl"
    link.symlink_to(path)
    for target in (path, link):
        with pytest.raises(ValueError, match="is the file this recorder streams to"):
            rec.save(target)
    rec.save(tmp_path / "other.jsonl")
    rec.stream_to(None)
    rec.save(path)  # no longer streamed: replaced whole
    assert TimingRecorder.load(path).records == rec.records


def test_a_bad_record_in_extend_keeps_and_streams_those_before(tmp_path):
    path = tmp_path / "t.jsonl"
    rec = TimingRecorder()
    rec.stream_to(path)
    with pytest.raises(ValueError, match=r"seconds must be a positive finite time"):
        rec.extend([(0, 0, 0, [3], 1.0), (0, 0, 1, [4], 2.0), (0, 0, 2, [5], float("nan"))])
    rec.stream_to(None)
    assert len(rec) == 2
    assert TimingRecorder.load(path).records == rec.records


def test_copies_do_not_stream_and_streams_close(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    rec = TimingRecorder()
    rec.stream_to(a)
    stream = rec._stream
    assert isinstance(stream, TimingStream) and repr(stream) == f"TimingStream({str(a)!r})"
    for clone in (copy.deepcopy(rec), pickle.loads(pickle.dumps(rec))):
        clone.record(0, 9, 0, [1], 1.0)
    rec.record(0, 0, 0, [1], 1.0)
    rec.stream_to(b)  # closes a
    assert stream.closed and repr(stream).endswith(", closed)")
    with pytest.raises(ValueError, match="is closed"):
        stream.write(rec.records)
    rec.record(0, 1, 0, [1], 1.0)
    rec.stream_to(None)
    rec.record(0, 2, 0, [1], 1.0)
    assert TimingRecorder.load(a).steps == [0]
    assert TimingRecorder.load(b).steps == [0, 1]


MARKER = f'{{"format": "{FORMAT}", "version": 1, "resumed": true}}'
HEADER = f'{{"format": "{FORMAT}", "version": 1}}'
GOOD = '{"rank": 0, "step": 0, "slot": 0, "lengths": [3], "seconds": 1.0}'


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        ([MARKER, GOOD], r":1: a resume marker in a file that does not start with a header"),
        ([GOOD, MARKER], r":2: a resume marker in a file that does not start with a header"),
        ([MARKER.replace("true", "false"), GOOD],
         r":1: 'resumed' belongs to resume markers, not to the first header"),
        ([MARKER.replace("true", '"yes"'), GOOD],
         r":1: 'resumed' belongs to resume markers, not to the first header"),
        ([HEADER, GOOD, MARKER.replace("}", ', "sync": "ddp"}')],
         r":3: a resume marker whose settings differ from the file's header"),
        ([HEADER, GOOD, MARKER.replace("true", "false")], r":3: a header after the first line"),
        # Records replaced by a resume are still checked.
        ([HEADER, GOOD.replace("1.0", "-1.0"), MARKER, GOOD],
         r"t\.jsonl:2: seconds must be a positive finite time"),
        ([HEADER, GOOD, GOOD, MARKER, GOOD], r"t\.jsonl:3: rank 0 step 0 slot 0 is recorded "
                                             r"twice in one run"),
        ([HEADER, GOOD, MARKER, GOOD, GOOD], r"t\.jsonl:5: rank 0 step 0 slot 0 is also "
                                             r"recorded at .*t\.jsonl:4"),
    ],
)  # fmt: skip
def test_malformed_resume_markers_are_refused(tmp_path, lines, match):
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=match), warnings.catch_warnings():
        warnings.simplefilter("ignore", ResumedStepsWarning)
        TimingRecorder.load(path)


def test_per_rank_files_joined_with_cat_are_still_refused(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for rank, path in enumerate((a, b)):
        rec = TimingRecorder()
        rec.record(rank, 0, 0, [5], 1.0)
        rec.save(path)
    joined = tmp_path / "joined.jsonl"
    joined.write_text(a.read_text() + b.read_text())
    with pytest.raises(ValueError, match=r"joined\.jsonl:3: a header after the first line; "
                                         r"files joined with `cat`"):
        TimingRecorder.load(joined)


# A job's runs: each resumes at some step (at most one past the last) and times some steps.
_runs = st.lists(
    st.tuples(st.integers(0, 6), st.integers(1, 4), st.integers(1, 3)), min_size=1, max_size=4
)


@settings(max_examples=60, deadline=None)
@given(runs=_runs)
def test_loading_keeps_each_step_from_the_last_run_that_timed_it(tmp_path_factory, runs):
    path = tmp_path_factory.mktemp("stream") / "t.jsonl"
    latest: dict[int, list] = {}
    end = 0
    replaced = False
    for i, (back, count, ranks) in enumerate(runs):
        start = max(0, end - back)
        replaced |= start < end  # every step below `end` was timed by an earlier run
        rec = TimingRecorder(sync="ddp")
        rec.stream_to(path, resume=True)
        for step in range(start, start + count):
            _step(rec, step, scale=float(i + 1), ranks=ranks)
            latest[step] = [r for r in rec.records if r.step == step]
        rec.stream_to(None)
        end = max(end, start + count)
    loaded, caught = _load_quietly(path)
    assert loaded.records == [r for step in sorted(latest) for r in latest[step]]
    assert [w.category for w in caught] == [ResumedStepsWarning] * replaced


def test_a_timer_streams_one_write_a_step(tmp_path):
    pytest.importorskip("torch")
    from seqbalance.torch.timing import MicroBatchTimer

    path = tmp_path / "t.jsonl"
    rec = TimingRecorder(sync="ddp", window=1)
    rec.stream_to(path)
    timer = MicroBatchTimer(rec, clock="thread", device="cpu")
    sizes = []
    for lens in ([[100, 20], [50]], [[7]]):
        for mb in lens:
            with timer.time(mb):
                sum(range(2000))
        timer.end_step()
        sizes.append(len(path.read_text().splitlines()))
    rec.stream_to(None)
    assert sizes == [3, 4]
    loaded = TimingRecorder.load(path)
    assert [(r.step, r.slot, sorted(r.lengths.tolist())) for r in loaded.records] == [
        (0, 0, [20, 100]), (0, 1, [50]), (1, 0, [7])
    ]
    assert rec.steps == [1] and np.all([r.seconds > 0 for r in loaded.records])


def test_a_hand_written_cp_header_resumes_with_its_defaults_filled_in(tmp_path):
    path = tmp_path / "t.jsonl"
    head = {"format": FORMAT, "version": 1, "sync": "fsdp", "cp_cost": {
        "cost": {"kind": "tokens"}, "bandwidth": 5e10, "kv_bytes_per_token": 114688.0,
        "cost_per_second": 1.0}}  # fmt: skip
    path.write_text(json.dumps(head) + "\n")
    loaded = TimingRecorder.load(path)  # overlap 0 and 3 passes: the defaults
    rec = TimingRecorder(loaded.cp_cost)
    rec.stream_to(path, resume=True)
    rec.record(0, 0, 0, [5], 1.0)
    rec.stream_to(None)
    assert TimingRecorder.load(path).cp_cost.to_dict() == loaded.cp_cost.to_dict()
    with pytest.raises(ValueError, match="another CP link"):
        TimingRecorder(ContextParallelCost(TokenCost(), **{**LINK, "cost_per_second": 1.0})
                       ).stream_to(path, resume=True)  # fmt: skip


def test_a_refused_file_leaves_the_current_stream_going(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    TimingRecorder(sync="ddp").save(b)
    rec = TimingRecorder()
    rec.stream_to(a)
    rec.record(0, 0, 0, [5], 1.0)
    with pytest.raises(ValueError, match="another sync"):
        rec.stream_to(b, resume=True)
    rec.record(0, 1, 0, [5], 1.0)
    rec.stream_to(None)
    assert TimingRecorder.load(a).steps == [0, 1]


def test_a_recorder_pickled_before_streaming_existed_still_records(tmp_path):
    rec = TimingRecorder()
    rec.record(0, 0, 0, [5], 1.0)
    state = rec.__getstate__()
    for key in ("_stream", "_pending"):
        state.pop(key, None)  # what an older version pickled
    old = TimingRecorder.__new__(TimingRecorder)
    old.__setstate__(state) if hasattr(old, "__setstate__") else old.__dict__.update(state)
    old.extend([(0, 1, 0, [6], 2.0)])
    old.stream_to(tmp_path / "t.jsonl")
    old.record(0, 2, 0, [7], 3.0)
    old.stream_to(None)
    assert TimingRecorder.load(tmp_path / "t.jsonl").steps == [0, 1, 2]


def test_extend_goes_through_record_and_streams_once(tmp_path):
    calls = []

    class Counting(TimingRecorder):
        def record(self, *args, **kwargs):
            calls.append(args[:3])
            super().record(*args, **kwargs)

    path = tmp_path / "t.jsonl"
    rec = Counting()
    rec.stream_to(path)
    writes = []
    real = rec._stream._write
    rec._stream._write = lambda text: (writes.append(text.count("\n")), real(text))
    rec.extend([(0, 0, 0, [5], 1.0), (1, 0, 0, [6], 1.0), (0, 0, 1, [7], 1.0)])
    rec.stream_to(None)
    assert calls == [(0, 0, 0), (1, 0, 0), (0, 0, 1)]
    assert writes == [3]
    assert len(TimingRecorder.load(path)) == 3


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_disk_raises_and_stopping_still_stops(tmp_path):
    rec = TimingRecorder()
    rec.stream_to(tmp_path / "t.jsonl")
    rec._stream._file.close()
    rec._stream._file = open("/dev/full", "a", encoding="utf-8")  # every flush fails
    with pytest.raises(OSError):
        rec.record(0, 0, 0, [5], 1.0)
    assert rec.steps == [0]  # held all the same
    with pytest.raises(OSError):
        rec.stream_to(None)  # the buffered line cannot be written either
    assert rec._stream is None
    rec.record(0, 1, 0, [5], 1.0)  # no longer streaming: nothing to fail
    assert rec.steps == [0, 1]


def _stream_holder(path: str, ready, done) -> None:
    """Another process: streams to ``path`` and holds it until told to stop."""
    rec = TimingRecorder()
    rec.stream_to(path)
    rec.record(1, 0, 0, [7], 1.0)
    ready.set()
    done.wait(60)
    rec.stream_to(None)


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="advisory file locks are POSIX")
def test_a_second_stream_to_one_file_is_refused(tmp_path):
    """Every rank holds the same gathered records; two ranks streaming to one file wrote
    their lines interleaved (and both wrote a header when they started together)."""
    import multiprocessing as mp

    path = tmp_path / "t.jsonl"
    ctx = mp.get_context("spawn")
    ready, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_stream_holder, args=(str(path), ready, done))
    other.start()
    try:
        assert ready.wait(60)
        rec = TimingRecorder()
        with pytest.raises(ValueError, match=r"another stream is writing to .*stream on one"):
            rec.stream_to(path, resume=True)
        assert rec._stream is None
    finally:
        done.set()
        other.join(60)
    assert other.exitcode == 0
    # Once the other has stopped, this one may resume the file.
    rec.stream_to(path, resume=True)
    rec.record(1, 1, 0, [8], 1.0)
    rec.stream_to(None)
    assert TimingRecorder.load(path).steps == [0, 1]


@pytest.mark.skipif(os.name != "posix", reason="advisory file locks are POSIX")
def test_two_recorders_of_one_process_cannot_stream_to_one_file(tmp_path):
    path = tmp_path / "t.jsonl"
    first, second = TimingRecorder(), TimingRecorder()
    first.stream_to(path)
    first.record(0, 0, 0, [3], 1.0)
    with pytest.raises(ValueError, match="another stream is writing to"):
        second.stream_to(path, resume=True)
    with pytest.raises(ValueError, match="this recorder already streams to"):
        first.stream_to(path, resume=True)
    first.record(0, 1, 0, [3], 1.0)  # still streaming
    first.stream_to(None)
    assert TimingRecorder.load(path).steps == [0, 1]
    assert [line for line in path.read_text().splitlines() if '"format"' in line] == [
        path.read_text().splitlines()[0]
    ]  # one header: the refused streams wrote nothing


def _child_holds_inherited_file(done) -> None:
    done.wait(60)  # a forked worker: alive, holding the parent's descriptors


@pytest.mark.skipif(os.name != "posix", reason="advisory file locks and fork are POSIX")
def test_a_stopped_stream_frees_its_file_while_forked_children_live(tmp_path):
    """flock belongs to the open file, which a forked child (a DataLoader worker) shares:
    stopping the stream left the file locked until every child exited."""
    import multiprocessing as mp

    path = tmp_path / "t.jsonl"
    rec = TimingRecorder()
    rec.stream_to(path)
    rec.record(0, 0, 0, [3], 1.0)
    ctx = mp.get_context("fork")
    done = ctx.Event()
    child = ctx.Process(target=_child_holds_inherited_file, args=(done,))
    child.start()
    try:
        rec.stream_to(None)
        other = TimingRecorder()
        other.stream_to(path, resume=True)  # refused before: the child held the lock
        other.record(0, 1, 0, [4], 1.0)
        other.stream_to(None)
    finally:
        done.set()
        child.join(60)
    assert TimingRecorder.load(path).steps == [0, 1]


@pytest.mark.skipif(os.name != "posix", reason="advisory file locks are POSIX")
def test_save_refuses_a_file_another_recorder_streams_to(tmp_path):
    path = tmp_path / "t.jsonl"
    streaming, other = TimingRecorder(), TimingRecorder()
    streaming.stream_to(path)
    streaming.record(0, 0, 0, [3], 1.0)
    other.record(0, 0, 0, [9], 1.0)
    with pytest.raises(ValueError, match="being streamed to by another recorder or process"):
        other.save(path)
    streaming.record(0, 1, 0, [3], 1.0)
    streaming.stream_to(None)
    assert [r.lengths.tolist() for r in TimingRecorder.load(path).records] == [[3], [3]]
    other.save(path)  # once the stream stopped, saving over the file is the caller's choice
    assert [r.lengths.tolist() for r in TimingRecorder.load(path).records] == [[9]]


def test_a_renamed_away_stream_file_is_not_the_path_any_more(tmp_path):
    """'Already streams to' compared paths: after log rotation moved the file away, a new
    file at the same path was refused."""
    path = tmp_path / "t.jsonl"
    rec = TimingRecorder()
    rec.stream_to(path)
    rec.record(0, 0, 0, [3], 1.0)
    os.rename(path, tmp_path / "t.1.jsonl")
    rec.stream_to(path)  # a new file; the old stream closes
    rec.record(0, 1, 0, [3], 1.0)
    rec.stream_to(None)
    assert TimingRecorder.load(path).steps == [0, 1]  # records held go into a new file
    assert TimingRecorder.load(tmp_path / "t.1.jsonl").steps == [0]
