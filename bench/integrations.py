"""Joint mode on the frameworks' own code paths: verl's driver split, dispatch, mini-batches
and worker micro-batching, with and without seqbalance's joint mode.

    pip install --no-deps --target /work/ext verl==0.9.1 areal==1.0.4
    pip install --no-deps --target /tmp/td tensordict cloudpickle orjson pyvers importlib_metadata
    # verl main and slime: source checkouts or the fetch tool's snapshots
    python bench/integrations.py --ext /work/ext --td /tmp/td --verl-main /work/verl_main \\
        --slime /work/slime_main [--quick]

Outside CI: verl is imported from ``--ext`` with stand-ins for what it imports but does not
use here (ray, omegaconf, transformers, ...). For every case (workload, n, dp, mini-batches)
the same batch goes through three paths, each made of verl's real functions:

- **verl 0.9.1**: ``RayPPOTrainer._balance_batch`` (its source, run as a method of a small
  trainer stand-in that holds the config and the worker group's dispatch info), the batch
  turned into a TensorDict (``DataProto.to_tensordict``), cut into ``dp`` chunks
  (``tensordict_utils.chunk_tensordict``, what the dispatch does), each chunk into
  mini-batches (``tensordict_utils.make_iterator``, the worker's loop) and each mini-batch
  into micro-batches by ``rearrange_micro_batches`` with ``same_micro_num_in_dp`` over an
  emulated DP group: every rank runs in its own thread and ``torch.distributed.all_reduce``
  is replaced, inside verl's module, by a reduction over the threads.
- **verl main**: the same with verl main's ``_balance_batch`` and
  ``rearrange_micro_batches`` (its source loaded from ``--verl-main``).
- **joint**: ``seqbalance.compat.joint_verl.balance_batch`` in place of the driver method
  and its ``rearrange_micro_batches`` on every rank (each rank checks alone that it can
  follow the plan; the bench then checks all ranks did and agree on the count, which is
  what the all-gather decides in a run).

Rows carry their lengths in a ``(B, 1)`` ``attention_mask`` (verl reads row lengths as the
mask's row sums and its width as the padded length), which keeps n = 8,192 rows of up to
117k tokens small; verl's padding removal is not run (it drops the mask and keeps the
meta info, which carries the plan; the tests check that).

Per case: simulated FSDP and DDP step (sum over mini-batches) under the FLOPs cost of
Qwen2.5-7B (what the driver reads from the actor's ``config.json``) and under the
H100-calibrated cost of ``bench/results/gpu_step_h100.json``; micro-batches over the cap;
micro-batch counts per rank; planning time (driver, and all workers in this one process).
``plan()`` is a plain ``seqbalance.plan`` of the same mini-batches with the same rules
(``size="equal"``: verl's dispatch gives every rank an equal share). The joint plan uses the
FLOPs cost, as in a run without ``SEQBALANCE_VERL_COST``.

slime (``--slime``): slime's ``build_dp_schedule`` with ``--balance-data
--balance-by-flops`` (FLOPs packing that ignores the cap) against
``seqbalance.compat.slime.build_dp_schedule`` (one plan per step over ranks x micro-batches:
the same FLOPs balanced under the cap), on the same cases, a mini-batch being a slime step
(``global_batch_size`` = rows / mini-batches, one sample per rollout). slime runs Megatron,
whose data-parallel ranks wait once per step: the DDP step is compared.

Ends with one line: ``integrations: cap violations N, worst step vs framework X.XXX, worst
loss vs plan() Y.YY%``: N over all joint-mode cases, X the largest joint / framework FSDP
step (FLOPs and H100 costs, every verl path) and DDP step (slime), Y the largest
joint / ``plan()`` - 1 (verl).
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import ROOT, machine_info, print_table, write_json

import seqbalance as sb

WORKLOADS = {"rl-math": 32768, "sft-chat": 32768, "bimodal": 32768, "long-mix": 131072,
             "long-context": 262144}  # its longest rows (253k) need a 256k cap without CP
VERL_WORKLOADS = "rl-math,sft-chat,bimodal,long-mix"
AREAL_WORKLOADS = "rl-math,sft-chat,bimodal,long-mix,long-context"
HEAVY = ("ray", "omegaconf", "transformers", "codetiming", "numba", "hydra", "peft",
         "accelerate", "flash_attn", "safetensors", "huggingface_hub", "datasets",
         "pydantic", "torchdata", "wandb", "sglang", "vllm", "megatron")  # fmt: skip


class _Anything(types.ModuleType):
    __path__: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Stand-ins for the packages verl imports at module level but never calls here."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in HEAVY:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        return _Anything(spec.name)

    def exec_module(self, module: Any) -> None:
        pass


def load_verl(ext: str, td: str, main_root: str | None) -> dict[str, Any]:
    """verl 0.9.1's modules from ``ext``, and verl main's ``seqlen_balancing`` and trainer
    source from ``main_root``."""
    sys.path[:0] = [ext, td]
    sys.meta_path.insert(0, _StubFinder())
    for pkg in ("verl", "verl.utils", "verl.trainer", "verl.trainer.ppo"):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(Path(ext, *pkg.split(".")))]
        sys.modules[pkg] = mod
    out: dict[str, Any] = {
        "protocol": importlib.import_module("verl.protocol"),
        "tu": importlib.import_module("verl.utils.tensordict_utils"),
        "0.9.1": importlib.import_module("verl.utils.seqlen_balancing"),
        "trainer 0.9.1": Path(ext, "verl/trainer/ppo/ray_trainer.py").read_text(),
    }
    out["0.9.1"].get_device_name = lambda: "cpu"  # this machine's torch may lack CUDA
    if main_root:
        path = Path(main_root, "verl/utils/seqlen_balancing.py")
        spec = importlib.util.spec_from_file_location("verl_main_seqlen_balancing", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.get_device_name = lambda: "cpu"
        out["main"] = mod
        out["trainer main"] = Path(main_root, "verl/trainer/ppo/ray_trainer.py").read_text()
    return out


def trainer_methods(source: str, balancing: Any) -> dict[str, Any]:
    """``_balance_batch`` and ``_get_dp_size`` of ``RayPPOTrainer``, compiled from verl's
    source with that version's balancing functions as their globals."""
    import torch

    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RayPPOTrainer")
    env = {"torch": torch, "calculate_workload": balancing.calculate_workload,
           "get_seqlen_balanced_partitions": balancing.get_seqlen_balanced_partitions,
           "log_seqlen_unbalance": balancing.log_seqlen_unbalance, "DataProto": object}  # fmt: skip
    out = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name in ("_balance_batch", "_get_dp_size"):
            code = textwrap.dedent(ast.get_source_segment(source, node))
            exec(compile(code, f"<verl {node.name}>", "exec"), env)
            out[node.name] = env[node.name]
    return out


class _Node(dict):
    """A config node: attribute access and ``.get``, as OmegaConf's."""

    __getattr__ = dict.get


def make_trainer(methods: dict[str, Any], dp: int, cap: int, mb_rows: int) -> Any:
    actor = _Node(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=cap, ppo_mini_batch_size=mb_rows,
                  ulysses_sequence_parallel_size=1)  # fmt: skip
    config = _Node(actor_rollout_ref=_Node(actor=actor, rollout=_Node(n=1), model=_Node(path="")))
    cls = type("Trainer", (), dict(methods))
    t = cls()
    t.config = config
    t.actor_rollout_wg = types.SimpleNamespace(_dispatch_info={"actor": list(range(dp))})
    t._seqbalance_cost = sb.load_cost("qwen2.5-7b")  # what config.json would give
    return t


class _ThreadGroup:
    """An emulated DP group: each rank a thread, all_reduce a reduction over the threads."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.buf: list[Any] = [None] * size
        self.local = threading.local()

    def all_reduce(self, tensor: Any, op: str) -> None:
        import torch

        self.buf[self.local.rank] = tensor.clone()
        self.barrier.wait()
        stacked = torch.stack(self.buf)
        res = {"max": stacked.max(0).values, "min": stacked.min(0).values}.get(op, stacked.sum(0))
        self.barrier.wait()
        tensor.copy_(res)


class _FakeDist:
    ReduceOp = types.SimpleNamespace(MAX="max", MIN="min", SUM="sum")

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def all_reduce(tensor: Any, op: str = "sum", group: Any = None) -> None:
        group.all_reduce(tensor, op)


def run_ranks(fn: Any, args: list[Any], module: Any) -> list[Any]:
    """``fn(rank, arg, group)`` on one thread per rank, verl's ``dist`` emulated."""
    group = _ThreadGroup(len(args))
    out: list[Any] = [None] * len(args)
    errors: list[BaseException] = []

    def target(r: int) -> None:
        group.local.rank = r
        try:
            out[r] = fn(r, args[r], group)
        except BaseException as exc:  # reported after the join
            errors.append(exc)
            group.barrier.abort()

    saved = module.dist
    module.dist = _FakeDist
    try:
        threads = [threading.Thread(target=target, args=(r,)) for r in range(len(args))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        module.dist = saved
    if errors:
        raise errors[0]
    return out


def make_batch(protocol: Any, lens: np.ndarray) -> Any:
    import torch

    n = lens.shape[0]
    return protocol.DataProto.from_dict(
        {"attention_mask": torch.as_tensor(lens, dtype=torch.int64)[:, None],
         "input_ids": torch.zeros(n, 1, dtype=torch.int64),
         "row": torch.arange(n, dtype=torch.int64)}, meta_info={},
    )  # fmt: skip


def worker_inputs(verl: dict[str, Any], batch: Any, dp: int, mb_rows: int) -> list[list[Any]]:
    """Each rank's mini-batches, cut as verl does: TensorDict, dispatch chunks, iterator."""
    tu = verl["tu"]
    chunks = tu.chunk_tensordict(batch.to_tensordict(), dp)
    size, no_shuffle = mb_rows // dp, {"shuffle": False}
    iters = [tu.make_iterator(c, size, epochs=1, seed=r, dataloader_kwargs=no_shuffle)
             for r, c in enumerate(chunks)]  # fmt: skip
    return [list(it) for it in iters]


def framework_path(verl: dict[str, Any], version: str, lens: np.ndarray, dp: int, cap: int,
                   mb_rows: int) -> tuple[list[list[list[list[int]]]], float, float]:  # fmt: skip
    """verl's own path: rows per [mini-batch][rank][micro-batch], driver and worker seconds."""
    module = verl[version]
    trainer = make_trainer(trainer_methods(verl[f"trainer {version}"], module), dp, cap, mb_rows)
    batch = make_batch(verl["protocol"], lens)
    t0 = time.perf_counter()
    trainer._balance_batch(batch, metrics={})
    t1 = time.perf_counter()
    per_rank = worker_inputs(verl, batch, dp, mb_rows)

    def rank(r: int, minis: list[Any], group: Any) -> list[list[list[int]]]:
        out = []
        for td in minis:
            mbs, _ = module.rearrange_micro_batches(td, max_token_len=cap, dp_group=group,
                                                   same_micro_num_in_dp=True)  # fmt: skip
            out.append([mb["row"].tolist() for mb in mbs])
        return out

    t2 = time.perf_counter()
    got = run_ranks(rank, per_rank, module)
    t3 = time.perf_counter()
    n_mini = len(per_rank[0])
    return [[got[r][i] for r in range(dp)] for i in range(n_mini)], t1 - t0, t3 - t2


def joint_path(verl: dict[str, Any], lens: np.ndarray, dp: int, cap: int, mb_rows: int
               ) -> tuple[list[list[list[list[int]]]], float, float, dict[str, Any]]:  # fmt: skip
    from seqbalance.compat import joint_verl

    trainer = make_trainer({"_get_dp_size": trainer_methods(verl["trainer 0.9.1"],
                                                            verl["0.9.1"])["_get_dp_size"]},
                           dp, cap, mb_rows)  # fmt: skip
    batch = make_batch(verl["protocol"], lens)
    metrics: dict[str, Any] = {}
    t0 = time.perf_counter()
    joint_verl.balance_batch(trainer, batch, metrics)
    t1 = time.perf_counter()
    per_rank = worker_inputs(verl, batch, dp, mb_rows)
    t2 = time.perf_counter()
    out: list[list[list[list[int]]]] = []
    for i in range(len(per_rank[0])):
        counts, parts = set(), []
        for r in range(dp):
            td = per_rank[r][i]
            table = joint_verl._table_of(td)
            if joint_verl._followed(td, table, cap, None, None, 1) is None:
                raise AssertionError(f"rank {r} cannot follow the plan in mini-batch {i}")
            mbs, _ = joint_verl.rearrange_micro_batches(td, max_token_len=cap)
            counts.add(len(mbs))
            parts.append([mb["row"].tolist() for mb in mbs])
        if len(counts) != 1:
            raise AssertionError(f"mini-batch {i}: counts differ over ranks: {sorted(counts)}")
        out.append(parts)
    t3 = time.perf_counter()
    return out, t1 - t0, t3 - t2, metrics


def evaluate(parts: list[list[list[list[int]]]], lens: np.ndarray, cap: int,
             costs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """Simulated steps (summed over mini-batches) and the micro-batch counts and cap."""
    row: dict[str, Any] = {}
    for name, cost in costs.items():
        c = np.asarray(cost.per_sequence + cost.per_token * lens + cost.per_token_sq * lens**2.0)
        for sync in ("fsdp", "ddp"):
            total = 0.0
            for mini in parts:
                m = max(len(r) for r in mini)
                rows = sorted(i for r in mini for q in r for i in q)
                local = {i: k for k, i in enumerate(rows)}
                # A rank short of slots idles in the ones it lacks.
                padded = [[[local[i] for i in q] for q in r] + [[]] * (m - len(r)) for r in mini]
                total += sb.simulate(padded, c[rows], sync=sync,
                                     per_microbatch=cost.per_microbatch).step_time  # fmt: skip
            row[f"{sync}_{name}"] = total
    row["over_cap"] = sum(int(lens[q].sum()) > cap for mini in parts for r in mini for q in r)
    row["mb_per_rank"] = [sorted({len(r) for r in mini}) for mini in parts]
    return row


def reference(lens: np.ndarray, dp: int, cap: int, minis: list[list[list[list[int]]]],
              costs: dict[str, Any], size: str = "equal", cost: Any = None
              ) -> dict[str, Any]:  # fmt: skip
    """A plain ``seqbalance.plan`` of each of joint mode's mini-batches, with the same rules
    (verl: an equal share per rank, ``size="equal"``; AReaL: ``size="free"``) and the
    cost joint mode planned with (default: FLOPs)."""
    flops = costs["flops"] if cost is None else cost
    parts = []
    for mini in minis:
        rows = np.asarray(sorted(i for r in mini for q in r for i in q))
        p = sb.plan(lens[rows], dp, cap, cost=flops, size=size)
        parts.append([[[int(rows[i]) for i in q] for q in r] for r in p.micro_batches])
    return evaluate(parts, lens, cap, costs)


def h100_cost(path: Path) -> Any:
    return sb.load_cost(json.loads(path.read_text())["calibration"]["cost"])


def verl_cases(verl: dict[str, Any], args: Any, costs: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    versions = ["0.9.1"] + (["main"] if "main" in verl else [])
    for name in args.workloads.split(","):
        cap = WORKLOADS[name]
        for n in args.n:
            lens = np.asarray(sb.workloads.load(name, n, seed=0).lengths, dtype=np.int64)
            for dp in args.dp:
                for n_mini in args.minibatches:
                    mb_rows = n // n_mini
                    case = {"workload": name, "n": n, "dp": dp, "mini_batches": n_mini, "cap": cap}
                    parts, t_drv, t_wrk, metrics = joint_path(verl, lens, dp, cap, mb_rows)
                    joint = evaluate(parts, lens, cap, costs)
                    ref = reference(lens, dp, cap, parts, costs)
                    out = {**case, "path": "joint", **joint, "driver_s": t_drv, "workers_s": t_wrk,
                           "loss_vs_plan": joint["fsdp_flops"] / ref["fsdp_flops"] - 1,
                           "avoided": metrics["seqbalance/cap_violations_avoided"]}  # fmt: skip
                    rows.append(out)
                    rows.append({**case, "path": "plan()", **ref})
                    for v in versions:
                        fw_parts, f_drv, f_wrk = framework_path(verl, v, lens, dp, cap, mb_rows)
                        fw = evaluate(fw_parts, lens, cap, costs)
                        rows.append({**case, "path": f"verl {v}", **fw, "driver_s": f_drv,
                                     "workers_s": f_wrk})  # fmt: skip
                        for c in costs:
                            out[f"vs_verl_{v}_{c}"] = joint[f"fsdp_{c}"] / fw[f"fsdp_{c}"]
                            out[f"ddp_vs_verl_{v}_{c}"] = joint[f"ddp_{c}"] / fw[f"ddp_{c}"]
                    print(f"  {name} n={n} dp={dp} mini={n_mini}: joint/plan() "
                          f"{joint['fsdp_flops'] / ref['fsdp_flops']:.4f}, " + ", ".join(
                              f"vs verl {v} {out[f'vs_verl_{v}_flops']:.3f}" for v in versions),
                          flush=True)  # fmt: skip
    return rows


def load_slime(root: str) -> Any:
    """slime's ``dp_schedule`` from a source checkout (package ``__init__`` files skipped;
    the modules it imports are pure Python)."""
    for pkg in ("slime", "slime.utils"):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(Path(root, *pkg.split(".")))]
        sys.modules[pkg] = mod
    return importlib.import_module("slime.utils.dp_schedule")


def slime_args(cap: int) -> Any:
    """Dynamic batch size, ``--balance-data --balance-by-flops``, Qwen2.5-7B's shapes."""
    return types.SimpleNamespace(
        micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=cap,
        balance_data=True, balance_by_flops=True, hidden_size=3584, num_attention_heads=28,
        num_query_groups=4, vocab_size=152064, ffn_hidden_size=18944, num_experts=None,
        num_layers=28, kv_channels=128,
    )  # fmt: skip


def slime_parts(schedule: Any, dp: int) -> list[list[list[list[int]]]]:
    """``[step][rank][micro-batch]`` global sample indices of a ``build_dp_schedule`` answer."""
    partitions, mb_indices, counts, _ = schedule
    out, pos = [], [0] * dp
    for c in counts:
        step = []
        for r in range(dp):
            mbs = mb_indices[r][pos[r] : pos[r] + c]
            step.append([[partitions[r][i] for i in mb] for mb in mbs])
            pos[r] += c
        out.append(step)
    return out


def slime_cases(slime: Any, args: Any, costs: dict[str, Any]) -> list[dict[str, Any]]:
    """slime's ``build_dp_schedule`` (``--balance-by-flops``) against the seqbalance one,
    which balances the same FLOPs under the cap: one step per mini-batch."""
    from seqbalance.compat import slime as c_slime

    rows = []
    tp = {"dp_size": 0, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    for name in args.workloads.split(","):
        cap = WORKLOADS[name]
        for n in args.n:
            lens = np.asarray(sb.workloads.load(name, n, seed=0).lengths, dtype=np.int64)
            for dp in args.dp:
                for steps in args.minibatches:
                    case = {"workload": name, "n": n, "dp": dp, "mini_batches": steps, "cap": cap}
                    kw = {"global_batch_size": n // steps, "rollout_indices": list(range(n))}
                    a, par = slime_args(cap), {**tp, "dp_size": dp}
                    got = {}
                    for label, fn in (("slime", slime.build_dp_schedule),
                                      ("joint", c_slime.build_dp_schedule)):  # fmt: skip
                        t0 = time.perf_counter()
                        sched = fn(a, par, lens.tolist(), **kw)
                        dt = time.perf_counter() - t0
                        got[label] = {**evaluate(slime_parts(sched, dp), lens, cap, costs),
                                      "driver_s": dt}  # fmt: skip
                    j, o = got["joint"], got["slime"]
                    ratio = max(j[f"ddp_{c}"] / o[f"ddp_{c}"] for c in costs)
                    rows.append({**case, "path": "joint", **j, "vs_slime": ratio})
                    rows.append({**case, "path": "slime by_flops", **o})
                    print(f"  slime {name} n={n} dp={dp} steps={steps}: over cap slime "
                          f"{o['over_cap']}, joint {j['over_cap']}; DDP joint/slime {ratio:.3f}",
                          flush=True)  # fmt: skip
    return rows


# ---- AReaL ---------------------------------------------------------------------------


def load_areal(ext: str) -> dict[str, Any]:
    """AReaL 1.0.4's ``areal.utils.seqpack`` and ``areal.utils.data`` (imported from
    ``ext``, package ``__init__`` files skipped, stand-ins for numba, einops, torchdata,
    logging, the platform and ``cli_args``, whose ``MicroBatchSpec`` is compiled from
    AReaL's source), and the controller's dispatch (``_dispatch_tensors``,
    ``_item_weight``, ``_merge_tensors``, ``TrainController._partition_inputs`` and
    ``_prepare_dispatch``), compiled from ``train_controller.py`` into a module of that
    name, so that patches reach it as they reach AReaL's."""
    import dataclasses
    import logging

    import torch

    if ext not in sys.path:
        sys.path.insert(0, ext)
    if not any(isinstance(f, _StubFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _StubFinder())
    root = Path(ext, "areal")
    for pkg in ("areal", "areal.utils", "areal.api", "areal.infra", "areal.infra.controller"):
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(Path(ext, *pkg.split(".")))]
        sys.modules[pkg] = mod
    numba = types.ModuleType("numba")
    numba.njit = lambda *a, **k: a[0] if a and callable(a[0]) else (lambda f: f)
    numba.prange = range
    einops = types.ModuleType("einops")
    einops.rearrange = None
    log = types.ModuleType("areal.utils.logging")
    log.getLogger = lambda name=None, *a, **k: logging.getLogger(f"areal.{name}")
    platforms = types.ModuleType("areal.infra.platforms")
    platforms.current_platform = types.SimpleNamespace(device_type="cpu",
                                                       current_device=lambda: "cpu")
    sys.modules.update({"numba": numba, "einops": einops, "areal.utils.logging": log,
                        "areal.infra.platforms": platforms})  # fmt: skip
    seqpack = importlib.import_module("areal.utils.seqpack")
    cli = types.ModuleType("areal.api.cli_args")
    source = (root / "api/cli_args.py").read_text()
    node = next(n for n in ast.parse(source).body
                if isinstance(n, ast.ClassDef) and n.name == "MicroBatchSpec")  # fmt: skip
    cli.__dict__.update(dataclass=dataclasses.dataclass, field=dataclasses.field,
                        PACKING_ALGORITHMS=seqpack.PACKING_ALGORITHMS,
                        NormConfig=type("NormConfig", (), {}))  # fmt: skip
    sys.modules["areal.api.cli_args"] = cli
    exec(compile("@dataclass\n" + ast.get_source_segment(source, node), "<areal MicroBatchSpec>",
                 "exec"), cli.__dict__)  # fmt: skip
    data = importlib.import_module("areal.utils.data")
    ctl = types.ModuleType("areal.infra.controller.train_controller")
    src = (root / "infra/controller/train_controller.py").read_text()
    ctl.__dict__.update(torch=torch, Any=Any,
                        balanced_greedy_partition=seqpack.balanced_greedy_partition,
                        RTensor=type("RTensor", (), {}), make_dummy_eval_item=None,
                        logger=logging.getLogger("areal.TrainController"))  # fmt: skip
    tree = ast.parse(src)
    wanted = {"_find_in_structure", "_is_tensor_like", "_item_weight", "_dispatch_tensors",
              "_merge_tensors"}  # fmt: skip
    for n in tree.body:
        if isinstance(n, ast.FunctionDef) and n.name in wanted:
            exec(compile(ast.get_source_segment(src, n), f"<areal {n.name}>", "exec"), ctl.__dict__)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainController")
    methods = {}
    for n in cls.body:
        if isinstance(n, ast.FunctionDef) and n.name in ("_partition_inputs", "_prepare_dispatch"):
            exec(compile(textwrap.dedent(ast.get_source_segment(src, n)), f"<areal {n.name}>",
                         "exec"), ctl.__dict__)  # fmt: skip
            methods[n.name] = ctl.__dict__.pop(n.name)
    ctl.TrainController = type("TrainController", (), methods)
    sys.modules[ctl.__name__] = ctl
    return {"seqpack": seqpack, "data": data, "controller": ctl, "cli": cli}


class _GatherGroup:
    """An emulated process group for ``all_gather_object``: each rank a thread."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size)
        self.buf: list[Any] = [None] * size
        self.local = threading.local()

    def all_gather_object(self, out: list[Any], obj: Any) -> None:
        self.buf[self.local.rank] = obj
        self.barrier.wait()
        out[:] = list(self.buf)
        self.barrier.wait()


def _gather_dist(group: _GatherGroup) -> Any:
    """``torch.distributed`` as AReaL's ``areal.utils.data`` uses it, over ``group``."""
    return types.SimpleNamespace(
        is_initialized=lambda: True, get_world_size=lambda g=None: group.size,
        all_gather_object=lambda out, obj, group=None, _g=group: _g.all_gather_object(out, obj),
        ProcessGroup=object,
    )  # fmt: skip


def areal_items(lens: np.ndarray) -> list[dict[str, Any]]:
    """One trajectory per row: a ``(1, 1)`` ``attention_mask`` holding its length (AReaL
    reads lengths as mask sums, so a 117k-token row stays one number), and its index."""
    import torch

    return [{"attention_mask": torch.tensor([[int(v)]]), "input_ids": torch.zeros(1, 1),
             "row": torch.tensor([[i]])} for i, v in enumerate(lens.tolist())]  # fmt: skip


def areal_controller(areal: dict[str, Any], dp: int, cap: int, n_mini: int, cost: Any) -> Any:
    """A controller holding what AReaL's reads: the engine config (``mb_spec``,
    ``ppo_n_minibatches``) and the parallel strategy; ``cost`` stands for what the model's
    ``config.json`` (or ``SEQBALANCE_AREAL_COST``) would give."""
    spec = areal["cli"].MicroBatchSpec(max_tokens_per_mb=cap)
    c = areal["controller"].TrainController()
    c.config = types.SimpleNamespace(mb_spec=spec, ppo_n_minibatches=n_mini, path="")
    c.parallel_strategy = types.SimpleNamespace(dp_size=dp)
    c._seqbalance_cost = cost
    return c


def areal_worker(areal: dict[str, Any], items: list[dict[str, Any]], n_mini: int, cap: int,
                 group: Any = None) -> list[list[list[int]]]:  # fmt: skip
    """One rank of AReaL's actor: concatenation, the mini-batch split
    (``MicroBatchSpec(n_mbs=ppo_n_minibatches)``), each mini-batch's micro-batches under
    the engine's ``mb_spec``; rows per [mini-batch][micro-batch]."""
    data, cli = areal["data"], areal["cli"]
    batch = data.concat_padded_tensors(items)
    minis = data.split_padded_tensor_dict_into_mb_list(batch, cli.MicroBatchSpec(n_mbs=n_mini),
                                                      group=group)  # fmt: skip
    out = []
    for mini in minis.mbs:
        mbl = data.split_padded_tensor_dict_into_mb_list(
            mini, cli.MicroBatchSpec(max_tokens_per_mb=cap), group=group)
        out.append([mb["row"][:, 0].tolist() for mb in mbl.mbs])
    return out


def areal_path(areal: dict[str, Any], lens: np.ndarray, dp: int, cap: int, n_mini: int,
               joint: bool, cost: Any = None
               ) -> tuple[list[list[list[list[int]]]], float, float]:  # fmt: skip
    """AReaL's path (``joint=False``: its own functions, every rank a thread over an
    emulated group) or joint mode's (patched; each rank alone, checked to follow the
    plan); rows per [mini-batch][rank][micro-batch], controller and worker seconds."""
    from seqbalance.compat import areal as c_areal
    from seqbalance.compat import joint_areal

    ctl = areal_controller(areal, dp, cap, n_mini, cost)
    items = areal_items(lens)
    if joint:
        c_areal.patch(joint=True)
    try:
        t0 = time.perf_counter()
        dp_args, _, _ = ctl._prepare_dispatch(items)
        t1 = time.perf_counter()
        shares = dp_args[0]
        if joint:
            got = []
            for r, share in enumerate(shares):
                codes = [int(d[joint_areal.SLOT_KEY][0, 0]) for d in share]
                if not all(codes):
                    raise AssertionError(f"rank {r}: rows without a slot code")
                got.append(areal_worker(areal, share, n_mini, cap))
        else:
            module = areal["data"]
            group = _GatherGroup(dp)
            saved = module.dist
            module.dist = _gather_dist(group)
            try:
                got = run_ranks_plain(
                    lambda r, share: (setattr(group.local, "rank", r),
                                      areal_worker(areal, share, n_mini, cap, group))[1],
                    shares, group)  # fmt: skip
            finally:
                module.dist = saved
        t2 = time.perf_counter()
    finally:
        if joint:
            c_areal.unpatch()
    return [[got[r][i] for r in range(dp)] for i in range(n_mini)], t1 - t0, t2 - t1


def run_ranks_plain(fn: Any, args: list[Any], group: Any) -> list[Any]:
    """``fn(rank, arg)`` on one thread per rank; the first error is raised after the join."""
    out: list[Any] = [None] * len(args)
    errors: list[BaseException] = []

    def target(r: int) -> None:
        try:
            out[r] = fn(r, args[r])
        except BaseException as exc:  # reported after the join
            errors.append(exc)
            group.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(len(args))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def areal_cases(areal: dict[str, Any], args: Any, costs: dict[str, Any]) -> list[dict[str, Any]]:
    """AReaL's own path against joint mode planned with each cost (FLOPs, H100), and a
    plain ``plan()`` of joint mode's mini-batches with that cost, on every case."""
    rows = []
    for name in args.areal_workloads.split(","):
        cap = WORKLOADS[name]
        for n in args.n:
            lens = np.asarray(sb.workloads.load(name, n, seed=0).lengths, dtype=np.int64)
            for dp in args.dp:
                for k in args.minibatches:
                    case = {"workload": name, "n": n, "dp": dp, "mini_batches": k, "cap": cap}
                    fw_parts, f_ctl, f_wrk = areal_path(areal, lens, dp, cap, k, joint=False)
                    fw = evaluate(fw_parts, lens, cap, costs)
                    rows.append({**case, "path": "areal 1.0.4", **fw, "driver_s": f_ctl,
                                 "workers_s": f_wrk})  # fmt: skip
                    said = []
                    for planned in costs:  # the controller plans with each cost in turn
                        parts, t_ctl, t_wrk = areal_path(areal, lens, dp, cap, k, joint=True,
                                                         cost=costs[planned])  # fmt: skip
                        for mini in parts:
                            if len({len(r) for r in mini}) != 1:
                                raise AssertionError(f"{case}: counts differ over ranks")
                        joint = evaluate(parts, lens, cap, costs)
                        ref = reference(lens, dp, cap, parts, costs, size="free",
                                        cost=costs[planned])  # fmt: skip
                        label = "joint" if planned == "flops" else f"joint ({planned} cost)"
                        loss = joint[f"fsdp_{planned}"] / ref[f"fsdp_{planned}"] - 1
                        out = {**case, "path": label, "planned_with": planned, **joint,
                               "driver_s": t_ctl, "workers_s": t_wrk, "loss_vs_plan": loss}
                        for c in costs:
                            out[f"fsdp_vs_areal_{c}"] = joint[f"fsdp_{c}"] / fw[f"fsdp_{c}"]
                            out[f"ddp_vs_areal_{c}"] = joint[f"ddp_{c}"] / fw[f"ddp_{c}"]
                        out["vs_areal"] = out[f"fsdp_vs_areal_{planned}"]
                        rows += [out, {**case, "path": f"plan() ({planned} cost)", **ref}]
                        said.append(f"planned with {planned}: vs plan() "
                                    f"{1 + out['loss_vs_plan']:.4f}, vs areal "
                                    f"{out['vs_areal']:.3f}, over cap {joint['over_cap']}")
                    print(f"  areal {name} n={n} dp={dp} mini={k} (areal over cap "
                          f"{fw['over_cap']}): " + "; ".join(said), flush=True)
    return rows


def markdown(path: str) -> None:
    """The docs' tables (docs/integrations/verl.md, slime.md) from a results JSON."""
    data = json.loads(Path(path).read_text())

    def mbs(r: dict[str, Any]) -> str:
        return "+".join(str(max(c)) for c in r["mb_per_rank"])

    by = {}
    for r in data["verl"]:
        by.setdefault((r["workload"], r["n"], r["dp"], r["mini_batches"]), {})[r["path"]] = r

    print("| workload | n | dp | mini-batches | FSDP vs 0.9.1 (FLOPs / H100) | FSDP vs main "
          "(FLOPs / H100) | DDP vs 0.9.1 (FLOPs / H100) | micro-batches per rank: joint; "
          "0.9.1; main | over cap: joint; 0.9.1; main | driver s: joint; 0.9.1 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (w, n, dp, k), c in by.items():
        j, o, m = c["joint"], c["verl 0.9.1"], c.get("verl main", c["verl 0.9.1"])
        print(f"| {w} | {n:,} | {dp} | {k} | {j['fsdp_flops'] / o['fsdp_flops']:.3f} / "
              f"{j['fsdp_h100'] / o['fsdp_h100']:.3f} | {j['fsdp_flops'] / m['fsdp_flops']:.3f} / "
              f"{j['fsdp_h100'] / m['fsdp_h100']:.3f} | {j['ddp_flops'] / o['ddp_flops']:.3f} / "
              f"{j['ddp_h100'] / o['ddp_h100']:.3f} | {mbs(j)}; {mbs(o)}; {mbs(m)} | "
              f"{j['over_cap']}; {o['over_cap']}; {m['over_cap']} | "
              f"{j['driver_s']:.2f}; {o['driver_s']:.2f} |")
    if data.get("slime"):
        print()
        print("| workload | n | dp | steps | DDP joint / slime (FLOPs / H100) | FSDP (FLOPs / "
              "H100) | micro-batches per rank: joint; slime | over cap: joint; slime |")
        print("|---|---|---|---|---|---|---|---|")
        sl = {}
        for r in data["slime"]:
            sl.setdefault((r["workload"], r["n"], r["dp"], r["mini_batches"]), {})[r["path"]] = r
        for (w, n, dp, k), c in sl.items():
            j, o = c["joint"], c["slime by_flops"]
            print(f"| {w} | {n:,} | {dp} | {k} | {j['ddp_flops'] / o['ddp_flops']:.3f} / "
                  f"{j['ddp_h100'] / o['ddp_h100']:.3f} | {j['fsdp_flops'] / o['fsdp_flops']:.3f}"
                  f" / {j['fsdp_h100'] / o['fsdp_h100']:.3f} | {mbs(j)}; {mbs(o)} | "
                  f"{j['over_cap']}; {o['over_cap']} |")
    if data.get("areal"):
        print()
        print("| workload | n | dp | mini-batches | FSDP joint / AReaL: FLOPs-planned (FLOPs; "
              "H100) | H100-planned (H100; FLOPs) | joint / plan() | micro-batches per rank: "
              "joint; AReaL | over cap: joint; AReaL | controller s: joint; AReaL |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        ar = {}
        for r in data["areal"]:
            ar.setdefault((r["workload"], r["n"], r["dp"], r["mini_batches"]), {})[r["path"]] = r
        for (w, n, dp, k), c in ar.items():
            j, h, o = c["joint"], c["joint (h100 cost)"], c["areal 1.0.4"]
            loss = max(j["loss_vs_plan"], h["loss_vs_plan"])
            print(f"| {w} | {n:,} | {dp} | {k} | {j['fsdp_vs_areal_flops']:.3f}; "
                  f"{j['fsdp_vs_areal_h100']:.3f} | {h['fsdp_vs_areal_h100']:.3f}; "
                  f"{h['fsdp_vs_areal_flops']:.3f} | {1 + loss:.4f} | {mbs(j)}; {mbs(o)} | "
                  f"{j['over_cap']}; {o['over_cap']} | {j['driver_s']:.2f}; {o['driver_s']:.2f} |")
    print()
    print(data["summary"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ext", help="verl 0.9.1 (and areal) installed --no-deps")
    ap.add_argument("--td", help="tensordict & co. installed --no-deps")
    ap.add_argument("--markdown", metavar="JSON", help="print the docs' tables from a results "
                    "JSON and exit")  # fmt: skip
    ap.add_argument("--verl-main", help="verl main source checkout")
    ap.add_argument("--slime", help="slime source checkout")
    ap.add_argument("--quick", action="store_true", help="n=1,024 only")
    ap.add_argument("--no-areal", action="store_true", help="skip AReaL (run where --ext "
                    "holds areal)")  # fmt: skip
    ap.add_argument("--no-verl", action="store_true", help="skip verl")
    ap.add_argument("--workloads", default=VERL_WORKLOADS, help="comma-separated (verl, slime)")
    ap.add_argument("--areal-workloads", default=AREAL_WORKLOADS, help="comma-separated")
    ap.add_argument("--json", help="results file (default bench/results/integrations.json, "
                    "with --quick integrations_quick.json)")  # fmt: skip
    args = ap.parse_args()
    if args.markdown:
        markdown(args.markdown)
        return
    if not args.ext or not (args.td or args.no_verl):
        ap.error("--ext and --td are required (or --markdown)")
    args.n = [1024] if args.quick else [1024, 8192]
    if args.json is None:
        name = "integrations_quick.json" if args.quick else "integrations.json"
        args.json = str(ROOT / "bench/results" / name)
    args.dp = [8, 64]
    args.minibatches = [1, 4]
    costs = {"flops": sb.load_cost("qwen2.5-7b"),
             "h100": h100_cost(ROOT / "bench/results/gpu_step_h100.json")}  # fmt: skip
    rows: list[dict[str, Any]] = []
    if not args.no_verl:
        verl = load_verl(args.ext, args.td, args.verl_main)
        print("verl: 0.9.1 from", args.ext, "| main from", args.verl_main or "(not given)")
        rows = verl_cases(verl, args, costs)
    slime_rows: list[dict[str, Any]] = []
    if args.slime:
        slime_rows = slime_cases(load_slime(args.slime), args, costs)
        print_table(slime_rows, ["workload", "n", "dp", "mini_batches", "path", "ddp_flops",
                                 "ddp_h100", "fsdp_flops", "over_cap", "driver_s"])  # fmt: skip
    previous = json.loads(Path(args.json).read_text()) if Path(args.json).is_file() else {}
    kept = []
    if args.no_verl and previous.get("verl"):  # the summary covers every framework
        rows, kept = previous["verl"], [*kept, "verl"]
    if not args.slime and previous.get("slime"):
        slime_rows, kept = previous["slime"], [*kept, "slime"]
    if kept:
        print(f"rows of {', '.join(kept)} kept from {args.json} (not run now)")
    areal_rows: list[dict[str, Any]] = []
    if not args.no_areal and Path(args.ext, "areal").is_dir():
        print("areal: 1.0.4 from", args.ext)
        areal_rows = areal_cases(load_areal(args.ext), args, costs)
    cols = ["workload", "n", "dp", "mini_batches", "path", "fsdp_flops", "fsdp_h100", "ddp_flops",
            "ddp_h100", "over_cap", "driver_s", "workers_s"]  # fmt: skip
    print_table(rows, cols)
    if areal_rows:
        print_table(areal_rows, cols)
    joint = [r for r in rows if r["path"] == "joint"]
    areal_joint = [r for r in areal_rows if "vs_areal" in r]
    violations = sum(r["over_cap"] for r in joint + areal_joint) + sum(
        r["over_cap"] for r in slime_rows if r.get("path") == "joint")
    ratios = [v for r in joint for k, v in r.items() if k.startswith("vs_")]  # FSDP (verl)
    ddp_verl = max((v for r in joint for k, v in r.items() if k.startswith("ddp_vs_")),
                   default=None)
    ratios += [r["vs_slime"] for r in slime_rows if "vs_slime" in r]
    ratios += [r["vs_areal"] for r in areal_joint]  # FSDP, under the cost it planned with
    worst = max(ratios)
    loss = max(r["loss_vs_plan"] for r in joint + areal_joint)
    areal_worst = max((r["vs_areal"] for r in areal_joint), default=None)
    write_json(args.json, {"machine": machine_info(), "args": {k: v for k, v in vars(args).items()},
                           "kept_from_previous_run": kept,
                           "previous_args": (previous.get("previous_args")
                                             or previous.get("args")) if kept else None,
                           "verl": rows, "slime": slime_rows, "areal": areal_rows,
                           "summary": {"cap_violations": violations, "worst_vs_framework": worst,
                                       "worst_ddp_vs_verl": ddp_verl,
                                       "slime_over_cap": sum(r["over_cap"] for r in slime_rows
                                                             if r["path"] != "joint"),
                                       "worst_vs_areal": areal_worst,
                                       "worst_vs_areal_other_cost": max(
                                           (r[f"fsdp_vs_areal_{c}"] for r in areal_joint
                                            for c in costs if c != r["planned_with"]),
                                           default=None),
                                       "areal_worst_loss_vs_plan": max(
                                           (r["loss_vs_plan"] for r in areal_joint), default=None),
                                       "worst_loss_vs_plan": loss}})  # fmt: skip
    if areal_joint:
        print(f"areal: worst FSDP step vs AReaL's own path {areal_worst:.3f} (planned and "
              f"measured with one cost), worst loss vs plan() "
              f"{100 * max(r['loss_vs_plan'] for r in areal_joint):.2f}%, over the cap "
              f"{sum(r['over_cap'] for r in areal_joint)} (AReaL's own "
              f"{sum(r['over_cap'] for r in areal_rows if r['path'] == 'areal 1.0.4')})")
    verl_worst = max((r[k] for r in joint for k in r if k.startswith("vs_")), default=None)
    slime_worst = max((r["vs_slime"] for r in slime_rows if "vs_slime" in r), default=None)
    print(("verl not run; " if verl_worst is None else
           f"verl: worst FSDP step vs verl's own path {verl_worst:.3f} (DDP {ddp_verl:.4f}); ")
          + ("slime not run" if slime_worst is None else
             f"slime: worst DDP step vs slime's {slime_worst:.3f}, slime's own schedule "
             f"over the cap {sum(r['over_cap'] for r in slime_rows if r['path'] != 'joint')}"))
    print(f"integrations: cap violations {violations}, worst step vs framework {worst:.3f}, "
          f"worst loss vs plan() {100 * loss:.2f}%")


if __name__ == "__main__":
    main()
