"""The request as values (seqbalance.planning.request) and plan()'s two forms.

Round trips (to_dict / from_dict), errors that name the argument (ArgumentError), the rules
across parts, and hypothesis draws that the value form and the flat form give the same plan,
byte for byte.
"""

from __future__ import annotations

import ast
import inspect
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import seqbalance
from seqbalance import ArgumentError, Capacity, Mesh, MicroBatching, PlanSpec, RankRules, plan
from seqbalance.planning.planner import plan_cp
from seqbalance.planning.request import FLAT_KEYWORDS

SRC = Path(seqbalance.__file__).parent

# ---- the values --------------------------------------------------------------------------

meshes = st.builds(
    Mesh,
    dp=st.integers(1, 64),
    sync=st.sampled_from(["fsdp", "ddp"]),
    cp=st.sampled_from([1, 2, 4]),
    cp_mode=st.just("static"),
    pp=st.integers(1, 8),
)
capacities = st.builds(
    Capacity,
    max_tokens=st.integers(1, 2**40),
    padded=st.booleans(),
    oversized=st.sampled_from(["error", "alone"]),
)
batchings = st.builds(
    MicroBatching,
    min_count=st.integers(1, 16),
    multiple=st.integers(1, 8),
    extra=st.integers(0, 4),
    allow_empty=st.booleans(),
    order=st.sampled_from([None, "heaviest_first", "light_ends", "index"]),
)
ruleses = st.builds(
    RankRules,
    size=st.sampled_from(["free", "equal", "balanced"]),
    groups=st.one_of(st.none(), st.lists(st.integers(0, 5), max_size=20)),
)


@pytest.mark.parametrize(
    ("strategy", "cls"),
    [(meshes, Mesh), (capacities, Capacity), (batchings, MicroBatching), (ruleses, RankRules)],
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_to_dict_from_dict_round_trips(strategy, cls, data):
    value = data.draw(strategy)
    again = cls.from_dict(value.to_dict())
    assert again == value
    assert again.to_dict() == value.to_dict()
    assert hash(again) == hash(value) or cls is Mesh  # (a Mesh may hold a cp_cost dict)


def test_the_spec_round_trips_with_its_parts():
    spec = PlanSpec(
        Mesh(4, sync="ddp", pp=2), Capacity(4096, oversized="alone"), cost="qwen2.5-7b",
        batching=MicroBatching(min_count=2, extra=1), rules=RankRules("equal", [0, 0, 1, 1]),
        effort="thorough", baselines=False,
    )  # fmt: skip
    data = spec.to_dict()
    assert data["mesh"]["dp"] == 4 and data["rules"]["groups"] == [0, 0, 1, 1]
    assert PlanSpec.from_dict(data) == spec


def test_values_are_frozen_and_normalised():
    mesh = Mesh(np.int64(8), cp=np.int32(2))
    assert type(mesh.dp) is int and mesh.dp == 8 and mesh.cp == 2
    assert mesh.cp_enabled and not mesh.pp_enabled and mesh.world_size == 16
    with pytest.raises(AttributeError):
        mesh.dp = 4  # type: ignore[misc]
    groups = [3, 3, 1]
    rules = RankRules(groups=groups)
    groups[0] = 9  # the caller's list is not the rules'
    assert rules.groups.tolist() == [3, 3, 1] and not rules.groups.flags.writeable


@pytest.mark.parametrize(
    ("make", "argument", "words"),
    [
        (lambda: Mesh(0), "dp_size", "dp_size must be >= 1"),
        (lambda: Mesh(2, sync="zero"), "sync", "sync must be one of"),
        (lambda: Mesh(2, cp=3), "cp_size", "power of two"),
        (lambda: Mesh(2, cp_mode="fixed"), "cp", "cp must be one of"),
        (lambda: Mesh(2, pp=0), "pp_size", "pp_size"),
        (lambda: Mesh(2, pp=2, schedule="zb"), "schedule", "schedule must be one of"),
        (lambda: Mesh(2, pp=2, schedule="interleaved"), "virtual_stages", "virtual_stages >= 2"),
        (lambda: Mesh(2, pp_comm=0.5), "pp_comm", "needs pp_size > 1"),
        (lambda: Mesh(2, cp=2, cp_mode="dynamic", pp=2), "pp_size", "cp='static'"),
        (lambda: Capacity(0), "max_tokens", "max_tokens must be >= 1"),
        (lambda: Capacity(2**62), "max_tokens", r"below 2\*\*62"),
        (lambda: Capacity(8, padded="yes"), "padded", "True or False"),
        (lambda: Capacity(8, oversized="split"), "oversized", "oversized must be one of"),
        (lambda: MicroBatching(min_count=0), "min_micro_batches", ">= 1"),
        (lambda: MicroBatching(multiple=1.5), "micro_batch_multiple", "positive integer"),
        (lambda: MicroBatching(extra=-1), "extra_micro_batches", "must be >= 0"),
        (lambda: MicroBatching(order="random"), "order", "order must be one of"),
        (lambda: MicroBatching(per_micro_batch=2, extra=1), "sequences_per_micro_batch",
         "extra_micro_batches"),
        (lambda: RankRules(size="any"), "size", "size must be one of"),
        (lambda: RankRules(groups="abc"), "groups", "one id per item"),
    ],
)
def test_a_bad_value_is_refused_naming_its_argument(make, argument, words):
    with pytest.raises(ArgumentError, match=words) as info:
        make()
    assert info.value.argument == argument
    assert isinstance(info.value, ValueError)
    assert argument in FLAT_KEYWORDS  # the CLI and the flat form know every one


@pytest.mark.parametrize(
    ("parts", "flat", "argument"),
    [
        ({"batching": MicroBatching(per_micro_batch=2), "rules": RankRules("equal")},
         {"sequences_per_micro_batch": 2, "size": "equal"}, "sequences_per_micro_batch"),
        ({"mesh": Mesh(2, pp=2), "batching": MicroBatching(order="index")},
         {"pp_size": 2, "order": "index"}, "order"),
        ({"mesh": Mesh(2, cp=2), "capacity": Capacity(8, padded=True)},
         {"cp_size": 2, "padded": True}, "padded"),
        ({"mesh": Mesh(2, cp=2, cp_mode="dynamic"), "rules": RankRules(groups=[0, 1, 0, 1])},
         {"cp_size": 2, "cp": "dynamic", "groups": [0, 1, 0, 1]}, "groups"),
        ({"mesh": Mesh(2, cp=2, cp_mode="dynamic"), "capacity": Capacity(8, oversized="alone")},
         {"cp_size": 2, "cp": "dynamic", "oversized": "alone"}, "oversized"),
    ],
)
def test_rules_across_parts_are_checked_by_the_spec(parts, flat, argument):
    with pytest.raises(ArgumentError) as info:
        PlanSpec(**{"mesh": Mesh(2), "capacity": Capacity(8), **parts})
    assert info.value.argument == argument
    # ... and plan()'s flat form says the same
    with pytest.raises(ArgumentError) as by_keywords:
        plan([1, 2, 3, 4], 2, 8, **flat)
    assert by_keywords.value.argument == argument
    assert str(by_keywords.value) == str(info.value)


def test_a_part_of_the_wrong_type_is_refused():
    with pytest.raises(ArgumentError, match="batching must be a MicroBatching") as info:
        PlanSpec(Mesh(2), Capacity(8), batching={"min_count": 2})
    assert info.value.argument == "batching"
    with pytest.raises(ArgumentError, match="effort must be one of"):
        PlanSpec(Mesh(2), Capacity(8), effort="max")


def test_from_dict_names_an_unknown_field():
    with pytest.raises(ArgumentError, match="Mesh has no field 'dp_size'") as info:
        Mesh.from_dict({"dp_size": 2})
    assert info.value.argument == "mesh"


def test_argument_errors_pickle():
    err = pickle.loads(pickle.dumps(ArgumentError("dp_size must be >= 1", argument="dp_size")))
    assert isinstance(err, ArgumentError) and err.argument == "dp_size"
    assert str(err) == "dp_size must be >= 1"


# ---- plan()'s two forms ------------------------------------------------------------------


def test_the_value_form_has_at_most_eight_parameters():
    for fn in (plan, plan_cp):
        params = inspect.signature(fn).parameters
        assert len(params) <= 8, list(params)
        named = [p for p in params.values() if p.kind is not p.VAR_KEYWORD]
        assert [p.name for p in named] == [
            "lengths", "mesh", "capacity", "cost", "batching", "rules", "effort"
        ]  # fmt: skip


def test_flat_keywords_next_to_their_part_are_refused():
    with pytest.raises(ArgumentError, match=r"sync= was passed next to a Mesh") as info:
        plan([1, 2], Mesh(2), 8, sync="ddp")
    assert info.value.argument == "sync"
    with pytest.raises(ArgumentError, match=r"Capacity\(\.\.\., padded=True\)"):
        plan([1, 2], 2, Capacity(8), padded=True)
    # a number for a part takes that part's flat keywords
    assert plan([1, 2], 2, 8, sync="ddp").sync == "ddp"


def test_unknown_or_missing_arguments_are_type_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        plan([1, 2], 2, 8, bogus=1)
    with pytest.raises(TypeError, match="missing a required argument: 'capacity'"):
        plan([1, 2], 2)
    with pytest.raises(TypeError, match="multiple values for argument 'dp_size'"):
        plan([1, 2], 2, 8, dp_size=2)
    with pytest.raises(ArgumentError, match="plan_cp needs cp_size >= 2"):
        plan_cp([1, 2], 2, 8)


@st.composite
def requests(draw):
    n = draw(st.integers(0, 40))
    lengths = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    dp = draw(st.integers(1, 4))
    cap = draw(st.integers(max(lengths, default=1) or 1, 200))
    mesh = {"dp_size": dp, "sync": draw(st.sampled_from(["fsdp", "ddp"]))}
    if draw(st.booleans()):
        mesh["pp_size"] = draw(st.integers(2, 3))
        mesh["schedule"] = draw(st.sampled_from(["1f1b", "gpipe"]))
    elif draw(st.integers(0, 4)) == 0:
        mesh["cp_size"] = 2
    capacity = {"max_tokens": cap, "padded": draw(st.booleans()) and "cp_size" not in mesh}
    batching = {
        "min_micro_batches": draw(st.integers(1, 3)),
        "micro_batch_multiple": draw(st.integers(1, 2)),
        "allow_empty": True,
        "extra_micro_batches": draw(st.integers(0, 1)),
    }
    if "pp_size" not in mesh and draw(st.booleans()):
        batching["order"] = draw(st.sampled_from(["heaviest_first", "light_ends", "index"]))
    rules = {"size": draw(st.sampled_from(["free", "equal", "balanced"]))}
    if draw(st.booleans()) and n:
        rules["groups"] = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    cost = draw(st.sampled_from([None, "qwen2.5-7b"]))
    return lengths, mesh, capacity, batching, rules, cost, draw(st.booleans())


def _outcome(fn):
    try:
        return fn().to_json()
    except ValueError as exc:
        return f"{type(exc).__name__}: {exc}"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_the_value_form_and_the_flat_form_give_the_same_plan(req):
    lengths, mesh, capacity, batching, rules, cost, baselines = req
    flat = {**mesh, **capacity, **batching, **rules}
    by_keywords = _outcome(lambda: plan(lengths, cost=cost, baselines=baselines, **flat))

    def by_values():
        m = Mesh(mesh["dp_size"], mesh["sync"], cp=mesh.get("cp_size", 1),
                 pp=mesh.get("pp_size", 1), schedule=mesh.get("schedule", "1f1b"))
        c = Capacity(capacity["max_tokens"], capacity["padded"])
        b = MicroBatching(batching["min_micro_batches"], batching["micro_batch_multiple"],
                          batching["extra_micro_batches"], allow_empty=True,
                          order=batching.get("order"))
        r = RankRules(rules["size"], rules.get("groups"))
        return plan(lengths, m, c, cost=cost, batching=b, rules=r, baselines=baselines)

    assert _outcome(by_values) == by_keywords
    spec = PlanSpec.from_keywords(cost=cost, flat={**flat, "baselines": baselines})
    assert _outcome(lambda: plan(lengths, spec.mesh, spec.capacity, cost=cost,
                                 batching=spec.batching, rules=spec.rules,
                                 baselines=baselines)) == by_keywords  # fmt: skip


def test_a_whole_spec_is_the_request():
    lengths = [900, 100, 500, 500, 300, 700] * 2
    spec = PlanSpec(Mesh(2, sync="ddp"), Capacity(1000), batching=MicroBatching(min_count=3))
    assert plan(lengths, spec).to_json() == plan(
        lengths, dp_size=2, max_tokens=1000, sync="ddp", min_micro_batches=3
    ).to_json()
    with pytest.raises(ArgumentError, match="next to a PlanSpec") as info:
        plan(lengths, spec, cost="qwen2.5-7b")
    assert info.value.argument == "cost"
    with pytest.raises(ArgumentError, match="next to a PlanSpec"):
        plan(lengths, spec, padded=True)


def test_plan_cp_takes_either_form():
    lengths = [900, 100, 500, 500, 300, 700] * 3
    a = plan_cp(lengths, Mesh(2, cp=2), Capacity(1000))
    b = plan_cp(lengths, 2, 1000, cp_size=2)
    c = plan(lengths, dp_size=2, max_tokens=1000, cp_size=2)
    assert a.to_json() == b.to_json() == c.to_json()


# ---- what the entry no longer does -------------------------------------------------------


def _calls(tree: ast.AST, name: str) -> list[int]:
    return [
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]  # fmt: skip


def test_no_locals_capture_and_no_signature_binding_in_src():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.name}:{ln} locals()" for ln in _calls(tree, "locals")]
        for node in ast.walk(tree):
            # inspect.signature(...).bind(...): a call of .bind on a signature() call
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("bind", "bind_partial")
                    and _calls(node.func.value, "signature")):  # fmt: skip
                found.append(f"{path.name}:{node.lineno} signature().bind")
    # compat/_verl_dropin.py reads the signature of a framework's function it wraps, not ours
    assert [f for f in found if not f.startswith("_verl_dropin.py")] == []


def test_nothing_in_planning_calls_plan():
    found = []
    for path in sorted((SRC / "planning").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{path.name}:{ln}" for ln in _calls(tree, "plan")]
    assert found == []


# ---- the sampler takes a spec ------------------------------------------------------------


def test_the_sampler_takes_a_spec():
    pytest.importorskip("torch")
    from seqbalance.torch import BalancedDistributedSampler

    lengths = np.random.default_rng(3).integers(1, 60, size=90)
    spec = PlanSpec(Mesh(2, sync="ddp"), Capacity(64), batching=MicroBatching(min_count=2))
    kw = dict(rank=0, seed=1, check_ranks=False)
    a = BalancedDistributedSampler(lengths, 40, spec=spec, **kw)
    b = BalancedDistributedSampler(lengths, 40, 64, num_replicas=2, sync="ddp",
                                   min_micro_batches=2, **kw)  # fmt: skip
    assert list(a.steps()) == list(b.steps())
    fa, fb = a._fingerprint(), b._fingerprint()
    assert np.array_equal(fa.pop("lengths"), fb.pop("lengths")) and fa == fb
    with pytest.raises(ArgumentError, match="next to spec=") as info:
        BalancedDistributedSampler(lengths, 40, spec=spec, padded=True, **kw)
    assert info.value.argument == "padded"
    with pytest.raises(ArgumentError, match="differs from the spec's 64"):
        BalancedDistributedSampler(lengths, 40, 32, spec=spec, **kw)


def worker_rebalance_spec(rank: int, world: int) -> list[str]:
    import torch

    from seqbalance.torch import Rebalancer, rebalance

    lens = np.array([[5, 3, 7], [2, 9, 4]][rank])
    tok = np.concatenate([np.full(n, 10 * rank + i) for i, n in enumerate(lens)])
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    batch = {"input_ids": torch.from_numpy(tok), "cu_seqlens": torch.from_numpy(cu)}
    spec = PlanSpec(Mesh(world, sync="ddp"), Capacity(12), batching=MicroBatching(min_count=2))
    out = []
    for call in (
        lambda: rebalance(batch, spec=spec),
        lambda: rebalance(batch, max_tokens=12, sync="ddp", min_micro_batches=2),
        lambda: Rebalancer(spec=spec, method="p2p")(batch),
    ):
        _, handle = call()
        out.append(handle.plan.to_json())
    try:
        rebalance(batch, spec=spec, min_micro_batches=3)
    except ValueError as exc:  # every rank raises the same error
        out.append(str(exc))
    grouped = PlanSpec(Mesh(world, sync="ddp"), Capacity(12), rules=RankRules(groups=[0, 0, 1]))
    try:  # rebalance's groups are each rank's own: refused in the spec, before any exchange
        rebalance(batch, spec=grouped)
    except ArgumentError as exc:
        out.append(exc.argument)
    return out


def test_rebalance_takes_a_spec():
    pytest.importorskip("torch")
    pytest.importorskip("torch.distributed")
    from seqbalance.torch.testing import run_distributed

    results = run_distributed(worker_rebalance_spec, 2, timeout=100)
    for got in results:
        by_spec, by_keywords, by_balancer, refused, grouped = got
        assert by_spec == by_keywords == by_balancer
        assert "min_micro_batches= was passed next to spec=" in refused
        assert grouped == "spec"
    assert results[0] == results[1]
