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

WORKLOADS = {"rl-math": 32768, "sft-chat": 32768, "bimodal": 32768, "long-mix": 131072}
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
              costs: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    """A plain ``seqbalance.plan`` of each of joint mode's mini-batches (same rules: an
    equal share per rank)."""
    flops = costs["flops"]
    parts = []
    for mini in minis:
        rows = np.asarray(sorted(i for r in mini for q in r for i in q))
        p = sb.plan(lens[rows], dp, cap, cost=flops, size="equal")
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


def markdown(path: str) -> None:
    """The docs' tables (docs/integrations/verl.md, slime.md) from a results JSON."""
    data = json.loads(Path(path).read_text())
    by = {}
    for r in data["verl"]:
        by.setdefault((r["workload"], r["n"], r["dp"], r["mini_batches"]), {})[r["path"]] = r

    def mbs(r: dict[str, Any]) -> str:
        return "+".join(str(max(c)) for c in r["mb_per_rank"])

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
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated")
    ap.add_argument("--json", help="results file (default bench/results/integrations.json, "
                    "with --quick integrations_quick.json)")  # fmt: skip
    args = ap.parse_args()
    if args.markdown:
        markdown(args.markdown)
        return
    if not (args.ext and args.td):
        ap.error("--ext and --td are required (or --markdown)")
    args.n = [1024] if args.quick else [1024, 8192]
    if args.json is None:
        name = "integrations_quick.json" if args.quick else "integrations.json"
        args.json = str(ROOT / "bench/results" / name)
    args.dp = [8, 64]
    args.minibatches = [1, 4]
    costs = {"flops": sb.load_cost("qwen2.5-7b"),
             "h100": h100_cost(ROOT / "bench/results/gpu_step_h100.json")}  # fmt: skip
    verl = load_verl(args.ext, args.td, args.verl_main)
    print("verl: 0.9.1 from", args.ext, "| main from", args.verl_main or "(not given)")
    rows = verl_cases(verl, args, costs)
    slime_rows: list[dict[str, Any]] = []
    if args.slime:
        slime_rows = slime_cases(load_slime(args.slime), args, costs)
        print_table(slime_rows, ["workload", "n", "dp", "mini_batches", "path", "ddp_flops",
                                 "ddp_h100", "fsdp_flops", "over_cap", "driver_s"])  # fmt: skip
    cols = ["workload", "n", "dp", "mini_batches", "path", "fsdp_flops", "fsdp_h100", "ddp_flops",
            "ddp_h100", "over_cap", "driver_s", "workers_s"]  # fmt: skip
    print_table(rows, cols)
    joint = [r for r in rows if r["path"] == "joint"]
    violations = sum(r["over_cap"] for r in joint) + sum(
        r["over_cap"] for r in slime_rows if r.get("path") == "joint")
    ratios = [v for r in joint for k, v in r.items() if k.startswith("vs_")]  # FSDP (verl)
    ddp_verl = max(v for r in joint for k, v in r.items() if k.startswith("ddp_vs_"))
    ratios += [r["vs_slime"] for r in slime_rows if "vs_slime" in r]
    worst = max(ratios)
    loss = max(r["loss_vs_plan"] for r in joint)
    write_json(args.json, {"machine": machine_info(), "args": {k: v for k, v in vars(args).items()},
                           "verl": rows, "slime": slime_rows,
                           "summary": {"cap_violations": violations, "worst_vs_framework": worst,
                                       "worst_ddp_vs_verl": ddp_verl,
                                       "slime_over_cap": sum(r["over_cap"] for r in slime_rows
                                                             if r["path"] != "joint"),
                                       "worst_loss_vs_plan": loss}})  # fmt: skip
    verl_worst = max(r[k] for r in joint for k in r if k.startswith("vs_"))
    slime_worst = max((r["vs_slime"] for r in slime_rows if "vs_slime" in r), default=None)
    print(f"verl: worst FSDP step vs verl's own path {verl_worst:.3f} (DDP {ddp_verl:.4f}); "
          + ("slime not run" if slime_worst is None else
             f"slime: worst DDP step vs slime's {slime_worst:.3f}, slime's own schedule "
             f"over the cap {sum(r['over_cap'] for r in slime_rows if r['path'] != 'joint')}"))
    print(f"integrations: cap violations {violations}, worst step vs framework {worst:.3f}, "
          f"worst loss vs plan() {100 * loss:.2f}%")


if __name__ == "__main__":
    main()
