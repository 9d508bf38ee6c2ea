"""MicroBatchTimer (timing + gather on gloo), Rebalancer.set_cost, sampler.set_cost."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.distributed")

from seqbalance.costs import QuadraticCost, TimingRecorder, TokenCost  # noqa: E402
from seqbalance.planning.planner import plan  # noqa: E402
from seqbalance.torch import BalancedDistributedSampler  # noqa: E402
from seqbalance.torch.balancer import Rebalancer  # noqa: E402
from seqbalance.torch.testing import run_distributed  # noqa: E402
from seqbalance.torch.timing import MicroBatchTimer  # noqa: E402

TIMEOUT = 120
LENGTHS = np.array([9, 3, 7, 1, 8, 2, 6, 5, 4, 4, 12, 2], dtype=np.int64)
QUAD = QuadraticCost(per_token=1.0, per_token_sq=0.5, per_microbatch=3.0)


def _sleep_for(rank: int, slot: int) -> float:
    return 0.002 * (1 + slot + 2 * rank)


def worker_timer(rank: int, world: int) -> dict:
    out: dict = {}
    # With the plan: only the times travel.
    p = plan(LENGTHS, world, 16, cost=TokenCost(), sync="ddp")
    rec = TimingRecorder(sync="ddp")
    timer = MicroBatchTimer(rec, clock="wall")
    for _ in range(2):
        for j, _mb in enumerate(p.micro_batches[rank]):
            with timer.time():
                time.sleep(_sleep_for(rank, j))
        timer.end_step(p)
    out["plan_records"] = [(r.rank, r.step, r.slot, r.lengths.tolist(), r.seconds)
                           for r in rec.records]
    # Without a plan: ragged micro-batches, lengths given to time().
    mine = [[5, 5], [7]] if rank == 0 else [[1], [2], [3]]
    for lens in mine:
        with timer.time(lens):
            time.sleep(0.001)
    got = timer.end_step()
    out["free_records"] = [(r.rank, r.step, r.slot, r.lengths.tolist()) for r in got]
    out["free_seconds"] = [r.seconds for r in got]
    # A rank that timed too few micro-batches: every rank raises, nobody hangs.
    n = len(p.micro_batches[rank]) - (1 if rank == 1 else 0)
    for _ in range(n):
        with timer.time():
            pass
    try:
        timer.end_step(p)
    except ValueError as exc:
        out["mismatch"] = str(exc)
    # Rank 1 times without lengths and without a plan: every rank raises, nobody hangs.
    with timer.time(None if rank == 1 else [4]):
        pass
    try:
        timer.end_step()
    except ValueError as exc:
        out["no_lengths"] = str(exc)
    out["overhead"] = timer.overhead
    # Rebalancer: switch the cost between two calls; every rank plans alike.
    bal = Rebalancer(max_tokens=16, cost=TokenCost(), sync="ddp")
    per = len(LENGTHS) // world
    local = LENGTHS[rank * per:(rank + 1) * per]
    batch = {"x": torch.as_tensor(local)}
    _, h1 = bal(batch, local)
    bal.set_cost(QUAD)
    _, h2 = bal(batch, local)
    out["plans"] = (h1.plan.micro_batches, h2.plan.micro_batches)
    return out


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
def test_timer_gathers_identical_records_on_every_rank():
    world = 2
    res = run_distributed(worker_timer, world, timeout=TIMEOUT - 10)
    p = plan(LENGTHS, world, 16, cost=TokenCost(), sync="ddp")
    want = [
        (r, step, j, sorted(LENGTHS[mb].tolist()))
        for step in range(2)
        for r in range(world)
        for j, mb in enumerate(p.micro_batches[r])
    ]
    for out in res:
        got = out["plan_records"]
        assert got == res[0]["plan_records"]  # bit-identical on every rank
        assert [(r, s, j, sorted(lens)) for r, s, j, lens, _ in got] == want
        for r, _, j, _, secs in got:
            assert secs >= _sleep_for(r, j)  # sleep guarantees at least that long
        assert out["free_records"] == [
            (0, 2, 0, [5, 5]), (0, 2, 1, [7]), (1, 2, 0, [1]), (1, 2, 1, [2]), (1, 2, 2, [3])
        ]
        assert all(s >= 0.001 for s in out["free_seconds"])
        assert "ranks [1] timed a different number" in out["mismatch"]
        assert "ranks [1] timed a micro-batch without lengths" in out["no_lengths"]
        assert out["overhead"] > 0
    # Rebalancer: the same plans everywhere, and they follow the cost that was set.
    gathered = np.concatenate([LENGTHS[: len(LENGTHS) // 2], LENGTHS[len(LENGTHS) // 2:]])
    first, second = res[0]["plans"]
    assert res[1]["plans"] == (first, second)
    assert first == plan(gathered, world, 16, cost=TokenCost(), sync="ddp").micro_batches
    assert second == plan(gathered, world, 16, cost=QUAD, sync="ddp").micro_batches


def test_thread_clock_and_single_process():
    rec = TimingRecorder()
    timer = MicroBatchTimer(rec, clock="thread", device="cpu")
    with timer.time([100]):
        x = 0
        for i in range(20000):
            x += i
    records = timer.end_step()
    assert len(records) == 1 and records[0].rank == 0 and records[0].seconds > 0
    assert len(rec) == 1 and timer.step == 1


def test_timer_argument_errors():
    with pytest.raises(ValueError, match="clock"):
        MicroBatchTimer(clock="sundial")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        MicroBatchTimer(clock="cuda", device="cpu")
    with pytest.raises(ValueError, match="recorder must be"):
        MicroBatchTimer(recorder={})
    timer = MicroBatchTimer(device="cpu")
    with timer.time():
        pass
    with pytest.raises(ValueError, match="without lengths"):
        timer.end_step()


def test_rebalancer_rejects_per_sequence_arrays_and_unknown_names():
    with pytest.raises(ValueError, match="per-sequence cost arrays"):
        Rebalancer(16, cost=np.ones(3))
    bal = Rebalancer(16)
    with pytest.raises(ValueError):
        bal.set_cost("no-such-model")
    assert bal.cost is None


@pytest.mark.slow
def test_sampler_set_cost_applies_from_the_next_step():
    lengths = np.random.default_rng(0).integers(1, 60, size=96)
    kw = dict(num_replicas=2, rank=0, shuffle=True, seed=3)
    s = BalancedDistributedSampler(lengths, 32, 64, cost=TokenCost(), **kw)
    it = s.steps()
    first = next(it)
    s.set_cost(QUAD)
    rest = list(it)
    token = BalancedDistributedSampler(lengths, 32, 64, cost=TokenCost(), **kw)
    quad = BalancedDistributedSampler(lengths, 32, 64, cost=QUAD, **kw)
    token_steps, quad_steps = list(token.steps()), list(quad.steps())
    assert first == token_steps[0]
    assert rest == quad_steps[1:]
    assert rest != token_steps[1:]  # the switch changed something
    # The plan of the step already drawn is kept; the others follow the new cost.
    assert s.step_plans()[0].micro_batches == token.step_plans()[0].micro_batches
    # A bad cost is refused and the old one kept.
    with pytest.raises(ValueError):
        s.set_cost(np.ones(5))
    assert s.cost is QUAD


def test_end_step_refuses_a_plan_for_another_number_of_ranks_alone():
    # One process (rank 0 of 1) given a plan of 2 ranks: rank 1's micro-batches would never
    # be timed, and the message blamed the count of timed micro-batches.
    timer = MicroBatchTimer(device="cpu", clock="thread")
    p = plan([1, 2, 3], 2, 8)
    for _ in p.micro_batches[0]:
        with timer.time():
            pass
    with pytest.raises(ValueError, match="plan is for 2 ranks but the group has 1"):
        timer.end_step(p)
    assert timer.step == 0


def _timed_step(p, mine) -> tuple[str, int]:
    """Time ``mine`` (empty regions) and end the step with plan ``p``: the error message
    (or "ok") and the timer's step after it."""
    timer = MicroBatchTimer(device="cpu", clock="thread")
    for _ in mine:
        with timer.time():
            pass
    try:
        timer.end_step(p)
    except ValueError as exc:
        return str(exc), timer.step
    return "ok", timer.step


def _end_step_wrong_world(rank: int, world: int, planned: int):
    p = plan(list(range(1, 7)), planned, 8)
    return _timed_step(p, p.micro_batches[rank] if rank < planned else [[0]])[0]


@pytest.mark.slow
@pytest.mark.parametrize("planned", [1, 3])
def test_end_step_refuses_a_plan_for_another_world_on_every_rank(planned):
    """A plan of 1 rank in a world of 2 raised IndexError on rank 1 alone (rank 0 waited in
    the all-gather); a plan of 3 ranks silently left out rank 2's records."""
    out = run_distributed(
        _end_step_wrong_world, 2, planned, timeout=TIMEOUT - 10, collective_timeout=20
    )
    assert all(f"plan is for {planned} ranks but the group has 2" in msg for msg in out)


def _end_step_different_plans(rank: int, world: int, case: str):
    lengths = [9, 3, 7, 1, 8, 2]
    if case == "count" and rank == 1:
        p = plan(lengths, world, 10)  # more micro-batches than rank 0's plan
    elif case == "content" and rank == 1:
        p = plan(lengths[::-1], world, 16)  # as many slots, other sequences in them
    elif case == "world" and rank == 1:
        p = plan(lengths, world + 1, 16)
    else:
        p = plan(lengths, world, 16)
    return _timed_step(p, p.micro_batches[rank])


@pytest.mark.slow
@pytest.mark.parametrize("case", ["count", "content", "world"])
def test_end_step_refuses_different_plans_on_every_rank(case):
    """Rank 1 holding another plan than rank 0: with more micro-batches the ranks gathered
    rows of different lengths (a hang or an error on some ranks alone); with the same count
    rank 0 recorded rank 1's times against its own plan's lengths, silently; with a plan for
    another world size rank 1 raised alone while rank 0 waited in the gather."""
    ref_a, ref_b = plan([9, 3, 7, 1, 8, 2], 2, 16), plan([9, 3, 7, 1, 8, 2], 2, 10)
    if case == "count":  # the test's premise: the two plans differ in slot count
        assert ref_a.num_micro_batches != ref_b.num_micro_batches
    if case == "content":
        other = plan([2, 8, 1, 7, 3, 9], 2, 16)
        assert other.num_micro_batches == ref_a.num_micro_batches
        assert other.micro_batches != ref_a.micro_batches or not np.array_equal(
            other.lengths, ref_a.lengths)
    out = run_distributed(
        _end_step_different_plans, 2, case, timeout=TIMEOUT - 10, collective_timeout=20
    )
    want = ("the plan is for 3 ranks but the group has 2 on ranks [1]" if case == "world"
            else "ranks [1] passed a different plan than rank 0")
    assert all(want in msg and step == 0 for msg, step in out), out


def _end_step_same_plan_twice(rank: int, world: int):
    timer = MicroBatchTimer(device="cpu", clock="thread")
    p = plan([9, 3, 7, 1, 8, 2], world, 16)
    again = plan(np.array([9, 3, 7, 1, 8, 2], dtype=np.int32), world, 16)  # equal plan
    got = []
    for q in (p, again):
        for _ in q.micro_batches[rank]:
            with timer.time():
                pass
        got.append(len(timer.end_step(q)))
    return got


@pytest.mark.slow
def test_end_step_accepts_equal_plans_built_separately():
    out = run_distributed(_end_step_same_plan_twice, 2, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    n = sum(len(r) for r in plan([9, 3, 7, 1, 8, 2], 2, 16).micro_batches)
    assert out == [[n, n], [n, n]]


def _end_step_plan_on_one_rank(rank: int, world: int):
    timer = MicroBatchTimer(device="cpu", clock="thread")
    p = plan([9, 3, 7, 1, 8, 2], world, 16)
    for mb in p.micro_batches[rank]:
        with timer.time([3] * len(mb)):
            pass
    try:
        timer.end_step(p if rank == 0 else None)
    except ValueError as exc:
        return str(exc)
    return "ok"


@pytest.mark.slow
def test_end_step_refuses_a_plan_on_some_ranks_only():
    """Rank 0 gathering a tensor row while rank 1 gathered Python objects: collectives of
    different kinds and sizes (a hang, or garbage)."""
    out = run_distributed(_end_step_plan_on_one_rank, 2, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    assert all("ranks [0] passed a plan to end_step and ranks [1] did not" in m for m in out)


def test_plan_digest_tells_apart_plans_that_share_their_bytes():
    """Without the counts hashed first, lengths [5, 7] with sequence 0 in rank 0's slot
    and lengths [5, 7, 1] with that slot empty hashed the same bytes: two ranks holding
    them recorded different things without an error."""
    from seqbalance.planning.plans import Plan
    from seqbalance.torch.timing import _plan_digest

    a = Plan([[[0]], [[1]]], [5, 7], max_tokens=16)
    b = Plan([[[]], [[1]]], [5, 7, 1], max_tokens=16)
    assert (a.num_micro_batches, len(a.micro_batches)) == (b.num_micro_batches,
                                                           len(b.micro_batches))
    assert _plan_digest(a) != _plan_digest(b)
    # Equal plans from other inputs (int32 lengths, a JSON round trip) agree.
    p = plan([9, 3, 7, 1, 8, 2], 2, 16)
    same = plan(np.array([9, 3, 7, 1, 8, 2], dtype=np.int32), 2, 16)
    assert _plan_digest(p) == _plan_digest(same) == _plan_digest(Plan.from_json(p.to_json()))
    assert all(d == int(d) and 0 <= d < 2**48 for d in _plan_digest(p))  # exact in float64


def _end_step_not_a_plan_on_rank_1(rank: int, world: int):
    p = plan([9, 3, 7, 1, 8, 2], world, 16)
    given = p if rank == 0 else {"micro_batches": p.micro_batches}  # a dict, not a Plan
    return _timed_step(given, p.micro_batches[rank])


@pytest.mark.slow
def test_end_step_reports_an_unreadable_plan_on_every_rank():
    """A dict where the Plan was due raised AttributeError on that rank alone, before the
    gather, while rank 0 waited in it."""
    out = run_distributed(_end_step_not_a_plan_on_rank_1, 2, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    assert all("ranks [1] passed end_step arguments it cannot use" in msg and step == 0
               for msg, step in out), out
    assert "plan must be the step's Plan" in out[1][0] and "this rank's are fine" in out[0][0]


def _end_step_odd_arguments(rank: int, world: int, case: str):
    p = plan([9, 3, 7, 1, 8, 2], world, 16)
    timer = MicroBatchTimer(device="cpu", clock="thread")
    for _ in p.micro_batches[rank]:
        with timer.time():
            pass
    if case == "lengths list" and rank == 1:
        p.lengths = p.lengths.tolist()  # the same values, as a list
    try:
        got = timer.end_step(p, step="x" if case == "step" and rank == 1 else None)
    except ValueError as exc:
        return "error", str(exc)
    return "ok", [(r.rank, r.slot, r.lengths.tolist()) for r in got]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["step", "lengths list"])
def test_end_step_odd_arguments_on_one_rank(case):
    """step="x" on one rank raised there before the gather (the other waited until the
    timeout); a plan whose lengths are a list on one rank raised TypeError there after
    the gathers while the other rank returned its records."""
    out = run_distributed(_end_step_odd_arguments, 2, case, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    if case == "step":
        assert all(kind == "error" and "step must be an integer, got 'x'" in out[1][1]
                   and "ranks [1] passed end_step arguments" in msg for kind, msg in out)
    else:
        assert out[0] == out[1] and out[0][0] == "ok"


def _end_step_cp_plan(rank: int, world: int, tamper: bool):
    p = plan([100, 5000, 300, 20], 1, 4096, cp_size=world)  # one replica of `world` GPUs
    if tamper and rank == 1:
        # Same micro-batches, the CP sequence cut elsewhere: a plan that is not rank 0's.
        doc = p.to_dict()
        for gpu in doc["pieces"]:
            for slot in gpu:
                for piece in slot:
                    if piece[0] == 1:  # the 5,000-token sequence: every inner cut +1
                        piece[1] += 0 < piece[1] < 5000
                        piece[2] += 0 < piece[2] < 5000
        p = type(p).from_dict(doc)
    rec = TimingRecorder(sync="fsdp")
    timer = MicroBatchTimer(rec, device="cpu", clock="thread")
    for _ in p.micro_batches[rank]:
        with timer.time():
            sum(range(2000))
    try:
        got = timer.end_step(p)
    except ValueError as exc:
        return "error", str(exc)
    from seqbalance.costs._cp_records import plan_pieces

    want = plan_pieces(p.pieces, p.micro_batches)
    return "ok", [
        (t.rank, t.slot, t.lengths.tolist(), t.pieces.tolist(),
         np.array_equal(t.pieces, want[t.rank][t.slot]))
        for t in got
    ]


@pytest.mark.slow
def test_end_step_records_the_pieces_of_a_context_parallel_plan():
    """A CP plan was refused (its GPUs run pieces, which records could not hold); now each
    GPU's record carries its pieces, the same on every rank, as the plan gives them."""
    out = run_distributed(_end_step_cp_plan, 2, False, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    assert out[0] == out[1] and out[0][0] == "ok", out
    recs = out[0][1]
    assert all(same for *_, same in recs)
    # The 5,000-token sequence (index 1) over both GPUs, two chunks of 1,250 each.
    split = [(r, pcs, lens.index(5000)) for r, _, lens, pcs, _ in recs if 5000 in lens]
    assert [r for r, *_ in split] == [0, 1]
    for _, pcs, at in split:
        mine = [row for row in pcs if row[0] == at]
        assert [d for _, d, _, _ in mine] == [2, 2]
        assert sum(e - s for _, _, s, e in mine) == 2500


@pytest.mark.slow
def test_end_step_refuses_context_parallel_plans_that_differ_in_pieces_only():
    """The plan digest covered micro-batches and lengths only, so two CP plans listing the
    same sequences per GPU but cutting them elsewhere passed as one plan."""
    out = run_distributed(_end_step_cp_plan, 2, True, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    assert all(kind == "error" and "passed a different plan than rank 0" in msg
               for kind, msg in out), out


def _end_step_padded(rank: int, world: int):
    lens = [30, 7, 12, 25, 3, 18, 9, 22]
    p = plan(lens, world, 64, padded=True)
    timer = MicroBatchTimer(device="cpu", clock="thread")
    for _ in p.micro_batches[rank]:
        with timer.time():
            pass
    got = timer.end_step(p)
    want = [[max(lens[i] for i in mb)] * len(mb) for r in p.micro_batches for mb in r]
    return [t.lengths.tolist() for t in got] == want and len(got) == len(want)


@pytest.mark.slow
def test_end_step_records_a_padded_plan_as_it_ran():
    """Every row of a padded micro-batch runs at the longest row's length; raw lengths made
    refit learn a per-token cost too low (c = 6.6e-10 for a true 1e-9)."""
    assert run_distributed(_end_step_padded, 2, timeout=TIMEOUT - 10) == [True, True]


# ---- blocks that raise or nest, zero readings, lengths and steps that disagree ---------


def test_a_block_that_raises_keeps_its_slot_but_is_not_recorded():
    # Its partial time was recorded as the whole micro-batch's: the too-short record that
    # pulls a relative fit towards 0.
    p = plan([9, 3, 7, 1, 8, 2], 1, 16)
    rec = TimingRecorder()
    timer = MicroBatchTimer(rec, device="cpu", clock="wall")
    for j, _ in enumerate(p.micro_batches[0]):
        try:
            with timer.time():
                time.sleep(0.001)
                if j == 0:
                    raise RuntimeError("out of memory")
        except RuntimeError:
            pass  # the usual loop: skip the micro-batch, go on
    got = timer.end_step(p)
    assert [t.slot for t in got] == list(range(1, p.num_micro_batches))
    assert [t.slot for t in rec.records] == [t.slot for t in got] and timer.step == 1


def test_blocks_cannot_nest():
    timer = MicroBatchTimer(device="cpu", clock="wall")
    with timer.time([5]):
        with pytest.raises(ValueError, match="cannot nest"):
            with timer.time([3]):
                pass
    assert [lens.tolist() for lens, *_ in timer._pending] == [[5]]
    with timer.time([3]):  # the next block, after the first, is fine
        pass
    assert [t.lengths.tolist() for t in timer.end_step()] == [[5], [3]]


def test_a_zero_reading_records_nothing_and_says_why(monkeypatch):
    # A coarse clock read 0 s: end_step raised in the recorder after adding part of the
    # step and moving its step counter on, with a message that did not say what to do.
    rec = TimingRecorder()
    timer = MicroBatchTimer(rec, device="cpu", clock="thread")
    ticks = iter([0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5] + [0.5] * 50)
    monkeypatch.setattr(timer, "_now", lambda: next(ticks))
    monkeypatch.setattr(timer, "_mark", lambda: next(ticks))
    with timer.time([4]):
        pass
    with timer.time([6]):
        pass
    with pytest.raises(ValueError, match=r"micro-batch 1 measured 0.0 s: the clock \('thread'\)"):
        timer.end_step()
    assert len(rec) == 0 and timer.step == 0 and not timer._pending


def _end_step_disagreeing(rank: int, world: int, case: str):
    p = plan([9, 3, 7, 1, 8, 2, 5, 6], world, 16)
    timer = MicroBatchTimer(device="cpu", clock="wall")
    mbs = p.micro_batches[rank]
    order = mbs[::-1] if case == "lengths" and rank == 1 else mbs
    for mb in order:
        with timer.time(p.lengths[mb]):
            time.sleep(0.001)
    step = 5 if case == "step" and rank == 1 else None
    try:
        timer.end_step(p, step=step)
    except ValueError as exc:
        return str(exc), timer.step
    return "ok", timer.step


@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("case", ["lengths", "step"])
def test_end_step_refuses_lengths_or_steps_that_disagree_on_every_rank(case):
    """Lengths given to time() that were not the plan's slot's were ignored (times paired
    with the plan's lengths, in another order); ranks passing different step= recorded
    different steps, and their recorders' windows drifted apart."""
    out = run_distributed(_end_step_disagreeing, 2, case, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    if case == "lengths":
        assert all("ranks [1] timed micro-batches that are not their plan rank's" in m
                   and step == 0 for m, step in out), out
        assert "micro-batch 0 was timed with lengths" in out[1][0]
    else:
        assert all("ranks [1] record this step as step 5, rank 0 as step 0" in m
                   for m, _ in out), out


def test_plan_rank_must_be_a_rank_of_the_group():
    for bad in (-1, True, 1.5, "0", 2**31, 10**400):
        with pytest.raises(ValueError, match=r"plan_rank must be an integer in 0 \.\. 2\*\*31 - 1"):
            MicroBatchTimer(device="cpu", plan_rank=bad)
    with pytest.raises(AttributeError):
        MicroBatchTimer(device="cpu").plan_rank = 1  # read-only: checked once, at the start
    p = plan([1, 2, 3], 1, 8)
    timer = MicroBatchTimer(device="cpu", clock="thread", plan_rank=1)
    for _ in p.micro_batches[0]:
        with timer.time():
            sum(range(100))
    with pytest.raises(ValueError, match=r"plan ranks \[1\] are beyond the group's 1 ranks"):
        timer.end_step(p)
    assert timer.step == 0
    timer = MicroBatchTimer(device="cpu", clock="thread", plan_rank=np.int64(0))
    for _ in p.micro_batches[0]:
        with timer.time():
            sum(range(100))
    assert [t.rank for t in timer.end_step(p)] == [0] * len(p.micro_batches[0])


def _reversed_plan_ranks(rank: int, world: int, with_plan: bool):
    timer = MicroBatchTimer(device="cpu", clock="wall", plan_rank=world - 1 - rank)
    timer._seconds = lambda: [100.0 * rank + 1]  # exact: says which process timed it
    p = plan([3, 5], world, 8, size="equal")  # plan rank r holds one sequence
    mine = p.micro_batches[world - 1 - rank]
    with timer.time(None if with_plan else p.lengths[mine[0]]):
        pass
    records = timer.end_step(p if with_plan else None)
    return [(t.rank, t.lengths.tolist(), t.seconds) for t in records]


@pytest.mark.slow
@pytest.mark.parametrize("with_plan", [True, False])
def test_records_are_kept_under_plan_ranks_in_plan_rank_order(with_plan):
    out = run_distributed(_reversed_plan_ranks, 2, with_plan, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    p = plan([3, 5], 2, 8, size="equal")
    want = [(r, p.lengths[p.micro_batches[r][0]].tolist(), 100.0 * (1 - r) + 1) for r in (0, 1)]
    assert out[0] == out[1] == want


def _plan_rank_problems(rank: int, world: int, case: str):
    """Every rank's error and step after it, for plan ranks that do not fit the step."""
    mine = 0 if case == "clash" else 1 - rank
    timer = MicroBatchTimer(device="cpu", clock="wall", plan_rank=mine)
    timer._seconds = lambda: [1.0] * len(timer._pending)
    p = plan([3, 5, 2, 4], world, 8, size="equal")
    planned = p.micro_batches[timer.plan_rank]
    timed = planned if case == "clash" or rank == 1 else planned[:-1]  # one slot too few
    for mb in timed:
        with timer.time(p.lengths[mb]):
            pass
    try:
        timer.end_step(None if case == "clash" else p)
    except ValueError as exc:
        return str(exc), timer.step
    return "ok", timer.step


@pytest.mark.slow
@pytest.mark.parametrize("case", ["clash", "miscount"])
def test_plan_rank_problems_are_refused_on_every_rank_in_plan_rank_words(case):
    """Without a plan, two processes on plan rank 0 would record two rank-0 rows; with a
    plan, a miscount names group rank 0 and the plan rank it ran (1)."""
    out = run_distributed(_plan_rank_problems, 2, case, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    want = {
        "clash": "ranks [0, 1] all run plan rank 0",
        "miscount": "group ranks [0] (plan ranks [1]) timed a different number of micro-batches",
    }[case]
    assert all(want in msg and step == 0 for msg, step in out), out


CP_SHARD_LENGTHS = [100, 5000, 300, 20, 2600, 7]


def _cp_shard_reversed(rank: int, world: int, case: str):
    """Process ``rank`` runs plan GPU ``world - 1 - rank`` (an order that is not the plan's),
    takes its pieces with cp_shard and times them without lengths; the times say which
    GPU and slot they came from."""
    from seqbalance.torch import cp_shard

    p = plan(CP_SHARD_LENGTHS, 1, 4096, cp_size=world)  # one replica of `world` GPUs
    gpu = world - 1 - rank
    cu = torch.as_tensor(np.concatenate([[0], np.cumsum(CP_SHARD_LENGTHS)]))
    mbs, handle = cp_shard({"cu_seqlens": cu, "input_ids": torch.arange(int(cu[-1]))}, p, gpu)
    mapped = case.endswith("mapped")
    timer = MicroBatchTimer(device="cpu", clock="wall", plan_rank=gpu if mapped else None)
    timer._seconds = lambda: [gpu * 10.0 + j + 1 for j in range(len(timer._pending))]
    for _ in mbs:
        with timer.time():
            pass
    try:
        got = timer.end_step(handle if case.startswith("handle") else p)
    except ValueError as exc:
        return "error", str(exc)
    return "ok", [(t.rank, t.slot, t.lengths.tolist(), t.seconds) for t in got]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["handle-mapped", "plan-mapped", "handle", "plan"])
def test_end_step_takes_a_cp_shard_handle_and_checks_its_gpu(case):
    """cp_shard's handle stands for the lengths not given to time(), like rebalance's: a
    process timing another GPU than the one it took pieces of (plan_rank missing in a rank
    order that is not the plan's) is refused on every rank. With the plan alone and no
    lengths nothing can tell, and the records carry the other GPU's times."""
    world = 2
    out = run_distributed(_cp_shard_reversed, world, case, timeout=TIMEOUT - 10,
                          collective_timeout=20)  # fmt: skip
    p = plan(CP_SHARD_LENGTHS, 1, 4096, cp_size=world)
    assert len(p.micro_batches[0]) == len(p.micro_batches[1])  # a miscount cannot tell either
    right = [
        (g, j, p.lengths[mb].tolist(), g * 10.0 + j + 1)
        for g in range(world)
        for j, mb in enumerate(p.micro_batches[g])
    ]
    if case.endswith("mapped"):
        assert out[0] == out[1] == ("ok", right)
    elif case == "handle":
        want = "ranks [0, 1] timed micro-batches that are not their plan rank's"
        hint = "MicroBatchTimer(plan_rank=...)"
        assert all(kind == "error" and want in msg and "cp_shard" in msg and hint in msg
                   for kind, msg in out), out  # fmt: skip
    else:  # the silent case the handle closes: GPU 0's records hold GPU 1's times
        assert out[0] == out[1] and out[0][0] == "ok"
        assert [s for *_, s in out[0][1]] == [(1 - g) * 10.0 + j + 1 for g, j, *_ in right]
