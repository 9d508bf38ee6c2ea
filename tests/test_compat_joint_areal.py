"""seqbalance.compat.joint_areal: AReaL's joint mode (controller plan, carried slots, workers).

CI has no AReaL: the controller and worker sides run here on a small stand-in module tree
(``areal.utils.data`` and ``areal.infra.controller.train_controller`` with functions that
behave as AReaL's do where joint mode touches them: the split asks its module's
``allocate_balanced_mbs_synced`` for the groups, the controller's ``_partition_inputs``
calls its module's ``_dispatch_tensors``); the gloo tests run the worker side on 2 and 3
processes. The last test runs AReaL 1.0.4's own ``concat_padded_tensors`` and
``split_padded_tensor_dict_into_mb_list`` and its controller's ``_partition_inputs`` on
gloo, where a ``--no-deps`` install of AReaL is named by ``SEQBALANCE_AREAL_EXT``; it is
skipped otherwise.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.compat import joint_areal as ja
from seqbalance.compat._core import plan

try:
    import torch
except ImportError:  # the plan and the patching run without torch; the data path needs it
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

# ---- the plan (numpy only) ------------------------------------------------------------


def _check_dispatch(p, items, dp, cap, k):
    n_items = len(items)
    first = np.concatenate([[0], np.cumsum([len(r) for r in items])])
    lens = np.concatenate([np.asarray(r) for r in items])
    owner = np.repeat(np.arange(n_items), [len(r) for r in items])
    assert sorted(i for part in p.group_indices for i in part) == list(range(n_items))
    assert len(p.micro_batches) == k
    rank_of = {i: r for r, part in enumerate(p.group_indices) for i in part}
    for mi, mini in enumerate(p.micro_batches):
        assert len(mini) == dp
        assert len({len(rank) for rank in mini}) == 1  # the same count on every rank
        for r, rank in enumerate(mini):
            for s, q in enumerate(rank):
                assert q and int(lens[q].sum()) <= cap
                for row in q:
                    it = int(owner[row])
                    assert rank_of[it] == r  # a trajectory's rows stay on its rank
                    assert p.codes[it][row - first[it]] == ja.slot_code(mi, s)
    # Every row planned once.
    rows = sorted(i for mini in p.micro_batches for rank in mini for q in rank for i in q)
    assert rows == list(range(len(lens)))


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 300), min_size=1, max_size=3), min_size=8, max_size=40),
    st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]),
    st.sampled_from(["free", "equal"]),
)
def test_plan_dispatch_rules(items, dp, k, size):
    if len(items) // dp < k or (size == "equal" and len(items) % dp):
        with pytest.raises(ValueError, match="n_minibatches"):
            ja.plan_dispatch(items, dp, 900, k, size=size)
        return
    try:
        p = ja.plan_dispatch(items, dp, 900, k, size=size)
    except ValueError as exc:  # too few rows for dp x m micro-batches: plan() refuses
        assert "micro" in str(exc) or "groups" in str(exc) or "rows" in str(exc)
        return
    _check_dispatch(p, items, dp, 900, k)


def test_step_is_plans_step_of_the_same_mini_batches():
    rng = np.random.default_rng(3)
    lens = rng.integers(50, 4000, size=96)
    p = ja.plan_dispatch([[v] for v in lens], 4, 6000, 2, cost="qwen2.5-7b")
    total = 0.0
    for mini in p.micro_batches:
        rows = np.asarray(sorted(i for rank in mini for q in rank for i in q))
        total += plan(lens[rows], 4, 6000, cost="qwen2.5-7b").simulate(sync="fsdp").step_time
    assert p.step_fsdp == pytest.approx(total, rel=1e-9)


def test_heaviest_first_composition_never_longer_than_consecutive():
    rng = np.random.default_rng(5)
    lens = rng.lognormal(6, 1, size=128).astype(int) + 1
    items = [[v] for v in lens]
    best = ja.plan_dispatch(items, 8, 1 << 16, 4)
    comps = ja._mini_compositions(lens.astype(float), 8, 4)
    assert len(comps) == 2
    first = np.arange(len(lens) + 1)
    owner = np.arange(len(lens))
    for minis in comps:
        got = ja._plan_minis(lens, owner, first, minis, 8, 1 << 16, None, False, 1, 1, "free")
        assert best.step_fsdp <= got.step_fsdp + 1e-9


def test_plan_dispatch_counts_follow_min_and_multiple():
    items = [[v] for v in range(10, 74)]
    p = ja.plan_dispatch(items, 2, 10_000, 1, min_micro_batches=3, micro_batch_multiple=2)
    assert p.counts[0] >= 3 and p.counts[0] % 2 == 0


def test_controller_settings_follow_the_engine_config():
    c = types.SimpleNamespace(
        config=types.SimpleNamespace(mb_spec=Spec(n_mbs=3, max_tokens_per_mb=1000,
                                                  n_mbs_divisor=2), ppo_n_minibatches=4, path=""),
        parallel_strategy=types.SimpleNamespace(dp_size=2, pipeline_parallel_size=1))  # fmt: skip
    got = ja.controller_settings(c)
    assert (got.max_tokens, got.n_minibatches, got.min_micro_batches,
            got.micro_batch_multiple, got.cost) == (1000, 4, 3, 2, None)  # fmt: skip
    c.parallel_strategy.pipeline_parallel_size = 4  # Megatron: >= 2 pp, a multiple of pp
    got = ja.controller_settings(c)
    assert (got.min_micro_batches, got.micro_batch_multiple) == (8, 4)
    c.config.mb_spec = Spec(n_mbs=1, max_tokens_per_mb=None)
    assert "max_tokens_per_mb" in ja.controller_settings(c)
    c.config.mb_spec = Spec(max_tokens_per_mb=10, granularity=2)
    assert "granularity" in ja.controller_settings(c)


def test_plan_dispatch_bad_input():
    with pytest.raises(ValueError, match="dp_size"):
        ja.plan_dispatch([[1]] * 4, 0, 10)
    with pytest.raises(ValueError, match="n_minibatches=4"):
        ja.plan_dispatch([[1]] * 4, 2, 10, 4)
    with pytest.raises(ValueError, match="multiple of 3"):
        ja.plan_dispatch([[1]] * 4, 3, 10, 1, size="equal")
    with pytest.raises(ValueError, match="size='odd'"):
        ja.plan_dispatch([[1]] * 4, 2, 10, 1, size="odd")
    with pytest.raises(ValueError, match="one or more rows"):
        ja.plan_dispatch([[1], [], [2], [3]], 2, 10)
    with pytest.raises(ValueError, match="cost has shape"):
        ja.plan_dispatch([[1], [2], [3], [4]], 2, 10, cost=[1.0, 2.0])


def test_mode_env(monkeypatch):
    monkeypatch.delenv(ja.MODE_ENV, raising=False)
    assert not ja.joint_requested()
    monkeypatch.setenv(ja.MODE_ENV, "Joint")
    assert ja.joint_requested()
    monkeypatch.setenv(ja.MODE_ENV, "fast")
    with pytest.raises(ValueError, match="SEQBALANCE_AREAL_MODE='fast'"):
        ja.joint_requested()


# ---- stand-ins for AReaL's modules ----------------------------------------------------


class Spec:
    """AReaL's MicroBatchSpec, as the split reads it."""

    def __init__(self, n_mbs=1, max_tokens_per_mb=None, n_mbs_divisor=1, granularity=1,
                 packing_algorithm="ffd"):  # fmt: skip
        self.n_mbs = n_mbs
        self.max_tokens_per_mb = max_tokens_per_mb
        self.n_mbs_divisor = n_mbs_divisor
        self.granularity = granularity
        self.packing_algorithm = packing_algorithm

    @classmethod
    def new(cls, spec, **kw):
        return cls(**{**vars(spec), **kw})


def fake_split(data, mb_spec, group=None):
    """AReaL's split as joint mode relies on it: lengths from the mask, groups from the
    module's ``allocate_balanced_mbs_synced``, every per-token tensor cut by the groups."""
    mod = sys.modules["areal.utils.data"]
    if mb_spec.max_tokens_per_mb is None:
        mb_spec = Spec.new(mb_spec, max_tokens_per_mb=10**12)
    lens = data["attention_mask"].sum(1).long().numpy()
    groups = mod.allocate_balanced_mbs_synced(mb_spec, lens, group=group)
    bs, width = data["attention_mask"].shape
    mbs = []
    for g in groups:
        mbs.append({k: (v[g] if torch.is_tensor(v) and v.numel() == bs * width else v)
                    for k, v in data.items()})  # fmt: skip
    return types.SimpleNamespace(mbs=mbs, groups=groups, data=data)


def fake_concat(items):
    width = max(d["attention_mask"].shape[1] for d in items)
    out = {}
    for key in items[0]:
        parts = [torch.nn.functional.pad(d[key], (0, width - d[key].shape[1])) for d in items]
        out[key] = torch.cat(parts)
    return out


def fake_dispatch(item_list, dp_size, group_size=1):
    """AReaL's dispatch, roughly: equal counts, round robin."""
    parts = [list(range(r, len(item_list), dp_size)) for r in range(dp_size)]
    return [[item_list[i] for i in p] for p in parts], parts


class FakeController:
    """A TrainController: ``_partition_inputs`` calls its module's ``_dispatch_tensors``."""

    def __init__(self, dp, cap, n_mini, n_mbs=1):
        self.config = types.SimpleNamespace(
            mb_spec=Spec(n_mbs=n_mbs, max_tokens_per_mb=cap), ppo_n_minibatches=n_mini, path="")
        self.parallel_strategy = types.SimpleNamespace(dp_size=dp)

    def _partition_inputs(self, group_size, /, *args, **kwargs):
        mod = sys.modules["areal.infra.controller.train_controller"]
        splits, idx = mod._dispatch_tensors(args[0], self.parallel_strategy.dp_size,
                                            group_size=group_size)  # fmt: skip
        return [splits], {}, idx


def install_fakes(setitem=None):
    """The stand-in module tree in ``sys.modules`` (through ``setitem`` where given, for a
    test's monkeypatch)."""
    from seqbalance.compat import areal as dropin

    setitem = setitem or sys.modules.__setitem__
    for name in ("areal", "areal.utils", "areal.infra", "areal.infra.controller"):
        if name not in sys.modules:
            setitem(name, types.ModuleType(name))
    data = types.ModuleType("areal.utils.data")
    data.split_padded_tensor_dict_into_mb_list = fake_split
    data.concat_padded_tensors = fake_concat
    data.allocate_balanced_mbs = dropin.allocate_balanced_mbs
    data.allocate_balanced_mbs_synced = dropin.allocate_balanced_mbs_synced
    seqpack = types.ModuleType("areal.utils.seqpack")
    for n in ("ffd_allocate", "kk_allocate", "balanced_greedy_partition", "get_allocate_fn"):
        setattr(seqpack, n, getattr(dropin, n))
    ctl = types.ModuleType("areal.infra.controller.train_controller")
    ctl._dispatch_tensors = fake_dispatch
    ctl.TrainController = type("TrainController", (), {
        "_partition_inputs": FakeController._partition_inputs})  # fmt: skip
    for m in (data, seqpack, ctl):
        setitem(m.__name__, m)
    return data, ctl


@pytest.fixture
def fakes(monkeypatch):
    data, ctl = install_fakes(lambda k, v: monkeypatch.setitem(sys.modules, k, v))
    yield data, ctl
    from seqbalance.compat import areal as dropin

    dropin.unpatch()


def controller(ctl_module, dp, cap, n_mini, n_mbs=1):
    c = ctl_module.TrainController()
    c.config = FakeController(dp, cap, n_mini, n_mbs).config
    c.parallel_strategy = types.SimpleNamespace(dp_size=dp)
    return c


def make_items(lens, rows=1):
    out = []
    for i in range(0, len(lens), rows):
        group = lens[i : i + rows]
        width = max(group)
        mask = torch.zeros(len(group), width, dtype=torch.long)
        for j, v in enumerate(group):
            mask[j, :v] = 1
        ids = torch.arange(i, i + len(group))[:, None].repeat(1, width)
        out.append({"attention_mask": mask, "input_ids": ids})
    return out


def worker(data_mod, share, n_mini, cap):
    """One rank of AReaL's actor: concat, mini-batch split, micro-batch split."""
    batch = data_mod.concat_padded_tensors(share)
    minis = data_mod.split_padded_tensor_dict_into_mb_list(batch, Spec(n_mbs=n_mini))
    out = []
    for mini in minis.mbs:
        mbl = data_mod.split_padded_tensor_dict_into_mb_list(mini, Spec(max_tokens_per_mb=cap))
        out.append(mbl.mbs)
    return out


# ---- controller and workers on the stand-ins ------------------------------------------


@needs_torch
def test_controller_plans_and_workers_follow(fakes):
    from seqbalance.compat import areal as dropin

    data, ctl = fakes
    done = dropin.patch(joint=True)
    assert "areal.infra.controller.train_controller.TrainController._partition_inputs" in done
    assert "areal.utils.data.split_padded_tensor_dict_into_mb_list" in done
    rng = np.random.default_rng(1)
    lens = rng.integers(5, 400, size=48).tolist()
    items = make_items(lens)
    c = controller(ctl, 4, 900, 2)
    (splits,), _, idx = c._partition_inputs(1, items)
    p = ja.last_plan()
    assert idx == p.group_indices
    assert all(ja.SLOT_KEY not in d for d in items)  # the caller's dicts are not changed
    for r in range(4):
        got = worker(data, splits[r], 2, 900)
        for mi, mbs in enumerate(got):
            assert len(mbs) == p.counts[mi]  # the same count on every rank
            rows = [sorted(mb["input_ids"][:, 0].tolist()) for mb in mbs]
            assert rows == [sorted(q) for q in p.micro_batches[mi][r]]  # the plan, slot by slot
            for mb in mbs:
                assert ja.SLOT_KEY not in mb  # dropped before the model sees the batch
                assert int(mb["attention_mask"].sum()) <= 900


@needs_torch
def test_a_step_plans_its_trajectories_once(fakes, monkeypatch):
    from seqbalance.compat import areal as dropin

    _, ctl = fakes
    dropin.patch(joint=True)
    calls = []
    inner = ja.plan_dispatch
    monkeypatch.setattr(ja, "plan_dispatch", lambda *a, **k: (calls.append(1), inner(*a, **k))[1])
    items = make_items(list(range(20, 52)))
    c = controller(ctl, 2, 300, 2)
    first = c._partition_inputs(1, items)[2]
    again = c._partition_inputs(1, items)[2]  # log-probs, advantages, update: one plan
    assert first == again and len(calls) == 1
    controller(ctl, 2, 250, 2)._partition_inputs(1, items)  # another cap: planned anew
    assert len(calls) == 2


@needs_torch
def test_metrics_go_to_areals_stats_tracker(fakes, monkeypatch):
    from seqbalance.compat import areal as dropin

    _, ctl = fakes
    got = []
    tracker = types.ModuleType("areal.utils.stats_tracker")
    tracker.scalar = lambda **kw: got.append(kw)
    monkeypatch.setitem(sys.modules, tracker.__name__, tracker)
    dropin.patch(joint=True)
    items = make_items(list(range(20, 52)))
    controller(ctl, 2, 300, 2)._partition_inputs(1, items)
    p = ja.last_plan()
    assert got[-1]["seqbalance/joint"] == 1.0
    assert got[-1]["seqbalance/predicted_step"] == p.step_fsdp
    assert got[-1]["seqbalance/micro_batches"] == max(p.counts)
    controller(ctl, 2, None, 2)._partition_inputs(1, items)  # AReaL's own dispatch
    assert got[-1] == {"seqbalance/joint": 0.0}


@needs_torch
def test_multi_row_trajectories_stay_on_one_rank(fakes):
    from seqbalance.compat import areal as dropin

    data, ctl = fakes
    dropin.patch(joint=True)
    rng = np.random.default_rng(2)
    lens = rng.integers(5, 300, size=64).tolist()
    items = make_items(lens, rows=4)  # GRPO groups: 4 samples per trajectory
    (splits,), _, idx = controller(ctl, 2, 700, 2)._partition_inputs(1, items)
    for r, share in enumerate(splits):
        got = worker(data, share, 2, 700)
        rows = sorted(int(i) for mbs in got for mb in mbs for i in mb["input_ids"][:, 0])
        expect = sorted(4 * i + j for i in idx[r] for j in range(4))
        assert rows == expect
        assert all(int(mb["attention_mask"].sum()) <= 700 for mbs in got for mb in mbs)


@needs_torch
def test_controller_leaves_what_it_cannot_plan_to_areal(fakes):
    from seqbalance.compat import areal as dropin

    _, ctl = fakes
    dropin.patch(joint=True)
    items = make_items(list(range(10, 26)))
    c = controller(ctl, 2, None, 1)  # no max_tokens_per_mb
    (splits,), _, idx = c._partition_inputs(1, items)
    assert idx == [list(range(0, 16, 2)), list(range(1, 16, 2))]  # AReaL's own
    assert all(ja.SLOT_KEY not in d for s in splits for d in s)
    c = controller(ctl, 2, 100, 1)
    (splits,), _, idx = c._partition_inputs(2, items)  # pairs: AReaL's own
    assert idx[0] == list(range(0, 16, 2))
    # Outside a controller's _partition_inputs, the module function is AReaL's.
    _, idx = ctl._dispatch_tensors(items, 2)
    assert idx[0] == list(range(0, 16, 2))


class RemoteMask:
    """AReaL's RTensor as the controller holds it: a shard and a meta tensor."""

    def __init__(self, shape):
        self.shard = object()
        self.data = torch.empty(shape, device="meta")


@needs_torch
def test_remote_trajectories_are_planned_by_their_width(fakes):
    from seqbalance.compat import areal as dropin

    _, ctl = fakes
    dropin.patch(joint=True)
    widths = [30, 500, 40, 450, 60, 420, 80, 400]
    items = [{"attention_mask": RemoteMask((2, w)), "input_ids": RemoteMask((2, w))}
             for w in widths]  # fmt: skip
    (splits,), _, idx = controller(ctl, 2, 1000, 1)._partition_inputs(1, items)
    p = ja.last_plan()
    for r, share in enumerate(splits):
        for i, d in zip(idx[r], share):
            code = d[ja.SLOT_KEY]
            assert tuple(code.shape) == (2, widths[i]) and code.device.type == "cpu"
    for rank in p.micro_batches[0]:
        for q in rank:  # planned with the widths: the real rows (no longer) fit too
            assert sum(widths[row // 2] for row in q) <= 1000


@needs_torch
def test_stale_codes_are_dropped_where_areal_dispatches(fakes):
    from seqbalance.compat import areal as dropin

    _, ctl = fakes
    dropin.patch(joint=True)
    items = make_items(list(range(10, 26)))
    for d in items:  # as returned by the workers after an earlier joint dispatch
        d[ja.SLOT_KEY] = torch.ones_like(d["attention_mask"])
    (splits,), _, _ = controller(ctl, 2, None, 1)._partition_inputs(1, items)
    assert all(ja.SLOT_KEY not in d for s in splits for d in s)
    assert all(ja.SLOT_KEY in d for d in items)  # the caller's dicts are not changed


@needs_torch
def test_worker_falls_back_without_codes_or_when_they_break_the_rules(fakes):
    from seqbalance.compat import areal as dropin

    data, _ = fakes
    dropin.patch(joint=True)
    items = make_items([30, 40, 50, 60, 70, 80, 90, 100])
    batch = fake_concat(items)
    out = data.split_padded_tensor_dict_into_mb_list(batch, Spec(max_tokens_per_mb=200))
    assert sorted(i for g in out.groups for i in g) == list(range(8))  # the drop-in's
    # Codes whose micro-batch breaks the cap: the drop-in, codes dropped.
    batch[ja.SLOT_KEY] = torch.full_like(batch["attention_mask"], ja.slot_code(0, 0))
    out = data.split_padded_tensor_dict_into_mb_list(batch, Spec(max_tokens_per_mb=200))
    assert len(out.groups) >= 3 and all(ja.SLOT_KEY not in mb for mb in out.mbs)
    # Fewer mini-batches than asked: the drop-in, codes kept for the next split.
    out = data.split_padded_tensor_dict_into_mb_list(batch, Spec(n_mbs=2))
    assert len(out.groups) == 2 and all(ja.SLOT_KEY in mb for mb in out.mbs)
    # Following: a count below n_mbs or off the divisor is not followed.
    batch[ja.SLOT_KEY] = torch.as_tensor(
        [ja.slot_code(0, s) for s in (0, 0, 0, 0, 1, 1, 1, 1)])[:, None].expand(8, 100)
    assert ja._groups_to_follow(batch, Spec(max_tokens_per_mb=400))[0] == "micro"
    assert ja._groups_to_follow(batch, Spec(max_tokens_per_mb=400, n_mbs=3)) is None
    assert ja._groups_to_follow(batch, Spec(max_tokens_per_mb=400, n_mbs_divisor=4)) is None
    assert ja._groups_to_follow(batch, Spec(max_tokens_per_mb=400, granularity=2)) is None


def test_patch_waits_for_the_controller_module(monkeypatch, tmp_path):
    """The controller is patched when it is imported, after the switch."""
    from seqbalance.compat import areal as dropin

    install_fakes(lambda k, v: monkeypatch.setitem(sys.modules, k, v))
    monkeypatch.delitem(sys.modules, "areal.infra.controller.train_controller")
    pkg = tmp_path / "areal" / "infra" / "controller"
    pkg.mkdir(parents=True)
    (pkg / "train_controller.py").write_text(
        "def _dispatch_tensors(item_list, dp_size, group_size=1):\n    return 'areal'\n"
        "class TrainController:\n    def _partition_inputs(self, group_size, *a, **k):\n"
        "        return 'areal'\n"
    )
    for name in ("areal", "areal.infra", "areal.infra.controller"):
        sys.modules[name].__path__ = [str(tmp_path / name.replace(".", "/"))]
    try:
        done = dropin.patch(joint=True)
        assert "areal.infra.controller.train_controller._dispatch_tensors (on import)" in done
        import importlib

        mod = importlib.import_module("areal.infra.controller.train_controller")
        assert mod._dispatch_tensors is ja.dispatch_tensors
        assert mod.TrainController._partition_inputs is ja._joint_partition_inputs
    finally:
        dropin.unpatch()
        sys.modules.pop("areal.infra.controller.train_controller", None)
    assert mod._dispatch_tensors([], 1) == "areal"
    assert ja._HOOK not in sys.meta_path


def test_areal_patch_switches_joint_mode_by_env(fakes, monkeypatch):
    from seqbalance.compat import areal as dropin

    data, ctl = fakes
    original = data.split_padded_tensor_dict_into_mb_list
    monkeypatch.setenv(ja.MODE_ENV, "joint")
    dropin.patch()
    assert data.split_padded_tensor_dict_into_mb_list is ja.split_padded_tensor_dict_into_mb_list
    assert data.allocate_balanced_mbs_synced is ja.allocate_balanced_mbs_synced
    assert ctl._dispatch_tensors is ja.dispatch_tensors
    dropin.unpatch()
    assert data.split_padded_tensor_dict_into_mb_list is original
    assert ctl._dispatch_tensors is fake_dispatch
    monkeypatch.setenv(ja.MODE_ENV, "dropin")
    dropin.patch()
    assert data.split_padded_tensor_dict_into_mb_list is original
    assert data.allocate_balanced_mbs_synced is dropin.allocate_balanced_mbs_synced
    assert ctl._dispatch_tensors is fake_dispatch


def test_switch_patches_the_controller_in_joint_mode_only(fakes, monkeypatch):
    import _seqbalance_switch as switch
    from seqbalance.compat import _hook

    data, _ = fakes
    monkeypatch.delenv(ja.MODE_ENV, raising=False)
    assert switch.modules("areal") == switch.MODULES["areal"]
    assert all(p.module != "areal.infra.controller.train_controller"
               for p in _hook.patchers("areal"))  # fmt: skip
    monkeypatch.setenv(ja.MODE_ENV, "joint")
    assert "areal.infra.controller.train_controller" in switch.modules("areal")
    try:
        _hook.patch_module("areal", "areal.utils.data")
        done = _hook.patch_module("areal", "areal.infra.controller.train_controller")
        assert "areal.infra.controller.train_controller._dispatch_tensors" in done
        assert data.split_padded_tensor_dict_into_mb_list is (
            ja.split_padded_tensor_dict_into_mb_list)
        assert data.allocate_balanced_mbs is not None
    finally:
        from seqbalance.compat import areal as dropin

        dropin.unpatch()


AREAL_PROBE = """
import multiprocessing as mp


def child(q):
    import areal.utils.data as data
    from areal.infra.controller import train_controller as tc

    q.put((data.split_padded_tensor_dict_into_mb_list.__module__,
           data.allocate_balanced_mbs_synced.__module__, tc._dispatch_tensors.__module__,
           tc.TrainController._partition_inputs.__module__))


if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    print("spawned child:", *q.get())
    p.join()
    assert p.exitcode == 0
"""


@pytest.mark.parametrize("mode", ["joint", None])
def test_switch_reaches_a_spawned_child_in_joint_mode(tmp_path, mode):
    import subprocess

    import _seqbalance_switch as switch

    src = Path(__file__).resolve().parents[1] / "src"
    fw = tmp_path / "fw"
    files = {
        "areal/__init__.py": "", "areal/utils/__init__.py": "", "areal/infra/__init__.py": "",
        "areal/infra/controller/__init__.py": "",
        "areal/utils/seqpack.py": "def ffd_allocate(*a, **k):\n    return 'areal'\n",
        "areal/utils/data.py": "def allocate_balanced_mbs(*a, **k):\n    return 'areal'\n"
        "def allocate_balanced_mbs_synced(*a, **k):\n    return 'areal'\n"
        "def split_padded_tensor_dict_into_mb_list(*a, **k):\n    return 'areal'\n",
        "areal/infra/controller/train_controller.py":
            "def _dispatch_tensors(*a, **k):\n    return 'areal'\n"
            "class TrainController:\n    def _partition_inputs(self, g, *a, **k):\n"
            "        return 'areal'\n",
        "probe.py": AREAL_PROBE,
    }  # fmt: skip
    for name, text in files.items():
        (fw / name).parent.mkdir(parents=True, exist_ok=True)
        (fw / name).write_text(text)
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / "seqbalance_switch.pth").write_text((src / "seqbalance_switch.pth").read_text())
    (tmp_path / "boot").mkdir()
    (tmp_path / "boot" / "sitecustomize.py").write_text(
        f"import site\nsite.addsitedir({str(site_dir)!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in (switch.ENV, ja.MODE_ENV)}
    env[switch.ENV] = "areal"
    if mode:
        env[ja.MODE_ENV] = mode
    env["PYTHONPATH"] = os.pathsep.join(map(str, [tmp_path / "boot", fw, src]))
    r = subprocess.run([sys.executable, str(fw / "probe.py")], env=env, capture_output=True,
                       text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    if mode:
        assert ("spawned child: seqbalance.compat.joint_areal seqbalance.compat.joint_areal "
                "seqbalance.compat.joint_areal seqbalance.compat.joint_areal") in r.stdout
    else:  # the drop-in only: AReaL's own split and dispatch
        assert ("spawned child: areal.utils.data seqbalance.compat.areal "
                "areal.infra.controller.train_controller "
                "areal.infra.controller.train_controller") in r.stdout


# ---- the worker side across processes (gloo) ------------------------------------------


def _shares(world, cap=900, n_mini=2):
    """The controller's plan (the same on every rank) and every rank's share."""
    rng = np.random.default_rng(11)
    lens = rng.integers(5, 400, size=16 * world).tolist()
    ctl = sys.modules["areal.infra.controller.train_controller"]
    (splits,), _, _ = controller(ctl, world, cap, n_mini)._partition_inputs(1, make_items(lens))
    return ja.last_plan(), splits


def worker_follow(rank, world):
    import torch.distributed as dist

    from seqbalance.compat import areal as dropin

    data, _ = install_fakes()
    dropin.patch(joint=True)
    p, splits = _shares(world)
    local = []  # calls of the drop-in: a rank that followed the plan made none
    inner = ja._DROPIN_SYNCED
    ja._DROPIN_SYNCED = lambda *a, **k: (local.append(1), inner(*a, **k))[1]
    out = []
    got = worker(data, splits[rank], 2, 900)
    for mi, mbs in enumerate(got):
        rows = [sorted(mb["input_ids"][:, 0].tolist()) for mb in mbs]
        out.append((rows == [sorted(q) for q in p.micro_batches[mi][rank]], len(mbs),
                    max(int(mb["attention_mask"].sum()) for mb in mbs)))  # fmt: skip
    out.append(not local)
    # One rank cannot follow (its codes are gone): every rank runs the drop-in, with one
    # count for the group, and nobody waits.
    batch = data.concat_padded_tensors(splits[rank])
    if rank == 1:
        batch.pop(ja.SLOT_KEY)
    before = len(local)
    mbl = data.split_padded_tensor_dict_into_mb_list(batch, Spec(max_tokens_per_mb=900),
                                                     group=dist.group.WORLD)  # fmt: skip
    out.append((len(local) > before, len(mbl.mbs),
                max(int(mb["attention_mask"].sum()) for mb in mbl.mbs)))  # fmt: skip
    return out


@needs_torch
@pytest.mark.parametrize("world", [2, 3])
def test_worker_follows_carried_slots_gloo(world):
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_follow, world, timeout=120, collective_timeout=30)
    for k in range(2):  # followed the plan: the same count on every rank, cap held
        assert all(o[k][0] for o in out)
        assert len({o[k][1] for o in out}) == 1
        assert all(o[k][2] <= 900 for o in out)
    assert all(o[2] for o in out)  # nobody called the drop-in while following
    assert all(o[3][0] for o in out)  # every rank fell back together
    assert len({o[3][1] for o in out}) == 1 and all(o[3][2] <= 900 for o in out)


# ---- against AReaL 1.0.4's own functions (outside CI) ---------------------------------

AREAL_EXT = os.environ.get("SEQBALANCE_AREAL_EXT")


def worker_real_areal(rank, world, ext):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import integrations as bench  # the bench's loader: AReaL with stand-ins

    from seqbalance.compat import areal as dropin

    areal = bench.load_areal(ext)
    data, cli = areal["data"], areal["cli"]
    rng = np.random.default_rng(7)
    lens = rng.integers(5, 300, size=16 * world)
    items = make_items(lens.tolist(), rows=2)
    dropin.patch(joint=True)
    c = bench.areal_controller(areal, world, 600, 2, None)
    dp_args, _, _ = c._prepare_dispatch(items)
    p = ja.last_plan()
    share = dp_args[0][rank]
    batch = data.concat_padded_tensors(share)
    minis = data.split_padded_tensor_dict_into_mb_list(batch, cli.MicroBatchSpec(n_mbs=2))
    out = []
    for mi, mini in enumerate(minis.mbs):
        mbl = data.split_padded_tensor_dict_into_mb_list(
            mini, cli.MicroBatchSpec(max_tokens_per_mb=600))
        rows = [sorted(mb["input_ids"][:, 0].tolist()) for mb in mbl.mbs]
        out.append((rows == [sorted(q) for q in p.micro_batches[mi][rank]], len(mbl.mbs),
                    max(int(mb["attention_mask"].sum()) for mb in mbl.mbs),
                    all(ja.SLOT_KEY not in mb for mb in mbl.mbs)))  # fmt: skip
    return out


@needs_torch
@pytest.mark.skipif(not AREAL_EXT, reason="set SEQBALANCE_AREAL_EXT to a --no-deps "
                    "areal 1.0.4 install")  # fmt: skip
@pytest.mark.parametrize("world", [2, 3])
def test_real_areal_split_follows_the_plan_gloo(world):
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_real_areal, world, AREAL_EXT, timeout=200)
    for k in range(2):
        assert all(o[k][0] and o[k][3] for o in out)
        assert len({o[k][1] for o in out}) == 1
        assert all(o[k][2] <= 600 for o in out)
