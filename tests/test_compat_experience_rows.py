"""seqbalance.compat.openrlhf: regrouping experiences by row gathers gives exactly what
splitting into samples and merging them back gives.

The split and merge below are a stand-in written from OpenRLHF's documented contract
(``split_experience_batch`` / ``make_experience_batch`` at 3c3be62): one object per sample;
per-token ("step") tensors right-padded with zeros to the group's widest row and stacked;
per-sample tensors stacked; length-B lists split per sample, other lists copied whole into
every sample; dicts split per key, merged into one tensor when all entries are Python
numbers. bench/compat.py checks the same against OpenRLHF's own functions.
"""

from __future__ import annotations

import dataclasses
import itertools
import sys
import types
from types import SimpleNamespace as NS
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.compat import _experience_rows, openrlhf

torch = pytest.importorskip("torch")

MOD = "fake_openrlhf_rows"


@dataclasses.dataclass
class Experience:
    sequences: Any = dataclasses.field(default=None, metadata={"role": "step"})
    action_mask: Any = dataclasses.field(default=None, metadata={"role": "step"})
    action_log_probs: Any = dataclasses.field(default=None, metadata={"role": "step"})
    rewards: Any = dataclasses.field(default=None, metadata={"role": "episode"})
    total_length: Any = dataclasses.field(default=None, metadata={"role": "episode"})
    extra: Any = None  # untagged: merged only when each sample's entry is 0-d
    index: Any = None
    prompts: list = dataclasses.field(default_factory=list)
    labels: list = dataclasses.field(default_factory=list)
    info: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def is_step_tensor_field(cls, name: str) -> bool:
        return cls.__dataclass_fields__[name].metadata.get("role") == "step"

    @classmethod
    def is_episode_tensor_field(cls, name: str) -> bool:
        return cls.__dataclass_fields__[name].metadata.get("role") == "episode"


def split_experience_batch(batch: Experience) -> list[Experience]:
    rows = len(batch.sequences)
    batch.index = None
    samples = []
    for i in range(rows):
        kw: dict[str, Any] = {}
        for f in dataclasses.fields(Experience):
            v = getattr(batch, f.name)
            if v is None:
                kw[f.name] = None
            elif torch.is_tensor(v):
                if len(v) != rows:
                    raise ValueError(f"{f.name} has {len(v)} rows, not {rows}")
                kw[f.name] = v[i]
            elif isinstance(v, dict):
                kw[f.name] = {key: x[i] for key, x in v.items()}
            elif isinstance(v, list):
                kw[f.name] = [v[i]] if len(v) == rows else v
        samples.append(Experience(**kw))
    return samples


def make_experience_batch(items: list[Experience]) -> Experience:
    kw: dict[str, Any] = {}
    for f in dataclasses.fields(Experience):
        first = getattr(items[0], f.name)
        got = [getattr(it, f.name) for it in items]
        if first is None:
            kw[f.name] = None
        elif torch.is_tensor(first):
            if Experience.is_step_tensor_field(f.name):
                width = max(t.shape[-1] for t in got)
                got = [torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in got]
            elif not (Experience.is_episode_tensor_field(f.name) or first.dim() == 0):
                raise ValueError(f"no merge rule for {f.name}")
            kw[f.name] = torch.stack(got)
        elif isinstance(first, dict):
            merged = {}
            for key in first:
                vals = [d[key] for d in got]
                if not all(isinstance(v, type(vals[0])) for v in vals):
                    raise TypeError(f"mixed types in {f.name}[{key}]")
                numeric = all(isinstance(v, (int, float)) for v in vals)
                merged[key] = torch.tensor(vals) if numeric else vals
            kw[f.name] = merged
        elif isinstance(first, list):
            kw[f.name] = list(itertools.chain.from_iterable(got))
    return Experience(**kw)


@pytest.fixture(autouse=True)
def _module(monkeypatch):
    mod = types.ModuleType(MOD)
    mod.Experience = Experience
    mod.split_experience_batch = split_experience_batch
    mod.make_experience_batch = make_experience_batch
    monkeypatch.setitem(sys.modules, MOD, mod)
    monkeypatch.setattr(Experience, "__module__", MOD)
    yield mod


def _args(gpus: int) -> NS:
    return NS(actor=NS(num_nodes=1, num_gpus_per_node=gpus),
              ds=NS(ring_attn_size=1, tensor_parallel_size=1))  # fmt: skip


def _batch(rng: np.random.Generator, rows: int, width: int, label_len: int,
           extra: bool) -> Experience:  # fmt: skip
    lens = rng.integers(1, 400, rows)
    act = max(1, width - 1)
    return Experience(
        sequences=torch.as_tensor(rng.integers(1, 50, (rows, width))),
        action_mask=torch.as_tensor(rng.integers(0, 2, (rows, act)).astype(bool)),
        action_log_probs=torch.as_tensor(rng.standard_normal((rows, 2, act)).astype(np.float32)),
        rewards=torch.as_tensor(rng.standard_normal(rows)),
        total_length=torch.as_tensor(lens),
        extra=torch.as_tensor(rng.integers(0, 5, rows)) if extra else None,
        index=list(range(rows)),
        prompts=[f"s{int(x)}" for x in rng.integers(0, 10**6, rows)],
        labels=["lab"] * label_len,
        info={"kl": torch.as_tensor(rng.standard_normal(rows)),
              "n": [int(x) for x in rng.integers(0, 9, rows)],
              "tag": [f"t{int(x)}" for x in rng.integers(0, 3, rows)]},
    )  # fmt: skip


def _same(a: Any, b: Any, where: str) -> None:
    if torch.is_tensor(a):
        assert torch.is_tensor(b), where
        assert (a.dtype, tuple(a.shape)) == (b.dtype, tuple(b.shape)), where
        assert torch.equal(a, b), where
    elif isinstance(a, (list, dict)):
        assert type(a) is type(b) and len(a) == len(b), where
        if isinstance(a, dict):
            assert list(a) == list(b), where
            for key in a:
                _same(a[key], b[key], f"{where}[{key}]")
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _both_ways(make_batches, gpus: int, monkeypatch) -> tuple[Any, Any]:
    """balance_experiences with the row gather and with split / merge, on fresh copies."""
    monkeypatch.setattr(openrlhf, "GATHER_ROWS", False)
    slow = openrlhf.balance_experiences(make_batches(), _args(gpus))
    monkeypatch.setattr(openrlhf, "GATHER_ROWS", True)
    fast = openrlhf.balance_experiences(make_batches(), _args(gpus))
    return fast, slow


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 12), st.integers(1, 9), st.sampled_from([0, 1, 2])),
             min_size=1, max_size=4),
    st.integers(1, 6), st.booleans(), st.integers(0, 2**31 - 1),
)  # fmt: skip
def test_gather_equals_split_and_merge(shapes, gpus, extra, seed):
    """Any widths, counts, list lengths and actor counts: the same batches, field for
    field (values, dtypes, shapes), in the same order."""
    mp = pytest.MonkeyPatch()
    try:
        def make():
            rng = np.random.default_rng(seed)
            # label_len 1 = one per row; 0 and rows + 1 are copied whole into each sample.
            return [_batch(rng, r, w, {0: 0, 1: r, 2: r + 1}[lab], extra)
                    for r, w, lab in shapes]  # fmt: skip

        assert _experience_rows.layout(make(), sys.modules[MOD]) is not None
        fast, slow = _both_ways(make, gpus, mp)
    finally:
        mp.undo()
    assert len(fast) == len(slow) == min(gpus, sum(r for r, _, _ in shapes))
    for j, (a, b) in enumerate(zip(fast, slow)):
        assert type(a) is Experience
        for f in dataclasses.fields(Experience):
            _same(getattr(a, f.name), getattr(b, f.name), f"batch {j}.{f.name}")


def _mutations():
    def none_in_one(bs):
        bs[0].rewards = None

    def other_keys(bs):
        bs[1].info = {"n": bs[1].info["n"]}

    def mixed_types(bs):
        bs[1].info["n"] = [bool(x % 2) for x in bs[1].info["n"]]

    def grad(bs):
        bs[0].action_log_probs = bs[0].action_log_probs.requires_grad_()

    def flat_step(bs):
        for b in bs:
            b.action_mask = b.action_mask[:, 0]

    def dtypes(bs):
        bs[1].rewards = bs[1].rewards.float()

    def short_tensor(bs):
        bs[0].rewards = bs[0].rewards[:-1]

    def other_type(bs):
        for b in bs:
            b.labels = "text"

    def middle_dims(bs):  # per-token tensors (rows, 2, T) and (rows, 3, T)
        bs[1].action_log_probs = torch.cat([bs[1].action_log_probs] * 2, dim=1)[:, :3]

    def episode_shapes(bs):  # per-sample rows of 2 and of 3 values
        bs[0].rewards = torch.stack([bs[0].rewards] * 2, dim=1)
        bs[1].rewards = torch.stack([bs[1].rewards] * 3, dim=1)

    def sparse(bs):
        for b in bs:
            b.rewards = b.rewards.to_sparse()

    def subclass(bs):
        sub = type("Experience", (Experience,), {"__module__": MOD})
        bs[0] = sub(**{f.name: getattr(bs[0], f.name) for f in dataclasses.fields(Experience)})

    return [none_in_one, other_keys, mixed_types, grad, flat_step, dtypes, short_tensor,
            other_type, middle_dims, episode_shapes, sparse, subclass]  # fmt: skip


@pytest.mark.parametrize("mutate", _mutations(), ids=lambda f: f.__name__)
def test_anything_else_is_split_and_merged(mutate, monkeypatch):
    """Batches the gather does not reproduce exactly are left to split and merge: no
    layout (the assertion that matters), and then the same result or error as with the
    gather switched off."""

    def make():
        rng = np.random.default_rng(7)
        bs = [_batch(rng, 5, 4, 5, True), _batch(rng, 6, 3, 6, True)]
        mutate(bs)
        return bs

    assert _experience_rows.layout(make(), sys.modules[MOD]) is None
    outcome = []
    for gather in (False, True):
        monkeypatch.setattr(openrlhf, "GATHER_ROWS", gather)
        try:
            outcome.append(openrlhf.balance_experiences(make(), _args(3)))
        except (TypeError, ValueError, KeyError, IndexError, RuntimeError) as err:
            outcome.append(type(err))
    if isinstance(outcome[0], type):
        assert outcome[0] is outcome[1]
    else:
        for a, b in zip(*outcome):
            for f in dataclasses.fields(Experience):
                _same(getattr(a, f.name), getattr(b, f.name), f.name)


def test_gather_known_batches_and_index_reset():
    """Two batches, widths 2 and 3, two actors: exact tensors and info entries;
    ``index`` reset on the inputs as split resets it."""
    a = Experience(sequences=torch.tensor([[1, 1], [2, 2]]),
                   action_mask=torch.tensor([[True], [True]]),
                   total_length=torch.tensor([10, 1]), index=[0, 1], prompts=["a", "b"],
                   info={"n": [1, 2], "kl": torch.tensor([0.5, 1.5])})  # fmt: skip
    b = Experience(sequences=torch.tensor([[3, 3, 3]]), action_mask=torch.tensor([[False, True]]),
                   total_length=torch.tensor([8]), index=[2], prompts=["c"],
                   info={"n": [3], "kl": torch.tensor([2.5])})  # fmt: skip
    out = openrlhf.balance_experiences([a, b], _args(2))
    assert a.index is None and b.index is None
    # Tokens 10 | 1 + 8: the heavier actor holds sample "a" alone, the other "b" and "c".
    assert [o.prompts for o in out] == [["a"], ["b", "c"]]
    assert torch.equal(out[0].sequences, torch.tensor([[1, 1]]))
    assert torch.equal(out[1].sequences, torch.tensor([[2, 2, 0], [3, 3, 3]]))
    assert torch.equal(out[1].action_mask, torch.tensor([[True, False], [False, True]]))
    assert torch.equal(out[1].total_length, torch.tensor([1, 8]))
    assert out[1].rewards is None and out[1].index is None and out[1].labels == []
    assert torch.equal(out[1].info["n"], torch.tensor([2, 3]))
    # A tensor in info becomes a list of 0-d tensors (copies here, views in OpenRLHF).
    kl = out[1].info["kl"]
    assert [t.dim() for t in kl] == [0, 0] and [float(t) for t in kl] == [1.5, 2.5]


@pytest.mark.parametrize("gather", [True, False])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn"])
def test_narrow_float_total_length(gather, dtype, monkeypatch):
    """``total_length`` in a float type numpy lacks (bf16, fp8) balances as its values do:
    tokens 10, 1, 6, 3 into two actors of two samples: 10 + 1 | 6 + 3 is the only split
    with no actor above 11 (all exact in these types), on both paths."""
    if not hasattr(torch, dtype):
        pytest.skip(f"torch has no {dtype}")
    monkeypatch.setattr(openrlhf, "GATHER_ROWS", gather)
    a = Experience(sequences=torch.tensor([[1], [2]]),
                   total_length=torch.tensor([10.0, 1.0]).to(getattr(torch, dtype)),
                   prompts=["a", "b"])  # fmt: skip
    b = Experience(sequences=torch.tensor([[3], [4]]),
                   total_length=torch.tensor([6.0, 3.0]).to(getattr(torch, dtype)),
                   prompts=["c", "d"])  # fmt: skip
    out = openrlhf.balance_experiences([a, b], _args(2))
    assert [o.prompts for o in out] == [["a", "b"], ["c", "d"]]
    assert [o.total_length.dtype for o in out] == [getattr(torch, dtype)] * 2
