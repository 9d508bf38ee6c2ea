"""Static context parallelism under plan()'s rules on ranks and micro-batches.

``plan(cp_size=C, cp="static")`` plans its replicas as ranks, so groups, size rules,
orders, ``oversized="alone"``, ``extra_micro_batches`` and ``sequences_per_micro_batch``
hold per replica. These tests check each rule from the pieces themselves (a replica is GPUs
``r*C .. r*C + C - 1``), not through ``CPPlan.violations``, which they check separately.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import seqbalance as sb
from seqbalance.costs import ContextParallelCost, FlopsCost, QuadraticCost, TokenCost
from seqbalance.costs.context_parallel import balanced_layout
from seqbalance.planning.cp_plans import CPPlan


def largest_piece(length: int, d: int) -> int:
    return max(sum(e - s for s, e in rank) for rank in balanced_layout(length, d))


def replicas_of(p: CPPlan) -> dict[int, set[int]]:
    """Sequence -> the replicas whose GPUs hold a piece of it, read from the pieces."""
    out: dict[int, set[int]] = {}
    for g, gpu in enumerate(p.pieces):
        for slot in gpu:
            for i, _, _ in slot:
                out.setdefault(i, set()).add(g // p.cp_size)
    return out


def check_static_layout(p: CPPlan, lens: np.ndarray) -> None:
    """Every token once, each sequence over all C GPUs of one replica in one slot."""
    c = p.cp_size
    assert p.world_size == p.dp_size * c
    held = {i: [] for i in range(len(lens))}
    for g, gpu in enumerate(p.pieces):
        assert len(gpu) == p.num_micro_batches
        for j, slot in enumerate(gpu):
            for i, s, e in slot:
                held[i].append((g, j, s, e))
    for i, where in held.items():
        gpus = sorted({g for g, _, _, _ in where})
        assert len(gpus) == c and gpus[0] % c == 0 and gpus[-1] == gpus[0] + c - 1, (i, gpus)
        assert len({j for _, j, _, _ in where}) == 1, i
        ranges = sorted((s, e) for _, _, s, e in where if e > s)
        covered = 0
        for s, e in ranges:
            assert s == covered, (i, ranges)
            covered = e
        assert covered == lens[i], i


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 6000), min_size=4, max_size=36),
    st.sampled_from([2, 4]),
    st.integers(1, 4),
    st.sampled_from(["free", "equal", "balanced"]),
    st.integers(1, 4),
    st.integers(0, 3000),
)
def test_groups_and_size_hold_per_replica(lengths, c, dp, size, per_group, slack):
    lens = np.asarray(lengths, dtype=np.int64)
    n = lens.size
    groups = np.arange(n) // per_group
    n_groups = int(groups.max()) + 1
    if size == "equal" and n_groups % dp:
        dp = 1  # equal counts need a multiple of dp; dp=1 always is one
    cap = max(largest_piece(int(x), c) for x in lens) + slack
    p = sb.plan(
        lens, dp, cap, cp_size=c, cp="static", groups=groups, size=size, allow_empty=True
    )
    check_static_layout(p, lens)
    where = replicas_of(p)
    per_replica = [set() for _ in range(dp)]
    for i in range(n):
        assert len(where[i]) == 1
        per_replica[next(iter(where[i]))].add(int(groups[i]))
    # a group on one replica: its members' replicas agree
    for gid in range(n_groups):
        members = np.flatnonzero(groups == gid)
        assert len({next(iter(where[int(i)])) for i in members}) == 1, gid
    counts = sorted(len(s) for s in per_replica)
    if size == "equal":
        assert counts[0] == counts[-1] == n_groups // dp
    elif size == "balanced":
        assert counts[-1] - counts[0] <= 1
    assert (p.microbatch_tokens() <= cap).all()
    broken = {k: v for k, v in p.violations().items() if v and k != "empty"}
    assert not broken  # allow_empty: a replica without a group has empty slots
    assert p.size == size and p.groups.tolist() == groups.tolist()


def test_plan_is_the_same_on_every_call_and_survives_json():
    rng = np.random.default_rng(7)
    lens = rng.integers(200, 40_000, size=96)
    groups = np.repeat(np.arange(24), 4)
    kw = dict(cp_size=4, cp="static", cost="qwen2.5-7b", groups=groups, size="equal")
    a = sb.plan(lens, 4, 16_384, **kw)
    b = sb.plan(lens, 4, 16_384, **kw)
    assert a.to_json() == b.to_json()
    back = sb.Plan.from_json(a.to_json())
    assert isinstance(back, CPPlan) and back.to_json() == a.to_json()
    assert back.size == "equal" and back.groups.tolist() == groups.tolist()


def test_violations_count_a_group_split_over_two_replicas():
    # Hand-made pieces, two replicas of 2 GPUs. Group 0 is sequences 0 and 1, on replica 0
    # and replica 1: split once. Replica 0 holds group 0, replica 1 groups 0 and 1.
    lens = [4, 4, 4]
    layout = [balanced_layout(4, 2)[k] for k in range(2)]
    pieces = [
        [[(0, s, e) for s, e in layout[0]]],
        [[(0, s, e) for s, e in layout[1]]],
        [[(1, s, e) for s, e in layout[0]] + [(2, s, e) for s, e in layout[0]]],
        [[(1, s, e) for s, e in layout[1]] + [(2, s, e) for s, e in layout[1]]],
    ]
    cpc = ContextParallelCost(TokenCost())
    p = CPPlan(pieces, lens, max_tokens=8, cp_size=2, cp="static", cp_cost=cpc,
               groups=[0, 0, 1], size="equal")  # fmt: skip
    v = p.violations()
    assert v["split_groups"] == 1
    assert v["size_rule"] == 1  # replica 1 holds 2 groups, equal counts want 1 each
    # the same pieces without the rules break nothing
    q = CPPlan(pieces, lens, max_tokens=8, cp_size=2, cp="static", cp_cost=cpc)
    assert not any(q.violations().values())
    # from_dict reads the rules (they are what the plan was made under, not derived)
    d = q.to_dict()
    d["groups"] = [0, 0, 1]
    assert CPPlan.from_dict(d).violations()["split_groups"] == 1


def _slowest_piece_costs(lens: np.ndarray, cpc: ContextParallelCost, c: int) -> np.ndarray:
    return cpc.rank_costs(lens, c)[0].max(axis=1)


@pytest.mark.parametrize("order", ["heaviest_first", "light_ends", "index"])
def test_order_applies_to_each_replicas_slots(order):
    rng = np.random.default_rng(3)
    lens = rng.integers(100, 30_000, size=80)
    cpc = ContextParallelCost(FlopsCost.from_name("qwen2.5-7b"), bandwidth=1e11)
    p = sb.plan(lens, 2, 8192, cp_size=4, cp="static", cp_cost=cpc, order=order)
    check_static_layout(p, lens)
    c = p.cp_size
    # every GPU of a replica runs the same sequences slot by slot
    for r in range(p.dp_size):
        rows = [p.micro_batches[g] for g in range(r * c, (r + 1) * c)]
        assert all(row == rows[0] for row in rows)
    slowest = _slowest_piece_costs(lens, cpc, c)
    replica_rows = [p.micro_batches[r * c] for r in range(p.dp_size)]
    if order == "index":
        for row in replica_rows:
            firsts = [min(mb) for mb in row]
            assert firsts == sorted(firsts)
        return
    m = p.num_micro_batches
    slot = np.array([max(cpc.per_microbatch + slowest[row[j]].sum() for row in replica_rows)
                     for j in range(m)])  # fmt: skip
    if order == "heaviest_first":
        assert (np.diff(slot) <= 1e-9 * slot.max()).all(), slot
    else:  # heaviest in the middle, lightest at both ends
        peak = int(np.argmax(slot))
        assert (np.diff(slot[: peak + 1]) >= -1e-9 * slot.max()).all(), slot
        assert (np.diff(slot[peak:]) <= 1e-9 * slot.max()).all(), slot
    # reordering slots changes no slot's contents, so the simulated step is the same
    free = sb.plan(lens, 2, 8192, cp_size=4, cp="static", cp_cost=cpc)
    assert sorted(map(sorted, (tuple(mb) for row in replica_rows for mb in row))) == sorted(
        map(sorted, (tuple(mb) for r in range(2) for mb in free.micro_batches[r * c]))
    )
    assert p.simulate().step_time == pytest.approx(free.simulate().step_time, rel=1e-12)


def test_oversized_alone_runs_the_sequence_alone_over_the_cap():
    lens = np.array([3000, 500, 50_000, 800, 1200, 7000, 2500, 60], dtype=np.int64)
    c, cap = 4, 8192
    others = lens[lens < 50_000]
    assert largest_piece(50_000, c) > cap >= max(largest_piece(int(x), c) for x in others)
    with pytest.raises(ValueError, match="sequence 2 has 50000 tokens"):
        sb.plan(lens, 2, cap, cp_size=c, cp="static")
    p = sb.plan(lens, 2, cap, cp_size=c, cp="static", oversized="alone")
    check_static_layout(p, lens)
    tokens = p.microbatch_tokens()
    for g, gpu in enumerate(p.micro_batches):
        for j, mb in enumerate(gpu):
            if 2 in mb:
                assert mb == [2] and tokens[g, j] > cap
            else:
                assert tokens[g, j] <= cap
    assert p.violations()["over_capacity"] == c  # its C GPUs in its one slot
    assert any("largest piece over cp_size=4 GPUs is longer than max_tokens=8192" in n
               for n in p.notes)  # fmt: skip
    # The plan can be simulated and bounded (the bound refused the oversized sequence, so
    # simulate, stats and lower_bound raised; found by review). Free communication and a
    # token cost: the bound is the largest piece, 50,000 / 4 = 12,500 tokens, and no GPU
    # can finish sooner than the one holding it.
    sim = p.simulate()
    assert p.lower_bound() == 12_500 == sim.lower_bound
    assert sim.step_time >= sim.lower_bound
    assert p.stats()["violations"]["over_capacity"] == c
    assert sb.Plan.from_json(p.to_json()).simulate().step_time == sim.step_time
    assert p.min_micro_batches_bound() == 1


def test_sequences_per_micro_batch():
    rng = np.random.default_rng(11)
    lens = rng.integers(100, 20_000, size=60)
    p = sb.plan(lens, 3, 16_384, cp_size=2, cp="static", sequences_per_micro_batch=3)
    check_static_layout(p, lens)
    assert max(len(mb) for gpu in p.micro_batches for mb in gpu) <= 3
    assert p.num_micro_batches >= -(-60 // (3 * 3))


def test_extra_counts_are_taken_when_faster():
    # Under fsdp with an attention term, 5 slots balance better than the fewest, 4.
    cost = QuadraticCost(per_token=1.0, per_token_sq=1e-4)
    lens = [4259, 1837, 4846, 6679, 13046, 7275, 1561, 5424, 9641, 13029, 11684, 15886, 3087,
            14095, 976, 8975, 4472]  # fmt: skip
    kw = dict(cp_size=2, cp="static", cost=cost)
    base = sb.plan(lens, 2, 8192, **kw)
    at5 = sb.plan(lens, 2, 8192, min_micro_batches=base.num_micro_batches + 1, **kw)
    more = sb.plan(lens, 2, 8192, extra_micro_batches=2, **kw)
    check_static_layout(more, np.asarray(lens))
    assert more.num_micro_batches > base.num_micro_batches
    assert more.simulate().step_time <= at5.simulate().step_time < base.simulate().step_time
    assert not any(more.violations().values())
    assert any(n.startswith("extra_micro_batches=2:") for n in more.notes)
    assert not any("min_micro_batches=" in n for n in more.notes)  # the caller passed none


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(100, 16_000), min_size=4, max_size=24),
    st.sampled_from([2, 4]),
    st.integers(1, 3),
    st.integers(1, 3),
    st.sampled_from(["fsdp", "ddp"]),
    st.sampled_from([0.0, 2e4, 2e5]),
)
@example([8097, 8677, 12327, 15256, 1522, 3162], 2, 2, 1, "ddp", 1e5)
def test_extra_counts_never_slower_than_none(lengths, c, dp, extra, sync, c0):
    # The replica plan's costs carry no per-micro-batch term, so extra counts looked free
    # to it: 3 slots at 312,438 against 2 at 212,438 in the example (found by review).
    cost = QuadraticCost(per_token=1.0, per_token_sq=1e-5, per_microbatch=c0)
    kw = dict(cp_size=c, cp="static", cost=cost, sync=sync, allow_empty=True)
    base = sb.plan(lengths, dp, 8192, **kw)
    more = sb.plan(lengths, dp, 8192, extra_micro_batches=extra, **kw)
    assert more.simulate().step_time <= base.simulate().step_time * (1 + 1e-12)
    assert more.num_micro_batches <= base.num_micro_batches + extra


def test_replica_plan_errors_and_notes_speak_of_replicas():
    lens = [100] * 8
    with pytest.raises(ValueError, match=r"^static CP: .*replica \d+ holds 0 sequences"):
        sb.plan(lens, 4, 1000, cp_size=2, cp="static", groups=[0] * 4 + [1] * 4)
    rng = np.random.default_rng(0)
    p = sb.plan(rng.integers(100, 30_000, 64), 4, 8192, cp_size=4, cp="static",
                groups=np.arange(64) // 4)  # fmt: skip
    assert p.notes and not any(re.search(r"\branks?\b", n) for n in p.notes), p.notes


def test_cli_plan_static_cp_keeps_groups_on_one_replica(tmp_path, capsys):
    from seqbalance.cli import main

    rng = np.random.default_rng(5)
    lens = rng.integers(100, 30_000, size=48)
    src = tmp_path / "rollout.csv"
    src.write_text("len,prompt\n" + "".join(f"{x},p{i // 6}\n" for i, x in enumerate(lens)))
    out = tmp_path / "plan.json"
    base = ["plan", str(src), "--column", "len", "--groups-column", "prompt", "--dp", "4",
            "--max-tokens", "16384", "--cp-size", "4", "--model", "qwen2.5-7b"]  # fmt: skip
    assert main(base) == 2
    err = capsys.readouterr().err
    assert "--groups-column needs --cp static with --cp-size > 1" in err, err
    # checked before planning, as without CP, in replicas
    assert main([*base, "--cp", "static", "--dp", "9"]) == 2
    err = capsys.readouterr().err
    assert "8 groups for 9 replicas" in err and "Use --dp 8 or fewer" in err, err
    assert main([*base, "--cp", "static", "--size", "equal", "--out", str(out)]) == 0
    capsys.readouterr()
    p = sb.Plan.from_json(out.read_text())
    assert isinstance(p, CPPlan) and p.size == "equal"
    where = replicas_of(p)
    prompt = np.arange(48) // 6
    for gid in range(8):
        assert len({r for i in np.flatnonzero(prompt == gid) for r in where[int(i)]}) == 1
    per_replica = [{int(prompt[i]) for i in range(48) if r in where[i]} for r in range(4)]
    assert [len(s) for s in per_replica] == [2, 2, 2, 2]
    library = sb.plan(lens, 4, 16_384, cost="qwen2.5-7b", cp_size=4, cp="static",
                      groups=prompt, size="equal")  # fmt: skip
    assert json.loads(out.read_text())["pieces"] == library.to_dict()["pieces"]


@given(st.lists(st.integers(0, 5000), max_size=20), st.sampled_from([1, 2, 4, 8]))
def test_largest_piece_tokens_is_the_largest_share_of_the_layout(lengths, d):
    from seqbalance.costs.context_parallel import largest_piece_tokens

    want = [largest_piece(x, d) for x in lengths]
    assert largest_piece_tokens(np.asarray(lengths, dtype=np.int64), d).tolist() == want


def test_replica_micro_batches_of_static_and_dynamic_plans():
    rng = np.random.default_rng(2)
    lens = rng.integers(100, 30_000, size=40)
    p = sb.plan(lens, 2, 8192, cp_size=4, cp="static")
    # read from the pieces: the sequences replica r's first GPU holds a piece of, per slot
    want = [[sorted({i for i, _, _ in slot}) for slot in p.pieces[r * 4]] for r in range(2)]
    assert p.replica_micro_batches() == want
    assert sorted(i for r in want for mb in r for i in mb) == list(range(40))
    # dynamic CP puts short sequences on single GPUs: no whole micro-batch per replica
    short = np.concatenate([rng.integers(100, 2000, size=60), [30_000, 28_000]])
    q = sb.plan(short, 2, 8192, cp_size=4, cp="dynamic", cost="qwen2.5-7b",
                cp_cost={"bandwidth": 2.5e10})  # fmt: skip
    assert (q.degrees() < 4).any()
    with pytest.raises(ValueError, match=r"replica \d's 4 GPUs do not share the same sequences"):
        q.replica_micro_batches()
