"""Every ```python block of the README and docs/ runs, with its placeholders filled in.

The blocks are sketches: they use names the reader supplies (``batch``, ``weights``,
``model``...). Each block has a case here that binds those names to small real values, runs
the block as written, and checks what the surrounding text promises of its result. A new
block without a case fails :func:`test_every_block_has_a_case`, so docs cannot drift from
the API unnoticed. Blocks that import a framework run against a fake module tree, and the
torch blocks run on two processes (gloo), as they would in training.
"""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

import numpy as np
import pytest
from _fakes import fake_module

import seqbalance as sb

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "examples" / "README.md"]


def _blocks() -> list[tuple[str, int, str]]:
    """(file, line of the opening fence, code) of every python block."""
    out = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
            line = text.count("\n", 0, m.start()) + 1
            out.append((str(path.relative_to(ROOT)), line, m.group(1)))
    return out


BLOCKS = _blocks()

# A case per block: a line of the block that names it, and the function that runs it.
CASES: dict[str, str] = {
    "plan = sb.plan(lengths, dp_size=8, max_tokens=32768, cost=cost, sync=\"fsdp\")": "plan",
    "for rank, load in enumerate(plan.stats()[\"rank_loads\"]):": "quickstart",
    "parts = sb.partition(weights, k, size=\"balanced\", groups=prompt_ids)": "partition",
    "sb.QuadraticCost(per_token=b, per_token_sq=c, per_sequence=a, per_microbatch=c0)": "costs",
    "sampler = BalancedDistributedSampler(dataset_lengths, global_batch_size=512,":
        "torch_sft",
    "micro_batches, handle = rebalance(batch, lengths, max_tokens=32768, cost=\"qwen2.5-7b\")":
        "torch_rl",
    "balancer = Rebalancer(max_tokens=16384, cost=recorder.cost, sync=\"ddp\")": "torch_loop",
    "from seqbalance.compat.verl import rearrange_micro_batches, get_seqlen_balanced_partitions":
        "compat_readme",
    "cp_size=8, cp=\"dynamic\",": "cp",
    "cost = UlyssesCost(sb.load_cost(\"qwen2.5-7b\"), sp_size=4, bandwidth=1.5e11)": "ulysses",
    "pp_size=4, schedule=\"1f1b\")": "pipeline",
    "cp=\"static\", cp_cost={\"bandwidth\": 2.5e10}, pp_size=2)": "cp_pipeline",
    "from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, "
    "rearrange_micro_batches": "verl_import",
    "seqbalance.compat.verl.patch()": "verl_patch",
    "seqbalance.compat.verl.patch(joint=True)": "verl_joint",
    "from seqbalance.compat.areal import ffd_allocate, kk_allocate, balanced_greedy_partition":
        "areal",
    "from seqbalance.compat.slime import build_dp_schedule, calculate_fwd_flops, first_fit_pack":
        "slime",
    "from seqbalance.compat.openrlhf import balance_experiences, "
    "get_minimum_num_micro_batch_size": "openrlhf",
    "planner = sb.StreamingPlanner(dp_size=8, max_tokens=32768, cost=\"qwen2.5-7b\")":
        "streaming",
    "mesh = sb.Mesh(dp=8, sync=\"ddp\", pp=2)": "request",
}


def _case(code: str) -> str:
    names = [name for key, name in CASES.items() if key in code]
    assert len(names) == 1, f"block matches cases {names}:\n{code}"
    return names[0]


def test_every_block_has_a_case():
    assert BLOCKS, "no python blocks found"
    for where, line, code in BLOCKS:
        names = [name for key, name in CASES.items() if key in code]
        assert len(names) == 1, f"{where}:{line} matches cases {names}; add one to CASES"
    assert {_case(code) for _, _, code in BLOCKS} == set(CASES.values()), "unused cases"


def _fake_modules(monkeypatch, names: dict[str, list[str]]) -> dict[str, types.ModuleType]:
    """Install empty modules (and their parents) with placeholder functions."""
    return {name: fake_module(monkeypatch, name, **dict.fromkeys(funcs, _original))
            for name, funcs in names.items()}  # fmt: skip


def _original(*args, **kwargs):
    return "original"


def _run(code: str, ns: dict) -> dict:
    ns.setdefault("sb", sb)
    exec(compile(code, "<doc block>", "exec"), ns)
    return ns


def _lengths(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(16, 4096, size=n)


# ---- core blocks ---------------------------------------------------------------------


def run_plan(code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the block writes plan.json
    batch = np.arange(1024) * 10  # one row per sequence
    ns = _run(code, {"rank": 3, "j": 0, "batch": batch, "outputs": batch})
    plan = ns["plan"]
    assert sorted(np.concatenate([np.concatenate(r) for r in plan.micro_batches]).tolist()) == \
        list(range(1024))  # fmt: skip
    assert ns["batch_in_plan_order"].tolist() == batch[plan.order()].tolist()
    # outputs produced in plan order come back in input order
    assert ns["batch_in_plan_order"][plan.inverse_order()].tolist() == batch.tolist()
    assert ns["sim"].gap >= 0
    assert sb.Plan.from_json("plan.json").micro_batches == plan.micro_batches


def run_request(code, tmp_path, monkeypatch):
    import contextlib
    import io

    lengths = np.concatenate([_lengths(120), [20_000]])  # one above the capacity: alone
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns = _run(code, {"lengths": lengths, "prompt_ids": np.arange(121) // 4})
    p = ns["p"]
    assert p.dp_size == 8 and p.sync == "ddp" and p.num_micro_batches >= 2
    assert p.violations()["over_capacity"] == 1
    first, second = out.getvalue().splitlines()
    assert first == "True False 16"
    assert second.startswith("cp_size - cp_size must be a power of two")


def run_quickstart(code, tmp_path, monkeypatch):
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        ns = _run(code, {})
    plan, sim = ns["plan"], ns["sim"]
    lines = out.getvalue().splitlines()
    # one line per rank with its load and micro-batch count, then the step, bound and gap
    assert len(lines) == plan.dp_size + 1 == 9
    loads = plan.stats()["rank_loads"]
    for rank, line in enumerate(lines[:-1]):
        assert line == (f"rank {rank}: {loads[rank]:.4g} FLOP in "
                        f"{plan.num_micro_batches} micro-batches")  # fmt: skip
    assert max(loads) <= sim.step_time and sim.lower_bound <= sim.step_time
    step = f"step {sim.step_time:.4g} FLOP, bound {sim.lower_bound:.4g}, gap {sim.gap:.2%}"
    assert lines[-1] == step
    assert 0 <= sim.gap < 0.05


def run_partition(code, tmp_path, monkeypatch):
    weights = _lengths(64)
    prompt_ids = np.repeat(np.arange(16), 4)
    ns = _run(code, {"weights": weights, "k": 4, "prompt_ids": prompt_ids})
    parts = ns["parts"]
    assert sorted(i for p in parts for i in p) == list(range(64))
    where = {i: j for j, p in enumerate(parts) for i in p}
    for g in range(16):  # each prompt's responses on one part
        assert len({where[i] for i in np.flatnonzero(prompt_ids == g)}) == 1
    assert max(parts.loads) >= parts.lower_bound


def run_costs(code, tmp_path, monkeypatch):
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "llama", "hidden_size": 1024, "num_hidden_layers": 4,
        "num_attention_heads": 16, "num_key_value_heads": 4, "intermediate_size": 2816,
        "vocab_size": 32000,
    }))  # fmt: skip
    truth = sb.QuadraticCost(per_token=2.0, per_token_sq=1e-3, per_sequence=5.0,
                             per_microbatch=50.0)  # fmt: skip
    rng = np.random.default_rng(1)
    microbatches = [rng.integers(8, 2048, size=rng.integers(1, 6)).tolist() for _ in range(40)]
    length_matrix = np.zeros((40, 5), dtype=np.int64)
    for r, mb in enumerate(microbatches):
        length_matrix[r, : len(mb)] = mb
    seconds = [truth.microbatch_cost(mb) for mb in microbatches]
    code = code.replace('"path/to/config.json"', repr(str(config)))
    ns = {"a": 5.0, "b": 2.0, "c": 1e-3, "c0": 50.0, "microbatches": microbatches,
          "seconds": seconds, "length_matrix": length_matrix}  # fmt: skip
    # Each line is an expression: evaluate them one by one and keep the values.
    values = [eval(line.split("  #")[0], {"sb": sb, **ns})
              for line in code.splitlines() if line.strip()]  # fmt: skip
    fitted = values[-1]
    assert fitted.per_token == pytest.approx(2.0, rel=1e-6)
    assert fitted.per_token_sq == pytest.approx(1e-3, rel=1e-6)
    assert values[-2].per_token == pytest.approx(2.0, rel=1e-6)


def run_cp(code, tmp_path, monkeypatch):
    lengths = np.concatenate([_lengths(200), [200_000, 90_000, 40_000]])
    ns = _run(code, {"sb": sb, "lengths": lengths, "gpu": 0, "slot": 0})
    p = ns["p"]
    assert set(p.degrees()) <= {1, 2, 4, 8}
    assert p.simulate().gap >= 0


def run_ulysses(code, tmp_path, monkeypatch):
    lengths = np.concatenate([_lengths(500), [60_000]])  # one beyond a GPU, within a group
    ns = _run(code, {"sb": sb, "lengths": lengths, "world": 32})
    p, cost = ns["p"], ns["cost"]
    assert p.dp_size == 8 and p.max_tokens == 65536
    assert not any(p.violations().values())
    assert cost.per_token_sq == sb.load_cost("qwen2.5-7b").per_token_sq / 4


def run_pipeline(code, tmp_path, monkeypatch):
    fwd, bwd = [3.0, 1.0, 2.0, 5.0, 4.0], [6.0, 2.0, 4.0, 10.0, 8.0]
    ns = {"sb": sb, "lengths": _lengths(512), "cost": sb.load_cost("qwen2.5-7b"),
          "fwd": fwd, "bwd": bwd}  # fmt: skip
    lines = code.splitlines()
    _run("\n".join(lines[:3]), ns)  # the plan and its simulation
    assert ns["sim"].step_time >= ns["sim"].lower_bound
    step = eval(lines[3].split("  #")[0], ns)
    bound = eval(lines[4].split("  #")[0], ns)
    assert step.step_time >= bound > 0


def run_cp_pipeline(code, tmp_path, monkeypatch):
    lengths = np.concatenate([_lengths(300), [60_000]])  # one over 4 GPUs of 16k
    ns = _run(code, {"sb": sb, "lengths": lengths})
    p = ns["p"]
    assert p.pipeline.spec.pp_size == 2 and set(p.degrees()) == {4}
    assert not any(p.violations().values())
    sim = p.simulate_pipeline()
    assert sim.step_time >= sim.lower_bound > 0
    assert sorted(i for r in p.replica_micro_batches() for mb in r for i in mb) == list(
        range(301)
    )


# ---- compat blocks -------------------------------------------------------------------


def run_compat_readme(code, tmp_path, monkeypatch):
    mods = _fake_modules(monkeypatch, {
        "slime.utils.seqlen_balancing": ["get_seqlen_balanced_partitions"],
        "slime.utils.flops_utils": ["calculate_fwd_flops"],
        "slime.utils.dp_schedule": ["build_dp_schedule"],
    })  # fmt: skip
    import seqbalance.compat.slime as slime

    try:
        ns = _run(code, {})
        assert mods["slime.utils.dp_schedule"].build_dp_schedule is slime.build_dp_schedule
        parts = ns["get_seqlen_balanced_partitions"]([5, 1, 4, 2, 3, 3], 2, True)
        assert sorted(i for p in parts for i in p) == list(range(6))
    finally:
        slime.unpatch()
    assert mods["slime.utils.dp_schedule"].build_dp_schedule() == "original"


def _patched(code, monkeypatch, module, tree):
    mods = _fake_modules(monkeypatch, tree)
    compat = __import__(f"seqbalance.compat.{module}", fromlist=["patch"])
    try:
        ns = _run(code, {})
        name, funcs = next(iter(tree.items()))
        assert getattr(mods[name], funcs[0]) is getattr(compat, funcs[0])
    finally:
        compat.unpatch()
    return ns


def run_verl_import(code, tmp_path, monkeypatch):
    _fake_modules(monkeypatch, {"verl.utils.seqlen_balancing": [
        "get_seqlen_balanced_partitions", "rearrange_micro_batches"]})  # fmt: skip
    from seqbalance.compat import verl

    ns = _run(code, {})
    assert ns["get_seqlen_balanced_partitions"] is verl.get_seqlen_balanced_partitions
    assert ns["rearrange_micro_batches"] is verl.rearrange_micro_batches


def run_verl_patch(code, tmp_path, monkeypatch):
    _patched(code, monkeypatch, "verl", {"verl.utils.seqlen_balancing": [
        "get_seqlen_balanced_partitions", "rearrange_micro_batches"]})  # fmt: skip


def run_verl_joint(code, tmp_path, monkeypatch):
    mods = _fake_modules(monkeypatch, {
        "verl.utils.seqlen_balancing": ["rearrange_micro_batches", "prepare_dynamic_batch"],
        "verl.trainer.ppo.ray_trainer": [],
    })  # fmt: skip

    class RayPPOTrainer:
        def _balance_batch(self, *args, **kwargs):
            return "original"

    mods["verl.trainer.ppo.ray_trainer"].RayPPOTrainer = RayPPOTrainer
    from seqbalance.compat import joint_verl, verl

    try:
        _run(code, {})
        worker = mods["verl.utils.seqlen_balancing"]
        assert worker.rearrange_micro_batches is joint_verl.rearrange_micro_batches
        assert RayPPOTrainer._balance_batch is joint_verl._joint_method
    finally:
        verl.unpatch()
    assert RayPPOTrainer._balance_batch(None) == "original"


def run_areal(code, tmp_path, monkeypatch):
    ns = _patched(code, monkeypatch, "areal", {
        "areal.utils.seqpack": ["ffd_allocate", "kk_allocate"],
        "areal.utils.data": ["allocate_balanced_mbs_synced"],
    })  # fmt: skip
    groups = ns["ffd_allocate"]([300, 200, 100, 400], 500, 1)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]


def run_slime(code, tmp_path, monkeypatch):
    ns = _patched(code, monkeypatch, "slime", {
        "slime.utils.dp_schedule": ["build_dp_schedule"],
        "slime.utils.seqlen_balancing": ["get_seqlen_balanced_partitions"],
        "slime.utils.flops_utils": ["calculate_fwd_flops"],
    })  # fmt: skip
    assert ns["first_fit_pack"] is not None


def run_openrlhf(code, tmp_path, monkeypatch):
    ns = _patched(code, monkeypatch, "openrlhf", {
        "openrlhf.trainer.ppo_utils.experience": ["balance_experiences"],
        "openrlhf.utils.seqlen_balancing": ["get_minimum_num_micro_batch_size"],
    })  # fmt: skip
    assert ns["get_minimum_num_micro_batch_size"] is not None


# ---- torch blocks: two gloo processes ------------------------------------------------


def _torch_sft(rank, world, code):
    import torch
    from torch.utils.data import DataLoader

    dataset_lengths = _lengths(1024)  # SFT: the same dataset on every rank
    dataset = [{"input_ids": torch.ones(int(n), dtype=torch.long)} for n in dataset_lengths]
    ns = _run(code, {"dataset_lengths": dataset_lengths, "dataset": dataset,
                     "DataLoader": DataLoader})  # fmt: skip
    first = next(iter(ns["loader"]))
    drawn = [list(mb) for mb in ns["sampler"]]  # this rank's micro-batches of the epoch
    return {
        "drawn": drawn,
        "tokens": [int(dataset_lengths[mb].sum()) for mb in drawn],
        "first_keys": sorted(first.keys()),
    }


def _torch_rl(rank, world, code):
    import torch

    lengths = _lengths(1024, seed=1 + rank)  # RL: this rank's own sequences
    width = 4096  # the same padded width on every rank
    ids = torch.zeros(1024, width, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        ids[i, :n] = torch.arange(1, n + 1) + i
    batch = {"input_ids": ids}

    # The outputs are computed between the block's two halves (its `...`): per-sequence
    # results in this rank's micro-batch order.
    head, tail = code.split("\n...\n")
    ns = _run(head, {"lengths": lengths, "batch": batch})
    ns["outputs"] = [mb["input_ids"].sum(dim=1) for mb in ns["micro_batches"]]
    _run(tail, ns)
    restored = ns["per_sequence_outputs"]
    return {
        "restored_ok": bool(torch.equal(restored, ids.sum(dim=1))),
        "held": sum(int(mb["input_ids"].shape[0]) for mb in ns["micro_batches"]),
    }


def _torch_loop(rank, world, code):
    import torch

    from seqbalance.torch import pack_collate

    rng = np.random.default_rng(rank)
    loader = []
    for _ in range(12):  # 12 steps: the block refits at step 9
        lens = rng.integers(16, 3000, size=24)
        loader.append(pack_collate([{"input_ids": torch.ones(int(n), dtype=torch.long)}
                                    for n in lens]))  # fmt: skip
    weight = torch.ones((), requires_grad=True)
    logged = []
    ns = {
        "loader": loader,
        "model": lambda mb: weight * mb["input_ids"].float().sum(),
        "loss_fn": lambda out: out,
        "wandb": types.SimpleNamespace(log=logged.append),
    }
    _run(code, ns)
    return {"logged": len(logged), "keys": sorted(logged[-1]),
            "cost": repr(ns["balancer"].cost)}  # fmt: skip


def run_torch_sft(code, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(_torch_sft, 2, code, timeout=240)
    for r in out:
        assert len(r["drawn"]) == len(out[0]["drawn"])  # as many micro-batches on each rank
        assert max(r["tokens"]) <= 32768
        assert "input_ids" in r["first_keys"] and "cu_seqlens" in r["first_keys"]
    drawn = sorted(i for r in out for mb in r["drawn"] for i in mb)
    assert drawn == list(range(1024))  # the epoch covers the dataset once


def run_torch_rl(code, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(_torch_rl, 2, code, timeout=240)
    for r in out:
        assert r["restored_ok"], r
    assert sum(r["held"] for r in out) == 2048  # every sequence held once


def run_torch_loop(code, tmp_path, monkeypatch):
    pytest.importorskip("torch")
    from seqbalance.torch.testing import run_distributed

    out = run_distributed(_torch_loop, 2, code, timeout=240)
    assert out[0] == out[1]  # the same records and refit on both ranks
    assert out[0]["logged"] == 12
    assert any(k.startswith("balance/") for k in out[0]["keys"])


def run_streaming(code, tmp_path, monkeypatch):
    # Rollouts finish shortest first, 64 at a time; every rank runs the loop alike.
    w = sb.workloads.load("rl-math", 512, seed=0)
    order = np.argsort(w.lengths, kind="stable")
    batches = [(w.lengths[order[k:k + 64]], order[k:k + 64]) for k in range(0, 512, 64)]
    per_rank = []
    for rank in range(8):
        ns = _run(code, {"rollout_batches": batches, "rank": rank, "train_step": list})
        per_rank.append(ns["ran"])
    assert len({len(r) for r in per_rank}) == 1  # the same number of steps on every rank
    ids = [i for r in per_rank for mb in r for i in mb]
    assert sorted(ids) == list(range(512))  # every rollout trained on exactly once
    assert len(per_rank[0]) > 1


@pytest.mark.parametrize(("where", "line", "code"), BLOCKS,
                         ids=[f"{w}:{n}" for w, n, _ in BLOCKS])  # fmt: skip
def test_block_runs(where, line, code, tmp_path, monkeypatch):
    globals()[f"run_{_case(code)}"](code, tmp_path, monkeypatch)


def test_layout_names_every_module():
    # The development page's layout block lists the modules of the three core packages.
    text = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    named = set(re.findall(r"[\w]+\.py", block))
    src = ROOT / "src" / "seqbalance"
    missing = [
        str(f.relative_to(src))
        for pkg in ("costs", "partitioning", "planning")
        for f in sorted((src / pkg).glob("*.py"))
        if f.name != "__init__.py" and f.name not in named
    ]
    top = [f.name for f in sorted(src.glob("*.py")) if f.name not in ("__init__.py", "__main__.py")]
    missing += [name for name in top if name not in named]
    assert not missing, f"add to the Layout of docs/development.md: {missing}"
