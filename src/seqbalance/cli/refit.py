"""``seqbalance refit``: fit a cost in seconds to micro-batch timings saved by a job.

A training job that times its micro-batches (``MicroBatchTimer``) and saves the records
(``TimingRecorder.save``, or ``stream_to`` as they arrive) can have its cost refitted
offline, with the same robust fit as ``recorder.refit()``. The command prints how well
the start cost and the refit predict the measured times (and, with ``--holdout-steps``,
steps the fit did not see), the fitted coefficients with their standard errors, and
writes the cost JSON that ``seqbalance plan --cost`` and ``load_cost`` read.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from typing import Any, TextIO

from .checks import FileError, UserError, check_outputs, load_user_cost
from .flags import shown

__all__ = ["register", "run"]

# (argparse name, flag) of each CP link setting, by its key in a link (ContextParallelCost).
_LINK_FLAGS = {
    "bandwidth": ("cp_bandwidth", "--cp-bandwidth"),
    "overlap": ("cp_overlap", "--cp-overlap"),
    "kv_bytes_per_token": ("kv_bytes_per_token", "--kv-bytes-per-token"),
    "comm_passes": ("cp_comm_passes", "--cp-comm-passes"),
    "cost_per_second": ("cost_per_second", "--cost-per-second"),
}


def register(subparsers: Any) -> None:
    """Add the ``refit`` subcommand to an argparse ``subparsers`` object."""
    p = subparsers.add_parser(
        "refit",
        help="fit a cost (seconds) to micro-batch timings a job saved (TimingRecorder.save, "
        "stream_to)",
        description=(
            "Read timing files written by TimingRecorder.save or stream_to (or JSON Lines "
            "records of "
            "rank, step, slot, lengths, seconds), fit t = c0 + sum(a + b*L + c*L^2) "
            "robustly with one speed factor per rank, print the fit and how well each cost "
            "predicts the measured times (to stderr), and write the cost JSON (stdout "
            "unless --out) for `seqbalance plan --cost`."
        ),
    )
    p.add_argument(
        "timings",
        nargs="+",
        metavar="TIMINGS",
        help="timing files (JSON Lines); several are merged (e.g. one per rank)",
    )
    cost = p.add_mutually_exclusive_group()
    cost.add_argument(
        "--model",
        metavar="NAME|CONFIG",
        help="start cost: a model's training FLOPs (default: the files' cost, else tokens)",
    )
    cost.add_argument("--cost", metavar="COST.json", help="start cost: a cost JSON")
    p.add_argument(
        "--sync",
        choices=("fsdp", "ddp"),
        default=None,
        help="sync model of the step-time figures (default: the files', else fsdp)",
    )
    p.add_argument("--out", metavar="COST.json", help="write the cost here (default: stdout)")
    p.add_argument(
        "--window",
        type=int,
        default=None,
        metavar="N",
        help="use only the last N steps in the files (default: all), e.g. of a long "
        "streamed run",
    )
    p.add_argument(
        "--holdout-steps",
        type=int,
        default=0,
        metavar="K",
        help="fit on all but the last K steps and report the errors on those K; the cost "
        "written is that fit",
    )
    p.add_argument(
        "--no-per-rank",
        action="store_true",
        help="no speed factor per rank (all ranks are taken as equally fast)",
    )
    p.add_argument(
        "--no-robust", action="store_true", help="plain least squares, no Huber weights"
    )
    p.add_argument(
        "--no-per-microbatch",
        action="store_true",
        help="fit no per-micro-batch term (c0 = 0)",
    )
    p.add_argument(
        "--no-per-sequence", action="store_true", help="fit no per-sequence term (a = 0)"
    )
    g = p.add_argument_group(
        "context parallelism (records with pieces; default: the link the files were saved "
        "with)"
    )
    g.add_argument(
        "--cp-bandwidth", type=float, metavar="B", help="bytes/s per GPU on the CP ring"
    )
    g.add_argument(
        "--cp-overlap",
        type=float,
        metavar="F",
        help="fraction of a ring step's attention that hides its transfer (default 0.5)",
    )
    g.add_argument(
        "--kv-bytes-per-token",
        type=float,
        metavar="X",
        help="K/V bytes a token sends over all layers (default: from --model's architecture)",
    )
    g.add_argument(
        "--cp-comm-passes",
        type=float,
        metavar="N",
        help="times the K/V volume crosses the ring per step (default 3: forward K/V, "
        "backward K/V and dK/dV)",
    )
    g.add_argument(
        "--cost-per-second",
        type=float,
        metavar="X",
        help="the start cost's units per second, for its row of the table only (default: "
        "the files' rate for their own cost, 4e14 for a FLOP cost, else 1)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run ``seqbalance refit`` from parsed arguments; return the exit status."""
    from dataclasses import replace

    from ..costs import TimingFileError, TimingRecorder, UnidentifiableCostWarning
    from ..costs.feedback import evaluate_records

    if args.holdout_steps < 0:
        raise UserError(f"--holdout-steps must be >= 0, got {args.holdout_steps}")
    if args.window is not None and args.window < 1:
        raise UserError(f"--window must be >= 1, got {args.window}")
    for path in args.timings:
        if args.out is not None and args.out != "-":
            check_outputs(argparse.Namespace(out=args.out, lengths=path))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loaded, notes = _load(args)
    except TimingFileError as exc:  # in the file's words, not the flags'
        raise FileError(str(exc)) from None
    except ValueError as exc:
        raise UserError(_in_flags(shown(exc))) from None
    notes = [str(w.message) for w in caught] + notes  # e.g. steps of a resumed job
    if not len(loaded):
        raise UserError(f"no timing records in {', '.join(args.timings)}")
    steps = loaded.steps
    k = args.holdout_steps
    if k >= len(steps):
        raise UserError(
            f"--holdout-steps {k} leaves no step to fit: "
            + (f"--window {args.window} keeps" if args.window is not None else "the files hold")
            + f" {len(steps)} step(s); hold out fewer"
        )
    start = loaded.cp_cost or loaded.cost
    recorder = TimingRecorder(start, sync=loaded.sync, window=loaded.window)
    fit_steps = set(steps[: len(steps) - k])
    held = [r for r in loaded.records if r.step not in fit_steps]
    recorder.extend(r for r in loaded.records if r.step in fit_steps)
    before = recorder.report()
    held_before = _held_report(recorder, held, start)
    old = recorder.cost
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cost = recorder.refit(
            per_rank=not args.no_per_rank,
            robust=not args.no_robust,
            per_microbatch=not args.no_per_microbatch,
            per_sequence=not args.no_per_sequence,
        )
    warned = [_in_flags(str(w.message)) for w in caught]
    if cost is old:  # the records cannot identify the cost: refit kept the start cost
        kept = [_in_flags(str(w.message)) for w in caught
                if issubclass(w.category, UnidentifiableCostWarning)]  # fmt: skip
        raise UserError(kept[-1] if kept else "refit kept the start cost; nothing written")
    after = recorder.report()
    held_after = _held_report(recorder, held, recorder.cp_cost or recorder.cost)
    if held and cost.report is not None:  # the held-out row of the cost's own FitReport
        holdout = evaluate_records(cost, recorder.cp_cost, held)
        cost.report = replace(cost.report, holdout=holdout)
    err = sys.stderr
    _describe(loaded, err)
    rows = [
        ["measured", "", "", f"{before.imbalance_measured:.1%}",
         _ms(before.step_time_measured)],
        _row(f"start: {_label(old)}", before),
        _row("refit", after),
    ]  # fmt: skip
    if held:
        rows += [
            ["held-out measured", "", "", f"{held_before.imbalance_measured:.1%}",
             _ms(held_before.step_time_measured)],
            _row(f"held-out start: {_label(old)}", held_before),
            _row("held-out refit", held_after),
        ]  # fmt: skip
    from ._common import _table

    print(file=err)
    _table(["cost", "model error", "p90", "imbalance", "step time"], rows, err)
    print(file=err)
    if cost.report is not None:
        print(str(cost.report), file=err)
    speed = cost.meta.get("rank_speed", {})
    if speed and not args.no_per_rank:
        slow = max(speed, key=lambda r: (speed[r], -int(r)))
        print(
            f"rank speed factors {min(speed.values()):.3f}..{max(speed.values()):.3f} "
            f"(slowest: rank {slow}, {speed[slow]:.3f})",
            file=err,
        )
    if warned:
        cost.meta["warnings"] = warned  # `plan --cost` repeats them
    for note in notes + warned:
        print(f"note: {note}", file=err)
    text = cost.to_json()
    if args.out in (None, "-"):
        sys.stdout.write(text + "\n")
    else:
        with open(args.out, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
        print(f"wrote {args.out}", file=err)
    return 0


def _load(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The records under the start cost (``--model``/``--cost`` or the files'), with the
    CP link of the files and of the ``--cp-*`` flags; and notes for after the fit."""
    from ..costs import TimingRecorder

    flags = {name: getattr(args, name) for name, _ in _LINK_FLAGS.values()}
    given = [flag for name, flag in _LINK_FLAGS.values() if flags[name] is not None]
    spec = args.model or args.cost
    link, agreed = _files_link(args.timings, flags, spec)
    if given and link is None and flags["cp_bandwidth"] is None:
        verb = "describes" if len(given) == 1 else "describe"
        raise UserError(f"{', '.join(given)} {verb} a CP link: give --cp-bandwidth too")
    if spec is None and link is not None and (not agreed or given):
        # The files' own cost under the flags' link (the files' is not read: a bad value
        # there that a flag replaces is not used).
        spec = link["saved_cost"]
    if spec is not None:
        seq = load_user_cost(spec)
        same = link is not None and seq.to_dict() == link.get("saved_cost")
        cost = _with_flags(seq, link, flags, same) if link or given else seq
        loaded = TimingRecorder.load(args.timings, cost=cost, sync=args.sync,
                                     window=args.window)  # fmt: skip
    else:
        loaded = TimingRecorder.load(args.timings, sync=args.sync, window=args.window)
        if given:  # the files' own cost, under the link the flags change or describe
            # (as TimingRecorder(cost) would set them; the records need no second check)
            loaded.cp_cost = _with_flags(loaded.cost, link, flags, True)
            loaded.cost = loaded.cp_cost.cost
    notes = []
    cp = any(r.pieces is not None for r in loaded.records)
    if cp and loaded.cp_cost is None:
        notes.append(
            "the records hold context-parallel pieces but no CP link is known "
            "(--cp-bandwidth): their communication is taken as hidden, and what is not "
            "ends up in the fitted per-token terms"
        )
    if given and not cp:
        notes.append(f"no record holds context-parallel pieces: {', '.join(given)} change nothing")
    return loaded, notes


def _files_link(
    paths: list[str], flags: dict[str, Any], spec: str | None
) -> tuple[dict[str, Any] | None, bool]:
    """The CP link the files' headers name (None: none) and whether they all agree on it.

    Files saved under different links (another bandwidth guess, another overlap) can be
    refit together when the flags (and ``--cost``/``--model`` for different saved costs)
    give every setting they differ in: the link returned then holds only the settings
    they share, and the flags the rest. Otherwise a UserError says which flags to give.
    """
    from ..costs import ContextParallelCost
    from ..costs.timing_files import check_link_values, read_link

    links = [(path, read_link([path])) for path in paths]
    links = [(path, link) for path, link in links if link is not None]
    replaced = [key for key, (name, _) in _LINK_FLAGS.items() if flags[name] is not None]
    for path, link in links:  # a bad value of a file's (that no flag replaces) is the file's
        try:
            check_link_values(link, skip=replaced)
        except ValueError as exc:
            raise FileError(f"{path}: the header's cp_cost: {exc}") from None
    if all(link == links[0][1] for _, link in links[1:]):
        return (links[0][1] if links else None), True
    full = []  # with the defaults a hand-written header leaves out
    for path, link in links:
        settings = {k: v for k, v in link.items() if k != "saved_cost"}
        try:
            filled = ContextParallelCost.from_dict({**settings, "cost": link["saved_cost"]})
        except ValueError as exc:
            raise FileError(f"{path}: the header's cp_cost: {exc}") from None
        full.append({**{k: v for k, v in filled.to_dict().items() if k != "cost"},
                     "saved_cost": link["saved_cost"]})  # fmt: skip
    keys = sorted({k for link in full for k in link})
    differ = [k for k in keys if any(link.get(k) != full[0].get(k) for link in full[1:])]
    # Another start cost takes its own rate (the files' rates price their own costs).
    needed = [k for k in differ if not (k == "cost_per_second" and spec is not None)]
    missing = [
        "--cost or --model" if k == "saved_cost" else _LINK_FLAGS[k][1]
        for k in needed
        if (spec is None if k == "saved_cost" else flags[_LINK_FLAGS[k][0]] is None)
    ]
    if missing:
        other = next(path for (path, _), link in zip(links, full) if link != full[0])
        words = {"saved_cost": "cost", "cost_per_second": "cost units per second",
                 "kv_bytes_per_token": "K/V bytes", "comm_passes": "comm passes"}  # fmt: skip
        raise UserError(
            f"the headers of {links[0][0]} and {other} give different CP links (they differ "
            f"in {', '.join(words.get(k, k) for k in differ)}): give "
            f"{', '.join(missing)} to price every record under one link, or refit the "
            "files separately"
        )
    return {k: v for k, v in full[0].items() if k not in differ}, False


def _with_flags(seq: Any, link: dict[str, Any] | None, flags: dict[str, Any], same: bool) -> Any:
    """``seq`` under the files' link (``link``; None: none) with the flags' changes."""
    from ..costs import ContextParallelCost
    from ..costs.context_parallel import _cost_per_second

    def pick(key: str, default: Any) -> Any:
        name = _LINK_FLAGS[key][0]
        if flags.get(name) is not None:
            return flags[name]
        return link.get(key, default) if link is not None else default

    cps = flags["cost_per_second"]
    if cps is None:
        if link is not None and same and "cost_per_second" in link:  # the saved cost: its rate
            cps = link.get("cost_per_second", 1.0)
        else:  # it prices the start cost's row only; the refit is in seconds
            try:  # 4e14 for FLOPs (a UlyssesCost: its own rate), 1 in seconds
                cps = _cost_per_second(seq, 1.0)
            except ValueError:  # units unknown: 1 (it prices the start row only)
                cps = 1.0
    return ContextParallelCost(
        seq,
        bandwidth=pick("bandwidth", None),
        cost_per_second=cps,
        overlap=pick("overlap", 0.5),
        kv_bytes_per_token=pick("kv_bytes_per_token", None),
        comm_passes=pick("comm_passes", 3.0),
    )


def _in_flags(message: str) -> str:
    """A refit warning in the command's words (its flags; nothing is kept, nothing written)."""
    for words, flags in (
        ("fit_cost:", "refit:"),
        ("pass cost= to say which to use", "pass --cost or --model to say which to use"),
        ("pass sync= to say which to use", "pass --sync to say which to use"),
        ("pass a ContextParallelCost as cost= to say which", "refit them separately"),
        ("pass the link to use", "refit them separately"),
        ("pass a ContextParallelCost(cost, cost_per_second=..., ...) as the cost",
         "pass --cost-per-second"),
        ("pin per_microbatch=False / per_sequence=False",
         "pass --no-per-microbatch / --no-per-sequence"),
        ("pin per_microbatch=False", "pass --no-per-microbatch"),
        ("pin per_sequence=False", "pass --no-per-sequence"),
        ("per_microbatch=False", "--no-per-microbatch"),
        ("per_sequence=False", "--no-per-sequence"),
        ("robust=True down-weights them", "leave out --no-robust to down-weight them"),
        ("that cp_cost models (bandwidth=", "that the CP link models (--cp-bandwidth "),
        (", overlap=", ", --cp-overlap "),
        ("; refit keeps the previous cost", "; nothing written"),
        ("refit keeps the previous cost", "Nothing written"),
        ("keeping the previous cost", "nothing written"),
        ("refit adopts the new cost all the same", "The cost is written all the same"),
        ("Correct the cp_cost given to the TimingRecorder", "Correct --cp-bandwidth / "
         "--cp-overlap"),
    ):  # fmt: skip
        message = message.replace(words, flags)
    return message


def _held_report(recorder: Any, held: list[Any], cost: Any) -> Any:
    """The report of the held-out records under ``cost`` (None without any)."""
    if not held:
        return None
    from ..costs import TimingRecorder

    other = TimingRecorder(cost, sync=recorder.sync, window=recorder.window)
    other.extend(held)
    return other.report()


def _describe(loaded: Any, out: TextIO) -> None:
    recs = loaded.records
    cp = sum(r.pieces is not None for r in recs)
    ranks = len({r.rank for r in recs})
    steps = loaded.steps
    extra = f" ({cp} of context-parallel pieces)" if cp else ""
    print(
        f"{len(recs)} micro-batches{extra}, {len(steps)} steps ({steps[0]}..{steps[-1]}), "
        f"{ranks} ranks, sync {loaded.sync}",
        file=out,
    )


def _label(cost: Any) -> str:
    name = getattr(cost, "name", None)
    kind = type(cost).__name__
    if kind == "TokenCost":
        return "tokens"
    if kind == "FlopsCost":
        return f"FLOPs of {name}" if name else "FLOPs"
    return kind


def _row(label: str, report: Any) -> list[str]:
    return [
        label,
        f"{report.model_error:.1%}",
        f"{report.model_error_p90:.1%}",
        f"{report.imbalance_predicted:.1%}",
        _ms(report.step_time_predicted),
    ]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds == seconds else "n/a"
