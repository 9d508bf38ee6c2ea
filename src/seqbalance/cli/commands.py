"""The ``seqbalance`` command line: ``plan``, ``compare``, ``refit`` and ``calibrate``.

Only the standard library and numpy are needed; ``rich`` (tables) and ``matplotlib``
(``compare --plot``) are used when installed (``pip install ".[cli]"`` in a checkout).
User errors (bad arguments, unreadable files, infeasible plans) print one ``error:`` line
to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence, TextIO, cast

import numpy as np

from .. import workloads
from .._notes import NotedError
from ..partitioning.stats import relative_gap
from ..planning.baselines import BASELINES
from ..planning.planner import SIZE_RULES, plan
from ..planning.plans import Plan
from ..planning.request import PlanSpec
from ..planning.simulation import SYNC_MODELS
from ._common import (
    DEMO_COST,
    _demo_cost,
    _load_cost,
    _pp_kwargs,
    _read_inputs,
    _say,
    _si,
    _stray_pp_options,
    _table,
)
from .checks import (
    FileError,
    UserError,
    check_numbers,
    check_outputs,
    check_sizes,
    refuse_stray,
    refuse_unpriced,
)
from .flags import shown, words_for
from .ulysses_options import group_capacity, wrap_cost

if TYPE_CHECKING:
    from ..planning.cp_plans import CPPlan

__all__ = ["DEMO_SETUPS", "main"]

PROG = "seqbalance"


@dataclass(frozen=True)
class DemoSetup:
    """One built-in workload of ``compare --demo``: every sequence fits ``max_tokens``."""

    workload: str
    n: int
    dp: int
    max_tokens: int
    seed: int = 0


# Sizes chosen so every sequence fits the capacity and the whole demo runs in about a second.
DEMO_SETUPS: tuple[DemoSetup, ...] = (
    DemoSetup("rl-math", 1024, 8, 32768),
    DemoSetup("sft-chat", 4096, 16, 32768),
    DemoSetup("bimodal", 2048, 8, 32768),
    DemoSetup("long-mix", 16384, 16, 131072),
)


def _plan_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "sync": args.sync,
        "size": args.size,
        "min_micro_batches": args.min_micro_batches,
        "micro_batch_multiple": args.micro_batch_multiple,
        "padded": args.padded,
        "allow_empty": args.allow_empty,
        "extra_micro_batches": args.extra_micro_batches,
    } | _pp_kwargs(args)


def _check_sizes(
    lengths: np.ndarray, groups: np.ndarray | None, dp: int, cap: int, args: argparse.Namespace,
    unit: str = "rank",
) -> None:
    check_sizes(
        lengths,
        groups,
        dp,
        cap,
        cap_flag="--sp-size x --max-tokens" if args.sp_size > 1 else "--max-tokens",
        min_micro_batches=args.min_micro_batches,
        micro_batch_multiple=args.micro_batch_multiple,
        size=args.size,
        allow_empty=args.allow_empty,
        unit=unit,
    )


# ---- plan ------------------------------------------------------------------------------


def _check_parallel_options(args: argparse.Namespace, command: str) -> None:
    """Refuse the ``--cp*`` options without ``--cp-size > 1``, the pipeline ones without
    ``--pp-size > 1``, and the two together."""
    from .ulysses_options import check_options

    check_options(args)
    if args.cp_size == 1:
        from .cp_compare import stray_cp_options

        stray = stray_cp_options(args)
        if "--cost-per-second" in stray:  # it prices the all-to-all too
            if args.sp_size == 1:
                raise UserError(
                    "--cost-per-second only applies with --cp-size > 1 or --sp-size > 1 (it "
                    "prices their communication); pass one of them, or drop it"
                )
            stray.remove("--cost-per-second")
        refuse_stray(stray, "--cp-size", "C", "context parallelism")
        if args.pp_size == 1:  # else the planner checks them together
            refuse_stray(_stray_pp_options(args), "--pp-size", "P", "pipeline parallelism")
    elif args.pp_size == 1 and _stray_pp_options(args):  # they would do nothing
        refuse_stray(_stray_pp_options(args), "--pp-size", "P", "pipeline parallelism")
    elif _pp_kwargs(args) and args.cp != "static":
        raise UserError(
            "--pp-size/--schedule/--virtual-stages/--pp-comm combine with --cp-size > 1 "
            "only under --cp static (pipeline stages that are CP rings; dynamic CP gives "
            "the GPUs of a stage different slots); pass --cp static"
        )
    elif args.padded:
        raise UserError(
            "--padded does not combine with --cp-size > 1: a CP piece is priced by its own "
            "tokens, never padded; drop one of the two"
        )
    elif command == "plan" and args.cp == "dynamic" and (rules := [flag for flag, used in (
        ("--groups-column", args.groups_column is not None),
        ("--size", args.size != "free"),
        ("--extra-micro-batches", args.extra_micro_batches != 0),
    ) if used]):  # fmt: skip
        raise UserError(
            f"{' and '.join(rules)} need{'s' if len(rules) == 1 else ''} --cp static with "
            "--cp-size > 1: dynamic CP (the "
            "default) shares one pool of GPUs between replicas, so rules on replicas and "
            "their micro-batches do not apply; pass --cp static"
        )
    elif args.cp_bandwidth is None and not getattr(args, "demo", False):  # the demo has its
        # bandwidths; without one the ring's transfers are free, and these would do nothing
        sizing = [flag for flag, used in (
            ("--kv-bytes-per-token", args.kv_bytes_per_token is not None),
            ("--cp-comm-passes", args.cp_comm_passes != 3.0),
        ) if used]  # fmt: skip
        refuse_unpriced(sizing, "the CP ring", "--cp-bandwidth")


def _check_static_cp_sizes(
    lengths: np.ndarray, groups: np.ndarray | None, cap: int, args: argparse.Namespace
) -> None:
    """:func:`_check_sizes` for ``--cp static``, before planning: its replicas are planned as
    ranks, with each sequence's largest piece (what one GPU holds) as its tokens. A piece
    above the capacity is left to the planner, whose message names the sequence."""
    from ..costs.context_parallel import largest_piece_tokens

    pieces = largest_piece_tokens(lengths, args.cp_size)
    if pieces.size and int(pieces.max()) > cap:
        return
    _check_sizes(pieces, groups, args.dp, cap, args, unit="replica")


def _cmd_plan(args: argparse.Namespace) -> int:
    check_numbers(args)
    check_outputs(args)
    _check_parallel_options(args, "plan")
    cost = wrap_cost(_load_cost(args.model or args.cost), args)
    cap = group_capacity(args, args.max_tokens)  # per Ulysses group (--max-tokens without)
    lengths, groups = _read_inputs(args)
    cp_kwargs: dict[str, Any] = {}
    if args.cp_size != 1:  # a dp x cp mesh; the planner checks what CP does not take
        from .cp_compare import cp_cost_of

        cp_kwargs = {"cp_size": args.cp_size, "cp": args.cp,
                     "cp_cost": cp_cost_of(args, cost.unit, args.cp_bandwidth,
                                           cost.model)}  # fmt: skip
        if args.cp == "static":
            _check_static_cp_sizes(lengths, groups, cap, args)
    else:
        _check_sizes(lengths, groups, args.dp, cap, args)
    for note in cost.notes:
        _say(note, sys.stderr)
    # the request as values, checked once (the rules across options are PlanSpec's)
    spec = PlanSpec.from_keywords(args.dp, cap, cost=cost.model,
                                  flat={"groups": groups, **_plan_kwargs(args), **cp_kwargs})
    p = plan(lengths, spec)
    text = p.to_json()
    if args.out in (None, "-"):
        sys.stdout.write(text + "\n")
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text)
    sim = p.simulate()
    used = p.microbatch_tokens()
    broken = {k: v for k, v in p.violations().items() if v}
    err = sys.stderr
    if cp_kwargs:
        degrees = np.asarray(cast("CPPlan", p).degrees())
        counts = " ".join(f"{d}:{int((degrees == d).sum())}" for d in np.unique(degrees))
        where = (
            f"{args.cp_size} GPUs x {p.num_micro_batches} slots of <= {p.max_tokens} tokens "
            "a GPU" if args.sp_size == 1 else
            f"{args.cp_size} Ulysses groups of {args.sp_size} GPUs x {p.num_micro_batches} "
            f"slots of <= {p.max_tokens} tokens a group, {args.max_tokens} a GPU"
        )  # fmt: skip
        print(
            f"{p.num_sequences} sequences -> {p.dp_size} replicas x {where} ({args.cp} CP; "
            f"sequences per CP degree {counts})",
            file=err,
        )
    elif args.sp_size > 1:
        print(
            f"{p.num_sequences} sequences -> {p.dp_size} groups x {args.sp_size} GPUs "
            f"(Ulysses) x {p.num_micro_batches} micro-batches of <= {p.max_tokens} tokens a "
            f"group, {args.max_tokens} a GPU (capacity minimum {p.min_micro_batches_bound()})",
            file=err,
        )
    else:
        print(
            f"{p.num_sequences} sequences -> {p.dp_size} ranks x {p.num_micro_batches} "
            f"micro-batches of <= {p.max_tokens} tokens (capacity minimum "
            f"{p.min_micro_batches_bound()})",
            file=err,
        )
    print(
        f"simulated {p.sync} step {_si(sim.step_time, cost.unit)} ({cost.label}), "
        f"{sim.gap:+.1%} vs lower bound, idle {sim.idle_fraction:.1%}, "
        f"fullest micro-batch {int(used.max()) if used.size else 0} tokens",
        file=err,
    )
    if p.pipeline is not None:
        pp = p.simulate_pipeline()
        spec = p.pipeline.spec
        print(
            f"pipeline: {spec.pp_size} stages, {spec.schedule}, simulated step "
            f"{_si(pp.step_time, cost.unit)}, {pp.gap:+.1%} vs pipeline bound, bubble "
            f"{pp.bubble_fraction:.1%}",
            file=err,
        )
    if broken:
        print(f"violations: {broken}", file=err)
    for note in p.notes:
        print(f"note: {shown(note)}", file=err)
    if args.out not in (None, "-"):
        print(f"wrote {args.out}", file=err)
    return 0


# ---- compare ---------------------------------------------------------------------------

PP_TABLE_NOTE = (
    "seqbalance plans for the pipeline step (the second table); the first table simulates "
    "no pipeline, where a baseline can come out ahead of it"
)
PADDED_NOTE = "planned by summed tokens, as its framework does, then padded to its longest"


def _as_padded(p: Plan) -> Plan:
    """The same micro-batches run padded: each costs and holds ``count x longest``.

    This is what a trainer that pads does with a baseline's token-budget plan (verl's
    dynamic batch size, for one, packs by real token counts and pads afterwards).
    """
    return Plan(
        p.micro_batches,
        p.lengths,
        max_tokens=p.max_tokens,
        costs=p.costs,
        per_microbatch=p.per_microbatch,
        padded=True,
        sync=p.sync,
        strategy=p.strategy,
        notes=(*p.notes, PADDED_NOTE),
        size=p.size,
        groups=p.groups,
    )


def _strategies(
    lengths: np.ndarray,
    dp: int,
    max_tokens: int,
    cost: Any,
    sync: str,
    groups: np.ndarray | None,
    plan_kwargs: dict[str, Any],
) -> dict[str, Plan]:
    plans = {"seqbalance": plan(lengths, dp, max_tokens, cost=cost, groups=groups, **plan_kwargs)}
    for name, fn in BASELINES.items():
        p = fn(lengths, dp, max_tokens, cost=cost, sync=sync)
        plans[name] = _as_padded(p) if plan_kwargs.get("padded") else p
    return plans


def _results(plans: dict[str, Plan], sync: str) -> list[dict[str, Any]]:
    sims = {name: p.simulate(sync=sync) for name, p in plans.items()}
    ref = sims["sequential"].step_time if "sequential" in sims else None
    # One yardstick for every row: the bound without size rule or groups, valid for all
    # plans (seqbalance's own plan may also carry a tighter, group-aware bound).
    bound = min(sim.lower_bound for sim in sims.values())
    out = []
    for name, p in plans.items():
        sim, v = sims[name], p.violations()
        counts = [len(rank) for rank in p.micro_batches]
        out.append(
            {
                "strategy": name,
                "step_time": sim.step_time,
                "speedup_vs_sequential": ref / sim.step_time if ref and sim.step_time else None,
                "lower_bound": bound,
                "gap": relative_gap(sim.step_time, bound),
                "micro_batches_per_rank": [min(counts, default=0), max(counts, default=0)],
                "over_capacity": v["over_capacity"],
                "empty": v["empty"],
                "unequal_counts": v["unequal_counts"],
                "idle_fraction": sim.idle_fraction,
                "notes": list(p.notes),
            }
        )
    return out


def _print_results(results: list[dict[str, Any]], unit: str, out: TextIO) -> None:
    headers = ["strategy", "step time", "speedup", "gap", "mb/rank", "over cap", "empty", "idle"]
    rows = []
    for r in results:
        lo, hi = r["micro_batches_per_rank"]
        speed = r["speedup_vs_sequential"]
        rows.append(
            [
                r["strategy"],
                _si(r["step_time"], unit),
                "-" if speed is None else f"{speed:.2f}x",
                f"{r['gap']:+.1%}",
                str(hi) if lo == hi else f"{lo}-{hi}",
                str(r["over_capacity"]),
                str(r["empty"]),
                f"{r['idle_fraction']:.1%}",
            ]
        )
    _table(headers, rows, out)


def _cmd_compare(args: argparse.Namespace) -> int:
    if args.demo == (args.lengths is not None):
        raise UserError("give either a LENGTHS file or --demo (one of the two)")
    if not args.demo:
        missing = [
            f for f, v in (("--dp", args.dp), ("--max-tokens", args.max_tokens)) if v is None
        ]
        if missing:
            raise UserError(f"compare LENGTHS needs {' and '.join(missing)}")
    check_numbers(args)
    check_outputs(args)
    _check_parallel_options(args, "compare")
    if args.cp_size != 1:  # context parallelism: its own strategies and table
        from . import cp_compare

        return cp_compare.run(args, sys.stdout)
    out = sys.stdout
    setups: list[dict[str, Any]] = []
    first_plans: dict[str, Plan] | None = None
    plot_title = ""
    padded = (
        "--padded: every micro-batch holds and costs count x longest; the baselines plan by "
        "summed tokens, as their frameworks do, and are then padded ('over cap' counts the "
        "padded micro-batches above max_tokens)"
        if args.padded
        else ""
    )
    sp = f" x sp={args.sp_size}" if args.sp_size > 1 else ""  # Ulysses groups of sp GPUs
    per_gpu = "/GPU" if args.sp_size > 1 else ""
    if args.demo:
        spec = args.model or args.cost
        cost = wrap_cost(_demo_cost(DEMO_COST) if spec is None else _load_cost(spec), args)
        for note in cost.notes:  # beside the table's own lines, as without --demo
            _say(note, sys.stderr)
        _say(
            f"seqbalance compare --demo: simulated {args.sync} step per strategy; cost = "
            f"{cost.label}; speedup over 'sequential'; gap = step / lower bound - 1",
            out,
        )
        if padded:
            _say(padded, out)
        if args.pp_size > 1:
            _say(PP_TABLE_NOTE, out)
        runs: list[tuple[str, np.ndarray, np.ndarray | None, int, int, str]] = []
        for s in DEMO_SETUPS:
            w = workloads.load(s.workload, s.n, s.seed)
            header = (
                f"{s.workload} ({workloads.describe(s.workload)}): n={s.n}, dp={s.dp}{sp}, "
                f"max_tokens={s.max_tokens}{per_gpu}, seed={s.seed}"
            )
            cap = group_capacity(args, s.max_tokens)
            runs.append((header, w.lengths, None, s.dp, cap, s.workload))
    else:
        cost = wrap_cost(_load_cost(args.model or args.cost), args)
        lengths, groups = _read_inputs(args)
        for note in cost.notes:
            _say(note, sys.stderr)
        header = (
            f"{args.lengths}: n={lengths.shape[0]}, dp={args.dp}{sp}, "
            f"max_tokens={args.max_tokens}{per_gpu}, sync={args.sync}, cost={cost.label}"
        )
        own = [
            flag
            for flag, used in (
                ("--size", args.size != "free"),
                ("--groups-column", groups is not None),
                ("--min-micro-batches", args.min_micro_batches != 1),
                ("--micro-batch-multiple", args.micro_batch_multiple != 1),
                ("--allow-empty", args.allow_empty),
                ("--extra-micro-batches", args.extra_micro_batches != 0),
            )
            if used
        ]
        if own:
            header += f" ({', '.join(own)} apply to seqbalance only; the baselines ignore them)"
        if padded:
            header += "\n" + padded
        if args.pp_size > 1:
            header += "\n" + PP_TABLE_NOTE
        cap = group_capacity(args, args.max_tokens)
        runs = [(header, lengths, groups, args.dp, cap, str(args.lengths))]
    # Every run's sizes before the first is planned: a bad one should not wait for the rest.
    for _, lengths, groups, dp, cap, _ in runs:
        _check_sizes(lengths, groups, dp, cap, args)

    for header, lengths, groups, dp, cap, label in runs:
        plans = _strategies(lengths, dp, cap, cost.model, args.sync, groups, _plan_kwargs(args))
        results = _results(plans, args.sync)
        print("", file=out)
        for line in header.splitlines():
            _say(line, out)
        _print_results(results, cost.unit, out)
        pp_rows = None
        if args.pp_size > 1:
            from .pipeline_view import order_plans, pipeline_results, print_pipeline

            plans = order_plans(plans["seqbalance"])
            pp_rows = pipeline_results(plans)
            print(f"pipeline: seqbalance's micro-batches in each order, {args.sync}", file=out)
            print_pipeline(pp_rows, _si, cost.unit, _table, out)
        group = {"sp_size": args.sp_size, "group_max_tokens": cap} if args.sp_size > 1 else {}
        setups.append(
            {
                "input": label,
                "n": int(lengths.shape[0]),
                "dp": dp,
                "max_tokens": cap // args.sp_size,  # a GPU's, as --max-tokens (and CP)
                **group,
                "sync": args.sync,
                "padded": bool(args.padded),
                "cost": cost.label,
                "unit": cost.axis_unit,
                "results": results,
            }
            | ({} if pp_rows is None else {"pipeline": pp_rows})
        )
        if first_plans is None:
            first_plans = plans
            plot_title = (
                f"{label}: n={lengths.shape[0]}, dp={dp}{sp}, "
                f"max_tokens={cap // args.sp_size}{per_gpu}, cost = {cost.label}"
                + (", padded" if args.padded else "")
            )

    if args.json is not None:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"format": "seqbalance.compare/1", "setups": setups}, fh, indent=1)
        print(f"\nwrote {args.json}", file=sys.stderr)
    if args.plot is not None and first_plans is not None:
        from .pipeline_view import plot_pipeline
        from .plotting import plot_timeline

        (plot_pipeline if args.pp_size > 1 else plot_timeline)(
            first_plans,
            args.plot,
            **({} if args.pp_size > 1 else {"sync": args.sync, "max_ranks": args.max_ranks}),
            title=plot_title,
            unit=cost.axis_unit,
        )
        which = " (first workload)" if args.demo else ""
        print(f"wrote {args.plot}{which}", file=sys.stderr)
    return 0


# ---- parser ----------------------------------------------------------------------------


def _add_common(p: argparse.ArgumentParser, *, required: bool) -> None:
    p.add_argument("--dp", type=int, required=required, metavar="N", help="data-parallel ranks")
    p.add_argument(
        "--max-tokens",
        type=int,
        required=required,
        metavar="T",
        help="token capacity of one micro-batch (padded: count x longest)",
    )
    cost = p.add_mutually_exclusive_group()
    cost.add_argument(
        "--model",
        metavar="NAME|CONFIG",
        help="balance training FLOPs of a model: a shipped name (e.g. qwen2.5-7b) or a "
        "Hugging Face config.json / its folder",
    )
    cost.add_argument(
        "--cost", metavar="COST.json", help="a cost JSON (e.g. from `seqbalance calibrate`)"
    )
    p.add_argument(
        "--sync",
        choices=SYNC_MODELS,
        default="fsdp",
        help="how ranks synchronise: fsdp/ZeRO-3 (every micro-batch) or ddp/ZeRO-1/2 (once "
        "per step); default fsdp",
    )
    p.add_argument(
        "--column", metavar="COL", help="column holding the lengths (CSV, JSONL, Parquet)"
    )
    p.add_argument(
        "--groups-column",
        metavar="COL",
        help="column of group ids; a group never spans ranks (e.g. the responses of one prompt)",
    )
    p.add_argument("--size", choices=SIZE_RULES, default="free", help="rule on sequences per rank")
    p.add_argument(
        "--min-micro-batches",
        type=int,
        default=1,
        metavar="M",
        help="at least M micro-batches per rank",
    )
    p.add_argument(
        "--micro-batch-multiple",
        type=int,
        default=1,
        metavar="K",
        help="micro-batch count must be a multiple of K (e.g. virtual pipeline stages)",
    )
    p.add_argument(
        "--padded", action="store_true", help="micro-batches are padded to their longest"
    )
    p.add_argument(
        "--allow-empty",
        action="store_true",
        help="allow (marked) empty micro-batches when there are too few sequences",
    )
    p.add_argument(
        "--extra-micro-batches",
        type=int,
        default=0,
        metavar="E",
        help="also try E larger micro-batch counts and keep the fastest",
    )
    p.add_argument("--pp-size", type=int, default=1, metavar="P", help="pipeline stages")
    p.add_argument(
        "--schedule",
        choices=("1f1b", "interleaved", "gpipe"),
        default="1f1b",
        help="pipeline schedule (with --pp-size > 1); default 1f1b",
    )
    p.add_argument(
        "--virtual-stages", type=int, default=1, metavar="V", help="model chunks per stage "
        "(--schedule interleaved)"
    )
    p.add_argument(
        "--pp-comm",
        type=float,
        default=0.0,
        metavar="T",
        help="time (cost units) to send one token's activations between two stages",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``seqbalance`` command."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Balance variable-length sequences across data-parallel ranks and "
        "micro-batches.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    lengths_help = (
        "lengths file: one integer per line (.txt or no extension), a JSON list, .npy, "
        "or CSV/TSV/JSONL/Parquet with --column"
    )
    p = sub.add_parser(
        "plan",
        help="plan ranks x micro-batches and write the plan as JSON",
        description="Plan which sequences every rank runs in each micro-batch; writes the "
        "plan JSON (stdout unless --out) and a summary to stderr.",
    )
    p.add_argument("lengths", metavar="LENGTHS", help=lengths_help)
    _add_common(p, required=True)
    p.add_argument("--out", metavar="PLAN.json", help="write the plan here (default: stdout)")
    from .cp_compare import add_arguments as add_cp_arguments
    from .ulysses_options import add_arguments as add_sp_arguments

    add_cp_arguments(p)
    add_sp_arguments(p)
    p.set_defaults(func=_cmd_plan)

    c = sub.add_parser(
        "compare",
        help="compare seqbalance with the baselines other frameworks use",
        description="Simulate one step of seqbalance and of each baseline and print a table.",
    )
    c.add_argument("lengths", metavar="LENGTHS", nargs="?", help=lengths_help)
    c.add_argument(
        "--demo",
        action="store_true",
        help=f"run built-in workloads with their own dp and max_tokens (ignores --dp and "
        f"--max-tokens); cost {DEMO_COST} unless --model/--cost says otherwise",
    )
    _add_common(c, required=False)
    c.add_argument("--json", metavar="OUT.json", help="also save the table as JSON")
    c.add_argument(
        "--plot",
        metavar="OUT.png",
        help="draw a ranks x time timeline (with --demo: of the first workload); needs matplotlib",
    )
    c.add_argument("--max-ranks", type=int, default=16, metavar="R", help="ranks drawn per panel")
    add_cp_arguments(c)
    add_sp_arguments(c)
    c.set_defaults(func=_cmd_compare)

    from .refit import register as register_refit

    register_refit(sub)
    try:
        from ..costs import calibrate
    except ImportError:
        calibrate = None  # type: ignore[assignment]  # not written yet or torch-free stub
    if calibrate is not None and hasattr(calibrate, "register"):
        calibrate.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``seqbalance`` command line; return the exit status.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        0 on success, 2 on a usage or input error (one ``error:`` line on stderr), 1 when
        the output pipe was closed early.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse printed it)
        return int(exc.code) if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    func: Callable[[argparse.Namespace], int | None] = args.func
    try:
        status = func(args)
    except BrokenPipeError:  # e.g. `seqbalance compare --demo | head`: stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (UserError, ValueError, OSError, OverflowError) as exc:
        # OverflowError: a number too large for int64 that no check above caught.
        message = str(exc) or type(exc).__name__
        if isinstance(exc, OSError) and exc.filename is not None and exc.strerror:
            message = f"{exc.filename}: {exc.strerror}"
        if isinstance(exc, NotedError) and not isinstance(exc, FileError):
            # (a file's keys are not flags the user gave)
            message = shown(exc, words_for(getattr(args, "sp_size", 1),
                                           getattr(args, "cp_size", 1)))  # fmt: skip
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0 if status is None else int(status)


if __name__ == "__main__":
    sys.exit(main())
