"""The compat drop-ins against the frameworks' published code on their typical calls.

    pip install --no-deps --target /work/ext9 verl==0.9.1 areal==1.0.4
    git clone https://github.com/THUDM/slime /tmp/slime          # pure-Python modules used
    git clone https://github.com/OpenRLHF/OpenRLHF /tmp/openrlhf
    python bench/compat.py --ext /work/ext9 --slime /tmp/slime --openrlhf /tmp/openrlhf [--quick]

verl and AReaL are imported from ``--ext`` without their heavy dependencies: the modules
they import only for other features (ray, omegaconf, numba, ...) are replaced by stubs in
this script (numba.njit becomes the identity). Calls measured, per standard workload:

- verl ``_balance_batch``: ``get_seqlen_balanced_partitions(calculate_workload(L), dp,
  equal_size=True)``; the heaviest rank's workload.
- verl dynamic micro-batching (the loop inside ``rearrange_micro_batches``): micro-batches
  of one rank's ``n / dp`` sequences under ``max_token_len``; heaviest micro-batch workload,
  count, micro-batches over the cap. Twice: the drop-in's default (the fewest micro-batches
  that hold the cap) and ``match_framework_count=True`` (verl's own count).
- AReaL ``ffd_allocate`` / ``kk_allocate`` of one rank's sequences under
  ``max_tokens_per_mb``; heaviest micro-batch tokens, count, over-cap.
- slime ``build_dp_schedule`` (dynamic batch size, ``balance_data``: FLOPs schedule) of
  the whole rollout, one step, for a 7B-like dense model; heaviest rank's FLOPs, count of
  micro-batches per rank, micro-batches over the cap that hold more than one sample.
  ``balance_by_flops`` as well (slime's FLOPs packing ignores the cap).
- OpenRLHF dynamic batch (replay buffer): ``get_minimum_num_micro_batch_size`` then
  ``get_seqlen_balanced_partitions(L, m, False)`` of one rank's sequences; and
  ``balance_experiences`` of the rollout over dp actors, on OpenRLHF's own ``Experience``
  batches (torch tensors, :func:`experiences`; rows of 64 and of 2,048 tokens): the
  original splits them into samples, sorts by their 0-d ``total_length`` tensors and
  merges; the drop-in reads each batch's lengths once, partitions, and gathers each
  actor's rows field by field. Before timing, the drop-in's batches are checked equal,
  field for field, to those OpenRLHF's own split and merge make of the same partition
  (:func:`check_experience_gather`). A "balancing only" row times the balancing alone.

The per-rank calls run twice: on one rank's ``n / dp`` sequences of each rollout, and on a
rank holding 8,192 sequences (``--rank-n``; the drop-ins' speed target is for calls of
n >= 8,192). One call of an original that runs past ``--orig-limit`` seconds is stopped
(SIGALRM); its row then gives a lower bound on the speed-up and no quality figures.

slime and OpenRLHF are loaded from source checkouts (their package ``__init__`` files are
skipped; the modules used import nothing heavy once ``openrlhf.utils.utils`` is stubbed).

Micro-batch rows also give the step time of one rank, ``sum over micro-batches of
(c0 + work)`` with verl's workload ``24576 L + L**2`` and a per-micro-batch overhead ``c0``
(each micro-batch is a full forward/backward: launches, FSDP gathers...) of
``--mb-overhead-tokens`` tokens' linear work, as the ratio drop-in / original. Both sides
hold the same sequences, so this is ``(m_sb c0 + W) / (m_orig c0 + W)``: at most 1 exactly
when the drop-in uses no more micro-batches, for any ``c0 >= 0``.

Prints a table and writes JSON to bench/results/compat.json. The machine may be loaded:
times are the best of a few runs, and the ratio is what to read.
"""
# ruff: noqa: B023  (each lambda is called inside the loop iteration that made it)

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import best_time, machine_info, print_table, write_json

import seqbalance as sb
from seqbalance.compat import areal as c_areal
from seqbalance.compat import verl as c_verl


def _stub(name: str, **attrs: object) -> None:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    sys.modules.setdefault(name, mod)


def load_originals(ext: str) -> tuple[object, object]:
    """verl.utils.seqlen_balancing and areal.utils.seqpack, with stubs for heavy imports."""
    sys.path.insert(0, ext)
    for pkg in ("verl", "verl.utils", "areal", "areal.utils"):  # skip package __init__s
        mod = types.ModuleType(pkg)
        mod.__path__ = [str(Path(ext, *pkg.split(".")))]
        sys.modules[pkg] = mod
    _stub("verl.protocol", DataProto=object)
    _stub("verl.utils.tensordict_utils")
    _stub("verl.utils.device", get_device_name=lambda: "cpu")
    _stub("numba", njit=lambda f=None, **k: f if f else (lambda g: g))
    import logging

    _stub("areal.utils.logging", getLogger=logging.getLogger)
    import importlib

    return (
        importlib.import_module("verl.utils.seqlen_balancing"),
        importlib.import_module("areal.utils.seqpack"),
    )


def load_slime_openrlhf(slime_root: str, orlhf_root: str) -> tuple[object, object, object]:
    """slime.utils.dp_schedule, openrlhf.utils.seqlen_balancing and OpenRLHF's experience
    module (with its own ``Experience``, ``split_experience_batch`` and
    ``make_experience_batch``; only ``zero_pad_sequences`` of ``openrlhf.utils.utils`` is
    stood in for, by :func:`pad_right`)."""
    import importlib

    for pkg, root in (("slime", slime_root), ("openrlhf", orlhf_root)):
        for sub in (pkg, f"{pkg}.utils", f"{pkg}.trainer", f"{pkg}.trainer.ppo_utils"):
            mod = types.ModuleType(sub)
            mod.__path__ = [str(Path(root, *sub.split(".")))]
            sys.modules[sub] = mod
    _stub("openrlhf.utils.utils", zero_pad_sequences=pad_right)
    return (
        importlib.import_module("slime.utils.dp_schedule"),
        importlib.import_module("openrlhf.utils.seqlen_balancing"),
        importlib.import_module("openrlhf.trainer.ppo_utils.experience"),
    )


def pad_right(seqs: list, side: str = "left", value: int = 0, stack: bool = False) -> object:
    """What OpenRLHF's ``zero_pad_sequences`` does: pad the last dimension to the longest
    with ``value`` on ``side``, then stack (new first dimension) or concatenate."""
    import torch
    import torch.nn.functional as F

    width = max(x.shape[-1] for x in seqs)
    out = [F.pad(x, (width - x.shape[-1], 0) if side == "left" else (0, width - x.shape[-1]),
                 value=value) for x in seqs]  # fmt: skip
    return torch.stack(out) if stack else torch.cat(out)


#: Tokens per row of the stand-in rollout's per-token tensors (real rows are padded to
#: the batch's longest sequence). The width scales the copying, which both sides do once
#: or twice; the per-sample work of splitting and merging does not depend on it.
EXPERIENCE_WIDTH = 64
#: A second, realistic width (long-CoT rollouts pad rows to thousands of tokens).
EXPERIENCE_WIDTH_WIDE = 2048


def experiences(exp_mod, lens: np.ndarray, batches: int = 8,
                width: int = EXPERIENCE_WIDTH) -> list[object]:  # fmt: skip
    """A rollout as OpenRLHF ``Experience`` batches: per-token tensors (token ids, masks,
    log-probs, advantages) ``width`` wide, per-sample tensors (rewards, lengths,
    ``total_length``), metadata lists (``prompts`` holds the sample ids) and an ``info``
    dict of per-sample tensors as OpenRLHF fills it, ``batches`` batches in index order."""
    import torch

    out = []
    for c in np.array_split(np.arange(lens.shape[0]), batches):
        b, w = c.shape[0], width
        out.append(exp_mod.Experience(
            sequences=torch.zeros(b, w, dtype=torch.long),
            attention_mask=torch.ones(b, w, dtype=torch.long),
            action_mask=torch.ones(b, w, dtype=torch.bool),
            action_log_probs=torch.zeros(b, w), advantages=torch.zeros(b, w),
            rewards=torch.zeros(b), response_length=torch.as_tensor(lens[c] // 2),
            total_length=torch.as_tensor(lens[c]), prompts=c.tolist(),  # ids, to check
            labels=[""] * b,
            info={**{key: torch.zeros(b) for key in _INFO_FLOAT_KEYS},
                  "response_clip_ratio": torch.zeros(b, dtype=torch.bool),
                  "response_length": torch.as_tensor(lens[c] // 2)},
        ))  # fmt: skip
    return out


#: The per-sample float tensors OpenRLHF's experience maker puts in ``info`` (besides a
#: bool clip flag and the response length): each is merged into a list of 0-d tensors,
#: one object per sample, on both sides.
_INFO_FLOAT_KEYS = ("reward", "score", "kl", "logprobs_diff", "group_reward_std", "return")


def check_experience_gather(exp_mod, c_orlhf, lens: np.ndarray, dp: int) -> None:
    """The drop-in's gathered batches equal, field for field (values, dtypes, shapes),
    what OpenRLHF's own ``split_experience_batch`` / ``make_experience_batch`` make of the
    same partition (the drop-in's split-and-merge path, ``GATHER_ROWS = False``), on
    batches of two widths; AssertionError otherwise."""
    import dataclasses

    import torch

    def same(a, b, where):
        if torch.is_tensor(a):
            assert torch.is_tensor(b) and a.dtype == b.dtype and a.shape == b.shape, where
            assert torch.equal(a, b), where
        elif isinstance(a, dict):
            assert isinstance(b, dict) and list(a) == list(b), where
            for key in a:
                same(a[key], b[key], f"{where}[{key}]")
        elif isinstance(a, list):
            assert isinstance(b, list) and len(a) == len(b), where
            for i, (x, y) in enumerate(zip(a, b)):
                same(x, y, f"{where}[{i}]")
        else:
            assert a == b, where

    def batches():  # rows of 2,048 tokens in the odd batches, 64 in the even ones
        out = [experiences(exp_mod, lens[c], batches=1,
                           width=EXPERIENCE_WIDTH_WIDE if i % 2 else EXPERIENCE_WIDTH)[0]
               for i, c in enumerate(np.array_split(np.arange(lens.shape[0]), 8))]  # fmt: skip
        for b, c in zip(out, np.array_split(np.arange(lens.shape[0]), 8)):
            b.prompts = c.tolist()  # global ids
        return out

    from seqbalance.compat import _experience_rows

    # Else both calls below would split and merge, and the check would test nothing.
    assert _experience_rows.layout(batches(), exp_mod) is not None
    saved = c_orlhf.GATHER_ROWS
    try:
        c_orlhf.GATHER_ROWS = False
        merged = c_orlhf.balance_experiences(batches(), openrlhf_args(dp))
        c_orlhf.GATHER_ROWS = True
        gathered = c_orlhf.balance_experiences(batches(), openrlhf_args(dp))
    finally:
        c_orlhf.GATHER_ROWS = saved
    assert len(merged) == len(gathered)
    for j, (a, b) in enumerate(zip(gathered, merged)):
        for f in dataclasses.fields(a):
            same(getattr(a, f.name), getattr(b, f.name), f"batch {j}.{f.name}")


def slime_args(balance_by_flops: bool, cap: int) -> object:
    """A 7B-like dense model (Qwen2-7B shapes) and a dynamic-batch FLOPs schedule."""
    return types.SimpleNamespace(
        micro_batch_size=1, use_dynamic_batch_size=True, max_tokens_per_gpu=cap,
        balance_data=True, balance_by_flops=balance_by_flops, hidden_size=3584,
        num_attention_heads=28, num_query_groups=4, vocab_size=152064,
        ffn_hidden_size=18944, num_experts=None, num_layers=28, kv_channels=128,
    )  # fmt: skip


def slime_rows(wl, lens, dp, cap, s_orig, repeat):
    """slime's FLOPs schedule, both flavours: heaviest rank FLOPs and per-rank counts."""
    from seqbalance.compat import slime as c_slime

    n = lens.shape[0]
    tp = {"dp_size": dp, "cp_size": 1, "vpp_size": 1, "microbatch_group_size_per_vp_stage": 1}
    out = []
    for by_flops in (False, True):
        a = slime_args(by_flops, cap)
        flops = c_slime.sequence_fwd_flops(lens, a)
        lens_list, rid = lens.tolist(), list(range(n))

        def call(mod):
            return lambda: mod.build_dp_schedule(a, tp, lens_list, global_batch_size=n,
                                                 rollout_indices=rid)  # fmt: skip

        t_o, r_o = best_time(call(s_orig), repeat=repeat, budget_s=60, fast_repeat=FAST_REPEAT)
        t_s, r_s = best_time(call(c_slime), repeat=repeat, budget_s=60, fast_repeat=FAST_REPEAT)

        def heavy(r):
            return max(float(flops[np.asarray(p, dtype=np.int64)].sum()) for p in r[0])

        def over(r):
            bad = 0
            for part, mbs in zip(r[0], r[1]):
                for mb in mbs:
                    toks = int(lens[[part[i] for i in mb]].sum())
                    bad += toks > cap and len(mb) > 1
            return bad

        out.append({
            "call": "slime dp_schedule" + (" by_flops" if by_flops else ""), "workload": wl,
            "n": n, "dp": dp, "parts_orig": r_o[2][0], "parts_sb": r_s[2][0],
            "heaviest_orig": heavy(r_o), "heaviest_sb": heavy(r_s),
            "sb/orig": heavy(r_s) / heavy(r_o), "over_cap_orig": over(r_o),
            "over_cap_sb": over(r_s), "t_orig_s": t_o, "t_sb_s": t_s, "speedup": t_o / t_s,
        })  # fmt: skip
    return out


def openrlhf_dynamic(mod, lens: list[int], cap: int) -> list[list[int]]:
    """OpenRLHF's replay-buffer dynamic batch on one rank: minimum count, then KK."""
    m = mod.get_minimum_num_micro_batch_size(lens, cap, 1, 1)
    return mod.get_seqlen_balanced_partitions(lens, m, equal_size=False)


def fresh_partition(mod, lens: np.ndarray, m: int) -> list[list[int]]:
    """The drop-in's partition at count ``m``, computed: the partition the count search
    kept (used when OpenRLHF's next call asks for that count) is dropped first."""
    mod._last_fit = None
    return mod.get_seqlen_balanced_partitions(lens, m, False)


def openrlhf_args(dp: int) -> object:
    """The ``args`` OpenRLHF's ``balance_experiences`` reads: ``dp`` actors, one node."""
    return types.SimpleNamespace(actor=types.SimpleNamespace(num_nodes=1, num_gpus_per_node=dp),
                                 ds=types.SimpleNamespace(ring_attn_size=1,
                                                          tensor_parallel_size=1))  # fmt: skip


def openrlhf_balance(mod, exps: list[object], dp: int) -> list[list[int]]:
    """``balance_experiences`` of a rollout (:func:`experiences`) over dp actors; returns
    each actor's sample ids (carried in ``prompts``, which split and merge keep)."""
    return [b.prompts for b in mod.balance_experiences(exps, openrlhf_args(dp))]


class Sample:
    """One split sample as OpenRLHF's split gives it, for the balancing-only row: its
    ``total_length`` a 0-d tensor (what the original sorts by) and its id."""

    def __init__(self, total_length: object, sid: int) -> None:
        self.total_length, self.sid = total_length, sid


class PreSplit:
    """A batch whose split is done already: the (B,) ``total_length`` tensor and the
    samples (split returns them as they are; merge returns their ids)."""

    def __init__(self, total_length: object, samples: list[Sample]) -> None:
        self.total_length, self.samples = total_length, samples


def presplit(lens: np.ndarray, batches: int = 8) -> tuple[list[PreSplit], object]:
    """The rollout of :func:`experiences` as :class:`PreSplit` batches, and the module
    holding their split and merge helpers (where the drop-in looks them up)."""
    import torch

    mod = types.ModuleType("bench_presplit")
    mod.split_experience_batch = lambda b: b.samples
    mod.make_experience_batch = lambda items: [it.sid for it in items]
    sys.modules[mod.__name__] = mod
    PreSplit.__module__ = mod.__name__
    out = []
    for c in np.array_split(np.arange(lens.shape[0]), batches):
        t = torch.as_tensor(lens[c])
        out.append(PreSplit(t, [Sample(t[j], int(i)) for j, i in enumerate(c)]))
    return out, mod


def balance_only(exp_mod, mod, batches: list[PreSplit], presplit_mod, dp: int) -> list:
    """``mod.balance_experiences`` on :func:`presplit` batches; for the original (``mod``
    is OpenRLHF's module) its split and merge names point at the trivial ones meanwhile."""
    args = openrlhf_args(dp)
    if mod is not exp_mod:
        return mod.balance_experiences(batches, args)
    names = ("split_experience_batch", "make_experience_batch")
    saved = [getattr(exp_mod, k) for k in names]
    for k in names:
        setattr(exp_mod, k, getattr(presplit_mod, k))
    try:
        return exp_mod.balance_experiences(batches, args)
    finally:
        for k, v in zip(names, saved):
            setattr(exp_mod, k, v)


def verl_dynamic(orig, lens: list[int], cap: int) -> list[list[int]]:
    """The micro-batching loop of verl 0.9 rearrange_micro_batches, one rank, no dp_group."""
    work = [24576 * x + x * x for x in lens]
    m = min(len(lens), -(-sum(lens) // cap))
    while True:
        parts = orig.get_seqlen_balanced_partitions(work, m, equal_size=False)
        if all(sum(lens[i] for i in p) <= cap for p in parts):
            return parts
        m += 1


COLUMNS = [
    "call", "workload", "n", "dp", "parts_orig", "parts_sb", "heaviest_orig", "heaviest_sb",
    "sb/orig", "step sb/orig", "over_cap_orig", "over_cap_sb", "t_orig_s", "t_sb_s", "speedup",
]  # fmt: skip

#: verl's per-token linear workload (its 7B estimate is 24576 L + L**2).
_LINEAR = 24576
# Calls under a second are timed up to this many times (both sides): best of 2 let one
# noisy moment on a shared 2-core VM turn a 0.12 s call into 0.23 s (slime, rl-math).
FAST_REPEAT = 7


class _TimeLimit(Exception):
    pass


def time_original(fn, repeat: int, limit_s: float) -> tuple[float, object]:
    """Best time of ``fn`` (the original) and its result, or ``(limit_s, None)`` when one
    call runs past ``limit_s`` (a SIGALRM interrupts the pure-Python loops of the
    originals): the time is then a lower bound."""
    import signal

    def stop(signum, frame):
        raise _TimeLimit

    def once():
        signal.setitimer(signal.ITIMER_REAL, limit_s)  # per call: repeats may add up
        try:
            return fn()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    old = signal.signal(signal.SIGALRM, stop)
    try:
        return best_time(once, repeat=repeat, budget_s=60.0, fast_repeat=FAST_REPEAT)
    except _TimeLimit:
        return limit_s, None
    finally:
        signal.signal(signal.SIGALRM, old)


def row(call, wl, n, dp, cap, orig, ours_fn, lens, weight, repeat, c0_tokens=None):
    """One table row; with ``c0_tokens``, also the step-time ratio of the micro-batches.

    ``orig`` is the original's ``(time, parts)`` (see :func:`time_original`); parts None
    means it ran past the time limit (the time is the limit): the row then gives a lower
    bound on the speed-up (``speedup_at_least``) and no quality figures.
    """
    t_o, p_o = orig
    t_s, p_s = best_time(ours_fn, repeat=repeat, budget_s=60, fast_repeat=FAST_REPEAT)

    def heavy(parts):
        return max(float(weight[np.asarray(p, dtype=np.int64)].sum()) for p in parts)

    def over(parts):
        if not cap:
            return 0
        return sum(int(lens[np.asarray(p, dtype=np.int64)].sum()) > cap for p in parts)

    def step(parts):  # one rank's micro-batches, one after the other
        work = _LINEAR * lens.astype(np.float64) + lens.astype(np.float64) ** 2
        return sum(_LINEAR * c0_tokens + float(work[np.asarray(p, dtype=np.int64)].sum())
                   for p in parts)  # fmt: skip

    out = {"call": call, "workload": wl, "n": n, "dp": dp, "parts_sb": len(p_s),
           "heaviest_sb": heavy(p_s), "over_cap_sb": over(p_s), "t_sb_s": t_s}  # fmt: skip
    if p_o is None:  # the original ran past the limit
        return {**out, "t_orig_s": f">{t_o:g}", "speedup": f">{t_o / t_s:.0f}",
                "speedup_at_least": t_o / t_s, "_parts_orig": None}  # fmt: skip
    return {
        **out, "parts_orig": len(p_o), "heaviest_orig": heavy(p_o),
        "sb/orig": heavy(p_s) / heavy(p_o),
        "step sb/orig": "" if c0_tokens is None else step(p_s) / step(p_o),
        "over_cap_orig": over(p_o), "t_orig_s": t_o, "speedup": t_o / t_s, "_parts_orig": p_o,
    }  # fmt: skip


def rank_rows(wl, n, dp, cap, rank, repeat, c0, limit, v_orig, a_orig, o_orig):
    """The per-rank calls on one rank's ``n`` sequences ``rank`` (micro-batch rows); an
    original's call may run ``limit`` seconds."""
    from seqbalance.compat import openrlhf as c_orlhf

    rank_list = rank.tolist()
    rank_work = _LINEAR * rank.astype(np.float64) + rank.astype(np.float64) ** 2
    rows = []
    # verl's loop, timed once for both drop-in rows (they answer the same call).
    verl = time_original(lambda: verl_dynamic(v_orig, rank_list, cap), repeat, limit)
    rows.append(row(
        "verl dynamic mbs", wl, n, 1, cap, verl,
        lambda: c_verl.micro_batches_of_lengths(rank, cap), rank, rank_work, repeat, c0,
    ))  # fmt: skip
    # The drop-in asked for verl's own count: the balance of the two at an equal number of
    # micro-batches.
    rows.append(row(
        "verl dynamic mbs, match_framework_count", wl, n, 1, cap, verl,
        lambda: c_verl.micro_batches_of_lengths(rank, cap, match_framework_count=True),
        rank, rank_work, repeat, c0,
    ))  # fmt: skip
    for name in ("ffd_allocate", "kk_allocate"):
        orig = time_original(lambda: getattr(a_orig, name)(rank_list, cap, 1), repeat, limit)
        rows.append(row(
            f"areal {name}", wl, n, 1, cap, orig,
            lambda: getattr(c_areal, name)(rank, cap, 1),
            rank, rank.astype(np.float64), repeat, c0,
        ))  # fmt: skip
    orig = time_original(lambda: openrlhf_dynamic(o_orig, rank_list, cap), repeat, limit)
    rows.append(row(
        "openrlhf dynamic mbs", wl, n, 1, cap, orig,
        lambda: openrlhf_dynamic(c_orlhf, rank, cap),
        rank, rank.astype(np.float64), repeat, c0,
    ))  # fmt: skip
    if orig[1] is not None:
        m_orl = len(orig[1])
        orig = time_original(
            lambda: o_orig.get_seqlen_balanced_partitions(rank_list, m_orl, False), repeat, limit
        )
        rows.append(row(
            "openrlhf dynamic mbs, its count", wl, n, 1, cap, orig,
            lambda: fresh_partition(c_orlhf, rank, m_orl),
            rank, rank.astype(np.float64), repeat, c0,
        ))  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ext", default="/work/ext9")
    ap.add_argument("--slime", default="/tmp/i9fw/src", help="slime source checkout")
    ap.add_argument("--openrlhf", default="/tmp/i9fw/orlhf", help="OpenRLHF source checkout")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument(
        "--rank-n",
        type=int,
        nargs="*",
        default=None,
        help="sizes of the per-rank calls besides n / dp (default 8192: the speed "
        "comparison is made for calls of n >= 8,192)",
    )
    ap.add_argument(
        "--orig-limit",
        type=float,
        default=600.0,
        help="seconds one call of an original may run before it is stopped",
    )
    ap.add_argument(
        "--mb-overhead-tokens",
        type=float,
        default=256.0,
        help="per-micro-batch overhead c0, in tokens of linear work (step column)",
    )
    ap.add_argument("--json", default="bench/results/compat.json")
    args = ap.parse_args()
    v_orig, a_orig = load_originals(args.ext)
    s_orig, o_orig, o_exp = load_slime_openrlhf(args.slime, args.openrlhf)
    from seqbalance.compat import openrlhf as c_orlhf

    sizes = [1024] if args.quick else [1024, 8192]
    rank_sizes = args.rank_n if args.rank_n is not None else ([] if args.quick else [8192])
    dp, cap = 8, 32768
    repeat = 1 if args.quick else 2
    c0 = args.mb_overhead_tokens
    limit = args.orig_limit
    rows = []
    for wl in ("rl-math", "sft-chat", "long-mix"):
        for n in sizes:
            start = len(rows)
            lens = sb.workloads.lengths(wl, n, seed=0)
            lens = np.minimum(lens, cap)  # both sides reject sequences above the cap
            work = (24576 * lens + lens.astype(np.int64) ** 2).astype(np.float64)
            wl_list = work.astype(np.int64).tolist()
            orig = time_original(
                lambda: v_orig.get_seqlen_balanced_partitions(wl_list, dp, equal_size=True),
                repeat,
                limit,
            )
            rows.append(row(
                "verl balance_batch", wl, n, dp, 0, orig,
                lambda: c_verl.get_seqlen_balanced_partitions(work, dp, True),
                lens, work, repeat,
            ))  # fmt: skip
            # One rank's share of the rollout.
            rows += rank_rows(wl, n // dp, dp, cap, lens[: n // dp].astype(np.int64), repeat, c0,
                              limit, v_orig, a_orig, o_orig)  # fmt: skip
            check_experience_gather(o_exp, c_orlhf, lens, dp)
            for width in (EXPERIENCE_WIDTH, EXPERIENCE_WIDTH_WIDE):
                exps = experiences(o_exp, lens, width=width)  # reused: calls keep them
                orig = time_original(lambda: openrlhf_balance(o_exp, exps, dp), repeat, limit)
                rows.append(row(
                    f"openrlhf balance_experiences, {width}-token rows", wl, n, dp, 0, orig,
                    lambda: openrlhf_balance(c_orlhf, exps, dp),
                    lens, lens.astype(np.float64), repeat,
                ))  # fmt: skip
            batches, pre = presplit(lens)
            orig = time_original(lambda: balance_only(o_exp, o_exp, batches, pre, dp), repeat,
                                 limit)  # fmt: skip
            rows.append(row(
                "openrlhf balance_experiences, balancing only", wl, n, dp, 0, orig,
                lambda: balance_only(o_exp, c_orlhf, batches, pre, dp),
                lens, lens.astype(np.float64), repeat,
            ))  # fmt: skip
            rows.extend(slime_rows(wl, lens, dp, cap, s_orig, repeat))
            print_table(rows[start:], COLUMNS)
        for rn in rank_sizes:
            # One rank holding rn sequences (a large per-rank batch): the first rn of a
            # rollout of dp * rn, as the n / dp rows above take the first n / dp.
            start = len(rows)
            lens = np.minimum(sb.workloads.lengths(wl, dp * rn, seed=0), cap)
            rows += rank_rows(wl, rn, dp, cap, lens[:rn].astype(np.int64), repeat, c0,
                              limit, v_orig, a_orig, o_orig)  # fmt: skip
            print_table(rows[start:], COLUMNS)
    for r in rows:
        r.pop("_parts_orig", None)
    print_table(rows, COLUMNS)
    write_json(args.json, {"machine": machine_info(), "mb_overhead_tokens": c0,
                           "orig_limit_s": limit, "rows": rows})  # fmt: skip


if __name__ == "__main__":
    main()
