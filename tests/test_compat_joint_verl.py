"""seqbalance.compat.joint_verl: verl's joint mode (driver plan, carried boundaries, workers).

The driver and worker sides run here on small stand-ins of verl's DataProto and TensorDict
(CI has no verl); the gloo tests run the worker side on 2 and 3 processes. The last test
runs verl 0.9.1's own DataProto, dispatch chunking, padding removal and mini-batch iterator
around joint mode, where a ``--no-deps`` install of verl is named by ``SEQBALANCE_VERL_EXT``
(and tensordict's by ``SEQBALANCE_VERL_TD``); it is skipped otherwise.
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.compat import joint_verl as jv
from seqbalance.compat._core import plan

# ---- the plan (numpy only) ------------------------------------------------------------


def _check_plan(jp, lens, dp, cap, mb_rows):
    n = len(lens)
    assert sorted(jp.order.tolist()) == list(range(n))
    assert len(jp.micro_batches) == n // mb_rows
    for mini in jp.micro_batches:
        assert len(mini) == dp
        assert len({len(rank) for rank in mini}) == 1  # the same count on every rank
        assert {sum(len(q) for q in rank) for rank in mini} == {mb_rows // dp}  # equal shares
        for rank in mini:
            for q in rank:
                assert q and sum(lens[i] for i in q) <= cap
    # Rank r's contiguous chunk holds its rows, mini-batch after mini-batch, slot by slot.
    chunk = n // dp
    for r in range(dp):
        expect = [i for mini in jp.micro_batches for q in mini[r] for i in q]
        assert jp.order[r * chunk : (r + 1) * chunk].tolist() == expect
        assert jp.partitions[r] == expect
    # Every share is in the table under the key of its lengths, with its slot sizes.
    for mini in jp.micro_batches:
        for rank in mini:
            rows = [i for q in rank for i in q]
            assert jp.slots[jv.slots_key(np.asarray(lens)[rows])] == [len(q) for q in rank]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.integers(1, 300), min_size=12, max_size=48),
    st.sampled_from([1, 2, 3]),
    st.sampled_from([1, 2]),
    st.booleans(),
)
def test_plan_mini_batches_rules(raw, dp, n_mini, keep):
    n = len(raw) // (dp * n_mini) * dp * n_mini
    lens = np.asarray(raw[:n])
    mb_rows = n // n_mini
    jp = jv.plan_mini_batches(lens, dp, 300, mb_rows, keep_mini_batches=keep)
    _check_plan(jp, lens, dp, 300, mb_rows)
    if keep or n_mini == 1:  # consecutive mini-batches
        for k, mini in enumerate(jp.micro_batches):
            rows = sorted(i for rank in mini for q in rank for i in q)
            assert rows == list(range(k * mb_rows, (k + 1) * mb_rows))


def test_step_is_plans_step_of_the_same_mini_batches():
    """The plumbing loses nothing: the predicted step is the sum of plan()'s, exactly."""
    rng = np.random.default_rng(3)
    lens = rng.integers(10, 2000, size=96)
    jp = jv.plan_mini_batches(lens, 4, 4096, 24, cost="qwen2.5-7b")
    total = 0.0
    for mini in jp.micro_batches:
        rows = np.asarray(sorted(i for rank in mini for q in rank for i in q))
        p = plan(lens[rows], 4, 4096, cost="qwen2.5-7b", size="equal", order="light_ends")
        total += p.simulate().step_time
    assert jp.step_fsdp == pytest.approx(total, rel=1e-12)


def test_free_composition_never_longer_than_consecutive():
    rng = np.random.default_rng(5)
    for _ in range(5):
        lens = rng.lognormal(6, 1.2, size=128).astype(int) + 1
        lens = np.minimum(lens, 4096)
        free = jv.plan_mini_batches(lens, 8, 4096, 32, cost="qwen2.5-7b")
        kept = jv.plan_mini_batches(lens, 8, 4096, 32, cost="qwen2.5-7b", keep_mini_batches=True)
        assert free.step_fsdp <= kept.step_fsdp


def test_groups_stay_on_one_rank():
    lens = np.arange(1, 33) * 10
    uids = [f"u{i // 4}" for i in range(32)]
    jp = jv.plan_mini_batches(lens, 2, 400, 16, groups=uids)
    for mini in jp.micro_batches:
        for rank in mini:
            rows = [i for q in rank for i in q]
            mine = {uids[i] for i in rows}
            assert sum(uids.count(u) for u in mine) == len(rows)


def test_groups_of_unequal_sizes_are_refused():
    lens = np.arange(1, 13) * 10
    uids = ["a", "a", "a", "b", "c", "c", "d", "d", "e", "e", "f", "f"]
    with pytest.raises(ValueError, match="groups must be of one size"):
        jv.plan_mini_batches(lens, 2, 400, 12, groups=uids)


def test_worker_keeps_forced_groups():
    """Boundaries that would split a forced group (``force_group_size``) are not followed."""
    torch = pytest.importorskip("torch")
    lens = [30, 40, 50, 60, 70, 80]
    td = FakeTD({"attention_mask": (torch.arange(100)[None, :] < torch.tensor(lens)[:, None])
                 .long()})  # fmt: skip
    table = {jv.slots_key(lens): [3, 3]}
    assert jv._followed(td, table, 250, None, None, 1) == [[0, 1, 2], [3, 4, 5]]
    assert jv._followed(td, table, 250, None, None, 3) == [[0, 1, 2], [3, 4, 5]]
    assert jv._followed(td, table, 250, None, None, 2) is None  # a pair spans slots 0 and 1
    _, idx = jv.rearrange_micro_batches(FakeTD(td.data, {jv.SLOTS_KEY: table}), 250,
                                        force_group_size=2)  # fmt: skip
    assert all(len(q) % 2 == 0 and all(i % 2 == 0 for i in q[::2]) for q in idx)
    assert jv._followed(td, table, 250, 2, None, 1) == [[0, 1, 2], [3, 4, 5]]
    assert jv._followed(td, table, 250, None, 3, 1) is None  # min_num_micro_batch=3


def test_plan_mini_batches_bad_input():
    with pytest.raises(ValueError, match="mini_batch_rows=5"):
        jv.plan_mini_batches([1] * 12, 2, 10, 5)
    with pytest.raises(ValueError, match="multiple of dp_size=4"):
        jv.plan_mini_batches([1] * 12, 4, 10, 6)
    with pytest.raises(ValueError, match="dp_size"):
        jv.plan_mini_batches([1] * 12, 0, 10, 6)
    with pytest.raises(ValueError, match="cost has shape"):
        jv.plan_mini_batches([1] * 12, 2, 10, 6, cost=[1.0, 2.0])


def test_slots_key_is_order_sensitive_and_stable():
    assert jv.slots_key([1, 2, 3]) == jv.slots_key(np.array([1, 2, 3], dtype=np.int32))
    assert jv.slots_key([1, 2, 3]) != jv.slots_key([3, 2, 1])
    assert jv.slots_key([]) == jv.slots_key(np.zeros(0))


def test_mode_env(monkeypatch):
    monkeypatch.delenv(jv.MODE_ENV, raising=False)
    assert not jv.joint_requested()
    monkeypatch.setenv(jv.MODE_ENV, "Joint")
    assert jv.joint_requested()
    monkeypatch.setenv(jv.MODE_ENV, "fast")
    with pytest.raises(ValueError, match="SEQBALANCE_VERL_MODE='fast'"):
        jv.joint_requested()


# ---- stand-ins for verl's containers ---------------------------------------------------


class FakeTD:
    """The parts of a TensorDict the functions touch; ``extra`` holds non-tensor entries."""

    def __init__(self, data, extra=None):
        self.data = data
        self.extra = dict(extra or {})

    def keys(self):
        return [*self.data.keys(), *self.extra.keys()]

    def __len__(self):
        return next(iter(self.data.values())).shape[0]

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.data[key] if key in self.data else self.extra[key]
        return FakeTD({k: v[key] for k, v in self.data.items()}, self.extra)


class FakeDataProto:
    """verl's DataProto, as far as the driver and prepare_dynamic_batch use it."""

    def __init__(self, tensors, non_tensors=None, meta_info=None):
        self.batch = FakeTD(tensors)
        self.non_tensor_batch = dict(non_tensors or {})
        self.meta_info = dict(meta_info or {})

    @classmethod
    def from_dict(cls, tensors, non_tensors=None, meta_info=None):
        return cls(dict(tensors), non_tensors, meta_info)

    def __len__(self):
        return len(self.batch)

    def reorder(self, idx):
        self.batch = self.batch[idx]
        self.non_tensor_batch = {k: v[idx.numpy()] for k, v in self.non_tensor_batch.items()}

    def chunk(self, k):
        """verl's dispatch: ``k`` equal contiguous chunks, each with the meta info."""
        import copy

        n = len(self) // k
        return [
            FakeDataProto(
                {key: v[r * n : (r + 1) * n] for key, v in self.batch.data.items()},
                {key: v[r * n : (r + 1) * n] for key, v in self.non_tensor_batch.items()},
                copy.deepcopy(self.meta_info),
            )
            for r in range(k)
        ]


def _node(**kw):
    return types.SimpleNamespace(**kw)


def fake_trainer(dp, cap, mini_rows, *, dynamic=True, sp=1):
    actor = _node(use_dynamic_bsz=dynamic, ppo_max_token_len_per_gpu=cap // sp,
                  ppo_mini_batch_size=mini_rows, ulysses_sequence_parallel_size=sp)  # fmt: skip
    ref = _node(actor=actor, rollout=_node(n=1), model=_node(path=""))
    t = _node(
        config=_node(actor_rollout_ref=ref),
        actor_rollout_wg=_node(_dispatch_info={"actor": list(range(dp))}),
        _seqbalance_cost="qwen2.5-7b",
    )
    t._get_dp_size = lambda wg, role: max(wg._dispatch_info[role]) + 1
    return t


def fake_batch(lens, width=None):
    import torch

    width = width or max(lens)
    mask = torch.zeros(len(lens), width, dtype=torch.long)
    for i, n in enumerate(lens):
        mask[i, :n] = 1
    return FakeDataProto(
        {"attention_mask": mask, "row": torch.arange(len(lens))},
        {"uid": np.asarray([f"u{i // 2}" for i in range(len(lens))], dtype=object)},
    )


LENS = [50, 900, 30, 700, 400, 60, 20, 800, 100, 650, 300, 40, 1000, 10, 250, 500] * 2


def test_driver_reorders_and_carries_slots():
    pytest.importorskip("torch")
    batch = fake_batch(LENS)
    metrics = {}
    jv.balance_batch(fake_trainer(2, 1024, 16), batch, metrics)
    rows = batch.batch["row"].tolist()
    assert sorted(rows) == list(range(len(LENS)))
    table = batch.meta_info[jv.SLOTS_KEY]
    assert metrics["seqbalance/joint"] == 1 and metrics["seqbalance/over_cap"] == 0
    for key in ("global_seqlen/balanced_max", "seqbalance/predicted_step",
                "seqbalance/gap_to_bound", "seqbalance/cap_violations_avoided"):  # fmt: skip
        assert key in metrics
    assert metrics["seqbalance/gap_to_bound"] >= 0
    # Each rank's local mini-batch finds its boundaries, and they hold the cap.
    for chunk in batch.chunk(2):
        for s in range(0, 16, 8):
            mini = chunk.batch[slice(s, s + 8)]
            mini.extra[jv.SLOTS_KEY] = table
            idx = jv._followed(mini, table, 1024, None, None, 1)
            assert idx is not None
            lens = mini["attention_mask"].sum(1)
            assert all(int(lens[q].sum()) <= 1024 for q in idx)


def test_driver_leaves_what_it_cannot_plan_to_verl(monkeypatch):
    pytest.importorskip("torch")
    calls = []
    monkeypatch.setitem(jv._ORIGINAL, "_balance_batch",
                        lambda self, batch, metrics, **kw: calls.append(kw))  # fmt: skip
    metrics = {}
    jv.balance_batch(fake_trainer(2, 1024, 16, dynamic=False), fake_batch(LENS), metrics)
    assert calls == [{"logging_prefix": "global_seqlen", "keep_minibatch": False}]
    assert metrics["seqbalance/joint"] == 0
    jv.balance_batch(fake_trainer(2, 1024, 12), fake_batch(LENS), metrics)  # 32 % 12
    assert len(calls) == 2
    monkeypatch.delitem(jv._ORIGINAL, "_balance_batch")
    with pytest.raises(ValueError, match="use_dynamic_bsz is off"):
        jv.balance_batch(fake_trainer(2, 1024, 16, dynamic=False), fake_batch(LENS), {})


def test_driver_cap_is_tokens_per_gpu_times_ulysses():
    pytest.importorskip("torch")
    batch = fake_batch(LENS)
    jv.balance_batch(fake_trainer(2, 2048, 32, sp=2), batch, {})  # 1024 per GPU x 2
    s = jv.driver_settings(fake_trainer(2, 2048, 32, sp=2))
    assert s.max_tokens == 2048 and s.dp_size == 2 and s.mini_batch_rows == 32


def test_worker_follows_and_falls_back():
    torch = pytest.importorskip("torch")
    batch = fake_batch(LENS)
    jv.balance_batch(fake_trainer(2, 2048, 32), batch, {})
    table = batch.meta_info[jv.SLOTS_KEY]
    chunk = batch.chunk(2)[0]
    td = FakeTD(chunk.batch.data, {jv.SLOTS_KEY: table})
    _, idx = jv.rearrange_micro_batches(td, 2048)
    assert idx == jv._followed(td, table, 2048, None, None, 1)
    assert [i for q in idx for i in q] == list(range(16))
    lens = td["attention_mask"].sum(1)
    tight = max(int(lens[q].sum()) for q in idx) - 1  # the fullest slot breaks it
    assert tight >= max(LENS)
    # A smaller cap than planned, rows in another order, a count the multiple refuses, or
    # no table: planned locally (the drop-in), cap held.
    for kwargs, t in (({"max_token_len": 1000}, td),
                      ({"max_token_len": 2048}, td[torch.arange(15, -1, -1)]),
                      ({"max_token_len": 2048, "num_batches_divided_by": 7}, td),
                      ({"max_token_len": 2048}, FakeTD(chunk.batch.data))):  # fmt: skip
        assert jv._followed(t, _table(t), kwargs["max_token_len"],
                            kwargs.get("num_batches_divided_by"), None, 1) is None  # fmt: skip
        _, idx = jv.rearrange_micro_batches(t, **kwargs)
        lens = t["attention_mask"].sum(1)
        assert sorted(i for q in idx for i in q) == list(range(16))
        assert all(int(lens[q].sum()) <= kwargs["max_token_len"] for q in idx)


def _table(td):
    return jv._table_of(td)


def test_prepare_dynamic_batch_follows_meta_info():
    pytest.importorskip("torch")
    batch = fake_batch(LENS)
    jv.balance_batch(fake_trainer(2, 1024, 32), batch, {})
    chunk = batch.chunk(2)[1]
    out, idx = jv.prepare_dynamic_batch(chunk, 1024)
    assert idx == jv._followed(chunk.batch, batch.meta_info[jv.SLOTS_KEY], 1024, None, None, 1)
    assert all(jv.SLOTS_KEY not in mb.meta_info for mb in out)
    for mb, rows in zip(out, idx):
        assert mb.batch["row"].tolist() == chunk.batch["row"][rows].tolist()
        assert list(mb.non_tensor_batch["uid"]) == list(chunk.non_tensor_batch["uid"][rows])


def test_patch_replaces_worker_functions(monkeypatch):
    from _fakes import fake_module

    def old(*a, **k):
        return "verl"

    mod = fake_module(monkeypatch, "verl.utils.seqlen_balancing",
                      rearrange_micro_batches=old, prepare_dynamic_batch=old)  # fmt: skip
    user = fake_module(monkeypatch, "verl.workers.engine.utils", rearrange_micro_batches=old)
    trainer_mod = fake_module(monkeypatch, "verl.trainer.ppo.ray_trainer")
    cls = type("RayPPOTrainer", (), {"_balance_batch": old})
    trainer_mod.RayPPOTrainer = cls
    try:
        done = jv.patch()
        assert "verl.trainer.ppo.ray_trainer.RayPPOTrainer._balance_batch" in done
        assert mod.rearrange_micro_batches is jv.rearrange_micro_batches
        assert user.rearrange_micro_batches is jv.rearrange_micro_batches
        assert cls._balance_batch is jv._joint_method
    finally:
        jv.unpatch()
    assert mod.rearrange_micro_batches is old and user.rearrange_micro_batches is old
    assert cls._balance_batch is old


def test_patch_waits_for_the_trainer_module(monkeypatch, tmp_path):
    """The trainer is patched when the driver imports it, after the switch."""
    import sys

    from _fakes import fake_module

    def old(*a, **k):
        return "verl"

    fake_module(monkeypatch, "verl.utils.seqlen_balancing", rearrange_micro_batches=old)
    pkg = tmp_path / "verl" / "trainer" / "ppo"
    pkg.mkdir(parents=True)
    (pkg / "ray_trainer.py").write_text(
        "class RayPPOTrainer:\n    def _balance_batch(self, *a, **k):\n        return 'verl'\n"
    )
    for name in ("verl.trainer", "verl.trainer.ppo"):
        mod = fake_module(monkeypatch, name)
        mod.__path__ = [str(tmp_path / name.replace(".", "/"))]
    monkeypatch.delitem(sys.modules, "verl.trainer.ppo.ray_trainer", raising=False)
    try:
        done = jv.patch()
        assert "verl.trainer.ppo.ray_trainer.RayPPOTrainer._balance_batch (on import)" in done
        import importlib

        trainer = importlib.import_module("verl.trainer.ppo.ray_trainer")
        assert trainer.RayPPOTrainer._balance_batch is jv._joint_method
    finally:
        jv.unpatch()
        sys.modules.pop("verl.trainer.ppo.ray_trainer", None)
    assert trainer.RayPPOTrainer._balance_batch(None) == "verl"
    assert jv._HOOK not in sys.meta_path


def test_verl_patch_switches_joint_mode_by_env(monkeypatch):
    from _fakes import fake_module

    from seqbalance.compat import verl as dropin

    def old(*a, **k):
        return "verl"

    mod = fake_module(monkeypatch, "verl.utils.seqlen_balancing",
                      rearrange_micro_batches=old, prepare_dynamic_batch=old)  # fmt: skip
    trainer_mod = fake_module(monkeypatch, "verl.trainer.ppo.ray_trainer")
    trainer_mod.RayPPOTrainer = type("RayPPOTrainer", (), {"_balance_batch": old})
    monkeypatch.setenv(jv.MODE_ENV, "joint")
    try:
        dropin.patch()
        assert mod.rearrange_micro_batches is jv.rearrange_micro_batches
        assert trainer_mod.RayPPOTrainer._balance_batch is jv._joint_method
    finally:
        dropin.unpatch()
    assert mod.rearrange_micro_batches is old
    monkeypatch.setenv(jv.MODE_ENV, "dropin")
    try:
        dropin.patch()
        assert mod.rearrange_micro_batches is dropin.rearrange_micro_batches
        assert trainer_mod.RayPPOTrainer._balance_batch is old
    finally:
        dropin.unpatch()


def test_joint_patch_leaves_the_drop_ins_own_functions(monkeypatch):
    """Joint mode replaces the drop-in's functions inside verl, not in
    seqbalance.compat.verl, whose rearrange_micro_batches is joint mode's local fallback
    (replacing it there made the fallback call itself)."""
    torch = pytest.importorskip("torch")
    from _fakes import fake_module

    from seqbalance.compat import verl as dropin

    def old(*a, **k):
        return "verl"

    mod = fake_module(monkeypatch, "verl.utils.seqlen_balancing",
                      rearrange_micro_batches=old, prepare_dynamic_batch=old)  # fmt: skip
    own = dropin.rearrange_micro_batches, dropin.prepare_dynamic_batch
    try:
        done = dropin.patch(joint=True)
        assert not [d for d in done if d.startswith("seqbalance.")]
        assert (dropin.rearrange_micro_batches, dropin.prepare_dynamic_batch) == own
        assert mod.rearrange_micro_batches is jv.rearrange_micro_batches
        td = FakeTD({"attention_mask": torch.ones(4, 5, dtype=torch.long)})
        _, idx = mod.rearrange_micro_batches(td, 10)  # no carried slots: the fallback
        assert sorted(i for q in idx for i in q) == [0, 1, 2, 3]
    finally:
        dropin.unpatch()
    assert mod.rearrange_micro_batches is old


def test_joint_workers_agree_over_the_world_where_verl_does(monkeypatch):
    """verl before 0.8.0 agrees the count over the default group when its callers pass
    no DP group; joint mode's functions get the drop-in's wrapper for that there."""
    from seqbalance.compat import _verl_dropin as dropin

    monkeypatch.setattr(dropin, "_installed_verl_version", lambda: "0.7.0")
    got = jv._worker_replacements()
    assert got["rearrange_micro_batches"] is not jv.rearrange_micro_batches
    assert got["rearrange_micro_batches"].__wrapped__ is jv.rearrange_micro_batches
    assert got["prepare_dynamic_batch"].__wrapped__ is jv.prepare_dynamic_batch
    monkeypatch.setattr(dropin, "_installed_verl_version", lambda: "0.9.1")
    assert jv._worker_replacements()["rearrange_micro_batches"] is jv.rearrange_micro_batches


def test_trainer_patcher_refuses_a_trainer_without_the_method(monkeypatch):
    from _fakes import fake_module

    fake_module(monkeypatch, "verl.trainer.ppo.ray_trainer",
                RayPPOTrainer=type("RayPPOTrainer", (), {}))  # fmt: skip
    with pytest.raises(ValueError, match=r"has no RayPPOTrainer\._balance_batch"):
        jv._trainer_patcher.patch()
    assert not jv._trainer_patcher.active


# ---- the worker side across processes (gloo) ------------------------------------------


def _rank_inputs(rank, world):
    """The driver's plan (the same on every rank) and this rank's chunk, as dispatched."""
    rng = np.random.default_rng(11)
    lens = rng.integers(5, 600, size=24 * world).tolist()
    batch = fake_batch(lens, width=600)
    jv.balance_batch(fake_trainer(world, 1200, 12 * world), batch, {})
    return batch, batch.chunk(world)[rank]


def worker_follow(rank, world):
    import torch.distributed as dist

    batch, chunk = _rank_inputs(rank, world)
    table = batch.meta_info[jv.SLOTS_KEY]
    local = []  # calls of the local planner: a rank that followed the plan made none
    drop_in = jv._dropin.rearrange_micro_batches
    jv._dropin.rearrange_micro_batches = lambda *a, **k: (local.append(1), drop_in(*a, **k))[1]
    out = []
    for s in (0, 12):  # the rank's two local mini-batches
        td = FakeTD(chunk.batch[slice(s, s + 12)].data, {jv.SLOTS_KEY: table})
        planned = jv._followed(td, table, 1200, None, None, 1)
        before = len(local)
        _, idx = jv.rearrange_micro_batches(td, 1200, dp_group=dist.group.WORLD)
        lens = td["attention_mask"].sum(1)
        followed = idx == planned and len(local) == before
        out.append((followed, len(idx), max(int(lens[q].sum()) for q in idx)))
    # One rank cannot follow (its rows arrive reversed): every rank plans locally, with one
    # count for the group, and nobody waits.
    td = FakeTD(chunk.batch[slice(0, 12)].data, {jv.SLOTS_KEY: table})
    if rank == 1:
        import torch

        td = td[torch.arange(11, -1, -1)]
    before = len(local)
    _, idx = jv.rearrange_micro_batches(td, 1200, dp_group=dist.group.WORLD)
    lens = td["attention_mask"].sum(1)
    out.append((len(local) == before, len(idx), max(int(lens[q].sum()) for q in idx)))
    # prepare_dynamic_batch on the whole chunk (no share matches): local, agreed count.
    _, idx = jv.prepare_dynamic_batch(chunk, 1200, dp_group=dist.group.WORLD)
    out.append((None, len(idx), sorted(i for q in idx for i in q) == list(range(24))))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_worker_follows_carried_slots_gloo(world):
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_follow, world, timeout=120, collective_timeout=30)
    for k in range(2):  # followed the plan: the same count on every rank, cap held
        assert all(o[k][0] for o in out)
        assert len({o[k][1] for o in out}) == 1
        assert all(o[k][2] <= 1200 for o in out)
    assert not any(o[2][0] for o in out)  # every rank planned locally: nobody followed alone
    assert len({o[2][1] for o in out}) == 1 and all(o[2][2] <= 1200 for o in out)
    assert len({o[3][1] for o in out}) == 1 and all(o[3][2] for o in out)


# ---- against verl 0.9.1's own containers and dispatch (outside CI) --------------------

VERL_EXT = os.environ.get("SEQBALANCE_VERL_EXT")
VERL_TD = os.environ.get("SEQBALANCE_VERL_TD")


def _unpad_input(hidden, mask):
    """The unpadding verl's padding removal calls (flash-attn's interface): the kept
    tokens, their flat indices, cumulative lengths, the longest, the lengths."""
    import torch

    seqlens = mask.sum(-1, dtype=torch.int32)
    indices = torch.nonzero(mask.flatten()).flatten()
    cu = torch.cat([torch.zeros(1, dtype=torch.int32), seqlens.cumsum(0, dtype=torch.int32)])
    return hidden.flatten(0, 1)[indices], indices, cu, int(seqlens.max()), seqlens


def worker_real_verl(rank, world, ext, td):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import integrations as bench  # the bench's loader: verl with stand-ins for ray & co.
    import torch
    import torch.distributed as dist

    verl = bench.load_verl(ext, td, None)
    import importlib

    padding = importlib.import_module("verl.workers.utils.padding")
    padding.unpad_input = _unpad_input  # flash-attn's, which the stand-ins leave out
    rng = np.random.default_rng(7)
    lens = rng.integers(5, 300, size=16 * world)
    width = 320
    mask = torch.zeros(len(lens), width, dtype=torch.long)
    for i, n in enumerate(lens):
        mask[i, width - n :] = 1  # left padded, as verl's rollouts
    batch = verl["protocol"].DataProto.from_dict({
        "input_ids": torch.arange(len(lens))[:, None].repeat(1, width), "attention_mask": mask,
        "response_mask": mask[:, -8:], "position_ids": mask.cumsum(-1) - 1,
    })  # fmt: skip
    trainer = bench.make_trainer({"_get_dp_size": lambda self, wg, role: world}, world, 600,
                                 8 * world)  # fmt: skip
    jv.balance_batch(trainer, batch, {})
    tdict = padding.left_right_2_no_padding(batch.to_tensordict())  # verl's padding removal
    chunk = verl["tu"].chunk_tensordict(tdict, world)[rank]
    out = []
    for mini in verl["tu"].make_iterator(chunk, mini_batch_size=8, epochs=1, seed=0,
                                         dataloader_kwargs={"shuffle": False}):  # fmt: skip
        table = jv._table_of(mini)
        planned = jv._followed(mini, table, 600, None, None, 1)
        _, idx = jv.rearrange_micro_batches(mini, 600, dp_group=dist.group.WORLD)
        seq = mini["input_ids"].offsets().diff()
        out.append((table is not None, idx == planned, len(idx),
                    max(int(seq[q].sum()) for q in idx)))  # fmt: skip
    return out


@pytest.mark.skipif(not (VERL_EXT and VERL_TD), reason="set SEQBALANCE_VERL_EXT/_TD to a "
                    "--no-deps verl 0.9.1 install and tensordict's")  # fmt: skip
@pytest.mark.parametrize("world", [2, 3])
def test_real_verl_dispatch_keeps_the_plan_gloo(world):
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(worker_real_verl, world, VERL_EXT, VERL_TD, timeout=200)
    for k in range(2):
        assert all(o[k][0] and o[k][1] for o in out)  # table survived, boundaries followed
        assert len({o[k][2] for o in out}) == 1
        assert all(o[k][3] <= 600 for o in out)
