"""``seqbalance compare --cp-size N``: context-parallel plans side by side.

With ``--cp-size`` above 1, ``compare`` plans a ``dp x cp`` mesh (``--max-tokens`` per GPU)
with seqbalance (``--cp dynamic`` by default, or ``static``) and with the two CP baselines
(``static-cp``, ``megatron-cp``), all priced by one
:class:`~seqbalance.costs.context_parallel.ContextParallelCost`, and prints one table per
input. ``--demo --cp-size N`` does this on built-in long-context workloads.

With ``--cp static --pp-size P`` (a ``dp x pp x cp`` mesh: each replica a pipeline of CP
rings) every plan runs through the same pipeline model and simulator
(:mod:`seqbalance.planning.cp_pipeline`): seqbalance's pipelined plan against the
``static-cp`` plan made without the pipeline (at the schedule's count multiple) and
``verl-static-cp`` (:func:`~seqbalance.planning.cp_baselines.verl_static_cp`), each in its
own slot order. ``megatron-cp`` is left out: dynamic CP gives a stage's GPUs different
slots.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from .. import workloads
from ..partitioning.stats import relative_gap
from ..planning.cp_baselines import CP_BASELINES
from ..planning.cp_plans import CP_MODES, CPPlan
from ..planning.planner import plan_cp

__all__ = ["CP_DEMO_SETUPS", "add_arguments", "cp_cost_of", "run"]


@dataclass(frozen=True)
class CPDemoSetup:
    """One workload of ``compare --demo --cp-size N``: ``dp`` replicas of N GPUs."""

    workload: str
    n: int
    dp: int
    max_tokens: int
    bandwidth: float
    seed: int = 0


# One fast-link and one slow-link case per workload; every sequence fits at cp_size >= 8.
CP_DEMO_SETUPS: tuple[CPDemoSetup, ...] = (
    CPDemoSetup("long-context", 2048, 4, 32768, 4e11),
    CPDemoSetup("long-context", 2048, 4, 32768, 2.5e10),
    CPDemoSetup("long-mix", 4096, 4, 16384, 4e11),
)


#: Defaults of the CP options that act only with ``--cp-size > 1`` (one place for the
#: parser and for :func:`stray_cp_options`, which refuses them when set without it).
_CP_DEFAULTS: dict[str, Any] = {
    "cp": "dynamic",
    "cp_bandwidth": None,
    "cp_overlap": 0.5,
    "cost_per_second": None,
    "kv_bytes_per_token": None,
    "cp_comm_passes": 3.0,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--cp-*`` options of ``plan`` and ``compare``."""
    g = p.add_argument_group("context parallelism (plans a dp x cp mesh; --max-tokens per GPU)")
    g.add_argument(
        "--cp-size",
        type=int,
        default=1,
        metavar="C",
        help="GPUs per data-parallel replica (a power of two); > 1 plans a dp x cp mesh",
    )
    g.add_argument(
        "--cp",
        choices=CP_MODES,
        default=_CP_DEFAULTS["cp"],
        help="seqbalance's CP mode: one degree for all (static) or per sequence (dynamic, default)",
    )
    g.add_argument(
        "--cp-bandwidth",
        type=float,
        default=_CP_DEFAULTS["cp_bandwidth"],
        metavar="B",
        help="bytes/s per GPU on the CP ring (e.g. 4e11 NVLink, 2.5e10 inter-node); "
        "default: communication is free (demo: per workload)",
    )
    g.add_argument(
        "--cp-overlap",
        type=float,
        default=_CP_DEFAULTS["cp_overlap"],
        metavar="F",
        help="fraction of a ring step's attention that hides its transfer (default 0.5)",
    )
    g.add_argument(
        "--cost-per-second",
        type=float,
        default=_CP_DEFAULTS["cost_per_second"],
        metavar="X",
        help="cost units per second: achieved FLOP/s for a FLOP cost (default "
        "4e14), 1 for a cost in seconds",
    )
    g.add_argument(
        "--kv-bytes-per-token",
        type=float,
        default=_CP_DEFAULTS["kv_bytes_per_token"],
        metavar="X",
        help="K/V bytes one token sends over all layers from one GPU (default: from "
        "--model's architecture, the heads a GPU holds under --sp-size; needed with "
        "--cp-bandwidth and a --cost)",
    )
    g.add_argument(
        "--cp-comm-passes",
        type=float,
        default=_CP_DEFAULTS["cp_comm_passes"],
        metavar="N",
        help="times the K/V volume crosses the ring per step (default 3, training: "
        "forward K/V, backward K/V and dK/dV; 1 for a forward-only pass)",
    )


def stray_cp_options(args: argparse.Namespace) -> list[str]:
    """The ``--cp-*`` options set away from their defaults (they act with ``--cp-size > 1``
    only, so ``compare`` refuses them without it rather than drop them)."""
    from .checks import stray_options

    return stray_options(args, _CP_DEFAULTS)


def _bandwidth_source(args: argparse.Namespace) -> str:
    """Where the CP bandwidth came from, for messages: the flag, or ``--demo``'s own."""
    return "--cp-bandwidth" if args.cp_bandwidth is not None else "the demo's CP bandwidths"


def cp_cost_of(
    args: argparse.Namespace, unit: str, bandwidth: float | None, model: Any = None
) -> dict[str, Any]:
    """The ``cp_cost`` dict of the ``--cp-*`` options, for a cost in ``unit`` (``model``:
    the cost, whose own rate a UlyssesCost keeps)."""
    from .ulysses_options import rate_of

    cps = rate_of(args, unit, bandwidth, _bandwidth_source(args),
                  sized=args.kv_bytes_per_token is not None, model=model)  # fmt: skip
    out: dict[str, Any] = {"cost_per_second": cps, "overlap": args.cp_overlap}
    if bandwidth is not None:
        out["bandwidth"] = bandwidth
        out["comm_passes"] = args.cp_comm_passes
        if args.kv_bytes_per_token is not None:
            out["kv_bytes_per_token"] = args.kv_bytes_per_token
        elif unit == "tok":
            out["kv_bytes_per_token"] = 0.0  # a token count knows no K/V size: comm is free
    return out


def _row(name: str, p: CPPlan, ref: dict[str, float]) -> dict[str, Any]:
    sim = p.simulate()
    v = p.violations()
    deg = p.degrees()
    return {
        "strategy": name,
        "step_time": sim.step_time,
        "vs_static": sim.step_time / ref["static-cp"] if ref.get("static-cp") else None,
        "vs_megatron": sim.step_time / ref["megatron-cp"] if ref.get("megatron-cp") else None,
        "lower_bound": sim.lower_bound,
        "gap": relative_gap(sim.step_time, sim.lower_bound),
        "slots": p.num_micro_batches,
        "over_capacity": v["over_capacity"],
        "empty": v["empty"],
        "degrees": {int(d): int((deg == d).sum()) for d in np.unique(deg).tolist()},
        "notes": list(p.notes),
    }


def _shared_kwargs(args: argparse.Namespace, cost: Any, bandwidth: float | None) -> dict[str, Any]:
    """The planning keywords seqbalance and every baseline of a table share."""
    return {
        "cp_size": args.cp_size,
        "cost": cost.model,
        "cp_cost": cp_cost_of(args, cost.unit, bandwidth, cost.model),
        "sync": args.sync,
    }


def _compare_one(lengths, dp, cap, args, cost, bandwidth) -> list[dict[str, Any]]:
    kw = _shared_kwargs(args, cost, bandwidth)
    plans = {
        "seqbalance": plan_cp(
            lengths,
            dp,
            cap,
            cp=args.cp,
            allow_empty=args.allow_empty,  # as `plan --cp-size` would plan it
            min_micro_batches=args.min_micro_batches,
            micro_batch_multiple=args.micro_batch_multiple,
            **kw,
        )
    }
    for name, fn in CP_BASELINES.items():
        plans[name] = fn(lengths, dp, cap, **kw)
    ref = {name: p.simulate().step_time for name, p in plans.items()}
    return [_row(name, p, ref) for name, p in plans.items()]


def _pipeline_row(name: str, p: CPPlan, ref: float | None) -> dict[str, Any]:
    sim = p.simulate_pipeline()
    v = p.violations()
    return {
        "strategy": name,
        "step_time": sim.step_time,
        "vs_static": sim.step_time / ref if ref else None,
        "lower_bound": sim.lower_bound,
        "gap": sim.gap,
        "bubble": sim.bubble_fraction,
        "slots": p.num_micro_batches,
        "over_capacity": v["over_capacity"],
        "empty": v["empty"],
        "notes": list(p.notes),
    }


def _compare_pipelined(lengths, dp, cap, args, cost, bandwidth) -> list[dict[str, Any]]:
    """``--cp static --pp-size P``: every plan as the same pipeline (module docstring)."""
    from ..planning.cp_baselines import verl_static_cp
    from ..planning.cp_pipeline import as_pipeline
    from ..planning.planner import plan
    from ._common import _pp_kwargs
    from .flags import shown

    kw = _shared_kwargs(args, cost, bandwidth)
    # the plan `seqbalance plan` makes (plan() also searches pipeline counts)
    ours = plan(lengths, dp, cap, cp="static", allow_empty=args.allow_empty,
                min_micro_batches=args.min_micro_batches,
                micro_batch_multiple=args.micro_batch_multiple,
                extra_micro_batches=args.extra_micro_batches, **_pp_kwargs(args),
                **kw)  # fmt: skip
    setup = ours.pipeline
    mult = setup.spec.count_multiple  # what the schedule needs of any plan it runs
    plans = {"seqbalance": ours}
    skipped = []
    try:  # as the caller allows empty slots, so that the two plans differ in their planning only
        flat = plan_cp(lengths, dp, cap, cp="static", allow_empty=args.allow_empty,
                       micro_batch_multiple=mult, **kw)  # fmt: skip
        plans["static-cp"] = as_pipeline(flat, setup)
    except ValueError as exc:
        skipped.append(f"static-cp ({shown(exc)})")
    verl = verl_static_cp(lengths, dp, cap, **kw)
    if verl.num_micro_batches % mult == 0:
        plans["verl-static-cp"] = as_pipeline(verl, setup)
    else:  # verl would raise its count (num_batches_divided_by), which it does not model
        skipped.append(
            f"verl-static-cp ({verl.num_micro_batches} slots, which the {setup.spec.schedule} "
            f"schedule cannot run: not a multiple of {mult})"
        )
    ref = plans["static-cp"].simulate_pipeline().step_time if "static-cp" in plans else None
    rows = [_pipeline_row(name, p, ref) for name, p in plans.items()]
    if skipped:
        rows[0]["notes"] = [*rows[0]["notes"], "left out: " + "; ".join(skipped)]
    return rows


def _print_pipelined(rows: list[dict[str, Any]], unit: str, out: TextIO) -> None:
    from ._common import _si, _table

    headers = ["strategy", "step time", "vs static", "gap", "bubble", "slots", "over cap",
               "empty"]  # fmt: skip
    cells = [
        [
            r["strategy"],
            _si(r["step_time"], unit),
            f"{r['vs_static']:.3f}" if r["vs_static"] else "-",
            f"{r['gap']:+.1%}",
            f"{r['bubble']:.1%}",
            str(r["slots"]),
            str(r["over_capacity"]),
            str(r["empty"]),
        ]
        for r in rows
    ]
    _table(headers, cells, out)


def _print(rows: list[dict[str, Any]], unit: str, out: TextIO) -> None:
    from ._common import _si, _table

    headers = [
        "strategy",
        "step time",
        "vs static",
        "vs megatron",
        "gap",
        "slots",
        "over cap",
        "empty",
        "CP degrees",
    ]
    cells = []
    for r in rows:
        cells.append(
            [
                r["strategy"],
                _si(r["step_time"], unit),
                f"{r['vs_static']:.3f}" if r["vs_static"] else "-",
                f"{r['vs_megatron']:.3f}" if r["vs_megatron"] else "-",
                f"{r['gap']:+.1%}",
                str(r["slots"]),
                str(r["over_capacity"]),
                str(r["empty"]),
                " ".join(f"{d}:{c}" for d, c in r["degrees"].items()),
            ]
        )
    _table(headers, cells, out)


def run(args: argparse.Namespace, out: TextIO) -> int:
    """``compare`` with ``--cp-size > 1`` (module docstring)."""
    from ._common import UserError, _demo_cost, _load_cost, _pp_kwargs, _read_inputs
    from .ulysses_options import group_capacity, wrap_cost

    # The CP baselines compared here do not honour these (--padded is refused before):
    # say so rather than compare plans made without them.
    piped = bool(_pp_kwargs(args))
    for flag, used in (
        ("--size", args.size != "free"),
        # a pipeline trades micro-batches for bubble: seqbalance may take more counts there
        ("--extra-micro-batches", args.extra_micro_batches != 0 and not piped),
    ):
        if used:
            raise UserError(
                f"compare --cp-size does not take {flag}: the CP baselines it compares "
                "against do not honour it; plan --cp-size C --cp static does"
            )
    runs = []
    sp = f" x sp={args.sp_size}" if args.sp_size > 1 else ""  # each CP rank a Ulysses group
    if piped:
        v = f", v={args.virtual_stages}" if args.virtual_stages > 1 else ""
        sp += f" x pp={args.pp_size} ({args.schedule}{v})"
    if args.demo:
        spec = args.model or args.cost
        cost = wrap_cost(_demo_cost() if spec is None else _load_cost(spec), args)
        # Before anything is printed: every demo setup prices its ring.
        cp_cost_of(args, cost.unit, args.cp_bandwidth or CP_DEMO_SETUPS[0].bandwidth,
                   cost.model)  # fmt: skip
        for note in cost.notes:
            print(note, file=out)
        print(
            f"seqbalance compare --demo --cp-size {args.cp_size}: simulated {args.sync} step "
            f"per CP strategy; cost = {cost.label}; overlap {args.cp_overlap}; ratios are "
            "step / the baseline's step; gap = step / CP lower bound - 1"
            + (" (pipelines: the pipeline step and its bound for the plan's own slots)"
               if piped else ""),
            file=out,
        )
        for s in CP_DEMO_SETUPS:
            lengths = workloads.lengths(s.workload, s.n, s.seed)
            bw = s.bandwidth if args.cp_bandwidth is None else args.cp_bandwidth
            header = (
                f"{s.workload} ({workloads.describe(s.workload)}): n={s.n}, dp={s.dp} x "
                f"cp={args.cp_size}{sp}, max_tokens={s.max_tokens}/GPU, bandwidth={bw:.3g} B/s"
            )
            runs.append((header, lengths, s.dp, s.max_tokens, bw, s.workload))
    else:
        missing = [
            f for f, v in (("--dp", args.dp), ("--max-tokens", args.max_tokens)) if v is None
        ]
        if missing:
            raise UserError(f"compare LENGTHS needs {' and '.join(missing)}")
        cost = wrap_cost(_load_cost(args.model or args.cost), args)
        lengths, groups = _read_inputs(args)
        if groups is not None:
            raise UserError(
                "compare --cp-size does not take --groups-column: the CP baselines it "
                "compares against do not honour it; plan --cp-size C --cp static does"
            )
        header = (
            f"{args.lengths}: n={lengths.shape[0]}, dp={args.dp} x cp={args.cp_size}{sp}, "
            f"max_tokens={args.max_tokens}/GPU, sync={args.sync}, cost={cost.label}"
        )
        own = [
            flag
            for flag, used in (
                ("--min-micro-batches", args.min_micro_batches != 1),
                ("--micro-batch-multiple", args.micro_batch_multiple != 1),
                ("--extra-micro-batches", args.extra_micro_batches != 0),
            )
            if used
        ]
        if own:
            header += f" ({', '.join(own)} apply to seqbalance only; the baselines ignore them)"
        runs.append(
            (header, lengths, args.dp, args.max_tokens, args.cp_bandwidth, str(args.lengths))
        )
    setups = []
    for header, lengths, dp, cap, bw, label in runs:
        group_cap = group_capacity(args, cap)  # cap is a GPU's; a Ulysses group holds sp x
        compare_one = _compare_pipelined if piped else _compare_one
        rows = compare_one(lengths, dp, group_cap, args, cost, bw)
        group = {"sp_size": args.sp_size, "group_max_tokens": group_cap} if args.sp_size > 1 else {}
        print("", file=out)
        print(header, file=out)
        (_print_pipelined if piped else _print)(rows, cost.unit, out)
        if piped:
            for note in rows[0]["notes"]:
                if note.startswith("left out: "):
                    print(note, file=out)
        setups.append(
            {
                "input": label,
                "n": int(lengths.shape[0]),
                "dp": dp,
                "cp_size": args.cp_size,
                "max_tokens": cap,  # a GPU's
                **group,
                "bandwidth": bw,
                "sync": args.sync,
                "cost": cost.label,
                **({"pipeline": _pp_kwargs(args)} if piped else {}),
                "results": rows,
            }
        )
    if args.json is not None:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"format": "seqbalance.compare-cp/1", "setups": setups}, fh, indent=1)
        print(f"\nwrote {args.json}", file=sys.stderr)
    if args.plot is not None:
        print("note: --plot is not drawn for CP plans yet", file=sys.stderr)
    return 0
