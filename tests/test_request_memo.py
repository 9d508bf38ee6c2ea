"""Steps a request computes once, and the fast paths that replace numpy calls on few items:
each gives what the step it stands for gives (independent checks: the plain loops and
numpy paths they replace)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.partitioning.searches import exact_work_pool, nodes_left, spend_nodes
from seqbalance.planning import _packing
from seqbalance.planning._pieces import _flatten
from seqbalance.planning._work import remembered_search, work_meter


def test_a_remembered_search_spends_its_nodes_again_and_is_keyed_by_the_nodes_left():
    runs = []

    def make() -> str:
        runs.append(nodes_left())
        spend_nodes(30)
        return "result"

    with exact_work_pool(100), work_meter():
        assert remembered_search("k", make) == "result"
        assert nodes_left() == 70 and len(runs) == 1
        # 70 left, not 100: the search could have ended otherwise, so it runs again
        assert remembered_search("k", make) == "result"
        assert nodes_left() == 40 and len(runs) == 2
    with exact_work_pool(100), work_meter():
        remembered_search("k", make)  # a new request: a new memo
        assert len(runs) == 3
        spend_nodes(-30)  # back to 100 left: the same search, reused, spends 30 again
        assert remembered_search("k", make) == "result"
        assert nodes_left() == 70 and len(runs) == 3
    assert remembered_search("k", make) == "result" and len(runs) == 4  # outside: every time


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 50.0), min_size=1, max_size=20),
    st.lists(st.floats(0.0, 50.0), min_size=0, max_size=20),
    st.lists(st.integers(0, 40), min_size=40, max_size=40),
    st.integers(1, 400),
    st.booleans(),
)
def test_small_pair_scans_choose_what_the_numpy_scan_chooses(wa, wb, toks, cap, whole):
    n = len(wa) + len(wb)
    w = np.array(wa + wb, dtype=np.float64)
    if whole:  # ties between equal costs
        w = np.round(w)
    t = np.array(toks[:n], dtype=np.int64)
    bins = _packing._Bins(w, t, 2, max(cap, int(t.sum())), False)
    bins.items = [list(range(len(wa))), list(range(len(wa), n))]
    bins.cost = np.array([w[: len(wa)].sum(), w[len(wa) :].sum()])
    bins.tok = np.array([t[: len(wa)].sum(), t[len(wa) :].sum()], dtype=np.int64)
    a, b = (0, 1) if bins.cost[0] >= bins.cost[1] else (1, 0)
    plain, small = bins.copy(), bins.copy()
    moved = _packing._improve_pair(plain, a, b, None)  # the numpy scan
    lists = (w.tolist(), t.tolist())
    assert _packing._improve_pair(small, a, b, lists) == moved
    assert small.items == plain.items
    assert np.array_equal(small.cost, plain.cost) and np.array_equal(small.tok, plain.tok)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.integers(0, 5000), min_size=0, max_size=40),
    st.sampled_from([2, 4, 8, 32]),
    st.integers(1, 3),
    st.integers(0, 2**31 - 1),
)
def test_static_cp_pieces_from_the_cuts_are_the_members_layout_and_its_flat_arrays(
    lens, cp, dp, seed
):
    from seqbalance.planning.context_parallel import _replica_layout, _validate
    from seqbalance.planning.planner import _plan_replicas

    lens = np.array(lens, dtype=np.int64)
    req = _validate(lens, dp, 10**9, cp, "static", None, None, "fsdp", 1, 1, True, True, {},
                    {"pp_size": 1, "schedule": "1f1b", "virtual_stages": 1, "pp_comm": 0.0},
                    _plan_replicas)  # fmt: skip
    # any replica plan: the sequences dealt at random into dp ranks x 3 slots, in any order
    rng = np.random.default_rng(seed)
    grid: list[list[list[int]]] = [[[] for _ in range(3)] for _ in range(dp)]
    for i in rng.permutation(lens.size).tolist():
        grid[int(rng.integers(dp))][int(rng.integers(3))].append(i)

    class Base:
        micro_batches = grid

    pieces, flat = _replica_layout(req, Base)
    want: list[list[list[tuple[int, int, int]]]] = [[] for _ in range(dp * cp)]
    for r, rank in enumerate(grid):
        for mb in rank:
            members: list[list[tuple[int, int, int]]] = [[] for _ in range(cp)]
            for i in mb:
                for k, ranges in enumerate(req.members(i)):
                    members[k].extend(ranges)
            for k in range(cp):
                want[r * cp + k].append(members[k])
    assert pieces == want
    assert flat is not None
    assert all(np.array_equal(x, y) for x, y in zip(flat, _flatten(want)))
