"""Checks the command line makes before it plans anything.

Planning a large batch and simulating every baseline takes seconds; a mistake in an output
path, a missing plotting library or an impossible size should cost none of them. Every
check here is either about the arguments alone or a necessary condition of any plan (so
it never refuses an input the planner could serve), and says what to change, in flags.
"""

from __future__ import annotations

import argparse
import math
import os
from typing import Any

import numpy as np

from .._validate import too_long, unwritable

__all__ = [
    "INT_FLAGS",
    "MAX_EMPTY_SLOTS",
    "MAX_INT",
    "FileError",
    "UserError",
    "check_numbers",
    "check_outputs",
    "check_sizes",
    "load_user_cost",
    "refuse_stray",
    "refuse_unpriced",
    "stray_options",
    "unwritable",
]

# Integers above 2**53 are not exact in float64, in which costs and times are computed; no
# token budget or rank count comes near it (and beyond int64, numpy raises OverflowError).
MAX_INT = 2**53
# With --allow-empty a plan stores every (rank, micro-batch) slot, empty or not: about 600
# bytes each in the plan and its JSON. A million empty slots (~0.6 GB) is the most we build.
MAX_EMPTY_SLOTS = 2**20


class UserError(Exception):
    """A problem with the user's input, reported as one line without a traceback."""


class FileError(UserError):
    """A problem inside one of the user's files (a cost JSON, a timing file's header),
    reported in the file's own words: its keys are not rewritten into flags the user did
    not give (``comm_passes = -1`` in a file is not ``--cp-comm-passes -1``)."""


def load_user_cost(spec: Any) -> Any:
    """``load_cost(spec)`` (``--cost``/``--model``), its ValueErrors as :class:`FileError`
    naming ``spec``: they are about the user's file or name, not about a flag's value."""
    try:
        from ..costs import load_cost
    except ImportError as exc:  # numpy-only, so a broken install
        raise UserError(f"cost models are unavailable in this install ({exc})") from None
    try:
        return load_cost(spec)
    except ValueError as exc:
        message = str(exc)
        if not isinstance(spec, str):  # a saved cost's document (refit: the files' own)
            raise FileError(f"the timing files' saved cost: {message}") from None
        raise FileError(message if spec in message else f"{spec}: {message}") from None


def _get(args: argparse.Namespace, name: str) -> Any:
    return getattr(args, name, None)


def _it(flags: list[str]) -> str:
    return "it" if len(flags) == 1 else "them"


def stray_options(args: argparse.Namespace, defaults: dict[str, Any]) -> list[str]:
    """The options among ``defaults`` (argparse name -> default) set away from their
    defaults, as flags."""
    return [
        "--" + key.replace("_", "-")
        for key, default in defaults.items()
        if getattr(args, key) != default
    ]


def refuse_stray(stray: list[str], size_flag: str, metavar: str, what: str) -> None:
    """Refuse ``stray`` options that act only with ``size_flag`` above 1 (``what``)."""
    if stray:
        verb = "applies" if len(stray) == 1 else "apply"
        raise UserError(
            f"{', '.join(stray)} only {verb} with {size_flag} > 1 ({what}); pass "
            f"{size_flag} {metavar}, or drop {_it(stray)}"
        )


def refuse_unpriced(flags: list[str], link: str, bandwidth_flag: str) -> None:
    """Refuse ``flags`` that act on a ``link`` that is free (not priced) without
    ``bandwidth_flag``: they would change nothing."""
    if flags:
        verb = "acts" if len(flags) == 1 else "act"
        raise UserError(
            f"{' and '.join(flags)} only {verb} on {link}, which is free without "
            f"{bandwidth_flag}: give {bandwidth_flag} too, or drop {_it(flags)}"
        )


# The integer flags of `plan` and `compare`: (flag, attribute, smallest allowed value).
INT_FLAGS = (
    ("--dp", "dp", 1),
    ("--max-tokens", "max_tokens", 1),
    ("--min-micro-batches", "min_micro_batches", 1),
    ("--micro-batch-multiple", "micro_batch_multiple", 1),
    ("--extra-micro-batches", "extra_micro_batches", 0),
    ("--max-ranks", "max_ranks", 1),
    ("--cp-size", "cp_size", 1),
    ("--sp-size", "sp_size", 1),
    ("--pp-size", "pp_size", 1),
    ("--virtual-stages", "virtual_stages", 1),
)


def check_numbers(args: argparse.Namespace) -> None:
    """Range of every integer flag the command has, before anything is read or computed."""
    for flag, name, low in INT_FLAGS:
        value = _get(args, name)
        if value is None:
            continue
        if value < low:
            raise UserError(f"{flag} must be >= {low}, got {value}")
        if value > MAX_INT:
            raise UserError(
                f"{flag} {value} is too large: at most 2**53 = {MAX_INT} (larger integers are "
                "not exact in the float64 arithmetic of costs and times)"
            )


def check_outputs(args: argparse.Namespace) -> None:
    """Every output file can be written, and ``--plot`` can be drawn, before planning; no
    output overwrites the lengths file or another output."""
    seen: dict[str, str] = {}
    source = _get(args, "lengths")
    if source is not None:
        seen[os.path.realpath(source)] = "the lengths file"
    for flag, name in (("--out", "out"), ("--json", "json"), ("--plot", "plot")):
        path = _get(args, name)
        if path is None or (name == "out" and path == "-"):
            continue
        if path == "-":  # the table is on stdout; a file named "-" is what came of it
            raise UserError(f"{flag} -: the table goes to stdout; give {flag} a file name")
        problem = unwritable(path)
        if problem:
            raise UserError(f"{flag} {path}: {problem}")
        if name == "plot" and not os.path.splitext(os.path.basename(path))[1]:
            # matplotlib would append its default extension and write another file.
            raise UserError(f"{flag} {path!r}: give the file an extension (.png, .svg, .pdf)")
        real = os.path.realpath(path)
        if real in seen:
            raise UserError(f"{flag} {path} would overwrite {seen[real]}; pick another file")
        seen[real] = f"the {flag} file"
    if _get(args, "plot") is not None:
        from .plotting import check_plot_path

        check_plot_path(args.plot)


def _ranks(k: int, unit: str = "rank") -> str:
    return unit if k == 1 else f"{unit}s"


def _round_up(x: int, k: int) -> int:
    return -(-x // k) * k


def check_sizes(
    lengths: np.ndarray,
    groups: np.ndarray | None,
    dp: int,
    max_tokens: int,
    *,
    min_micro_batches: int = 1,
    micro_batch_multiple: int = 1,
    size: str = "free",
    allow_empty: bool = False,
    cap_flag: str = "--max-tokens",
    unit: str = "rank",
) -> None:
    """Refuse sizes no plan can meet, or plans too large to build, with the flags to change.

    ``cap_flag`` names what set ``max_tokens`` (``--sp-size x --max-tokens`` for a
    Ulysses group); ``unit`` what ``--dp`` counts (``"replica"`` under static CP).

    Every plan needs at least ``m`` micro-batches per rank, ``m`` being the capacity
    minimum ``ceil(total tokens / (dp * max_tokens))`` raised to ``min_micro_batches`` and
    rounded up to ``micro_batch_multiple``. Without ``--allow-empty`` each of the ``dp * m``
    micro-batches needs a sequence, and each rank at least one group; with it, the plan
    holds all ``dp * m`` of them, empty or not.
    """
    n = int(lengths.shape[0])
    problem = too_long(lengths, max_tokens, flag=cap_flag)
    if problem:
        # First: a sequence that fits nowhere also inflates the counts checked below, whose
        # messages would point at the wrong flags.
        fix = (
            "raise --max-tokens, split them over GPUs with --cp-size C (context parallelism)"
            if cap_flag == "--max-tokens"
            else "raise --max-tokens or --sp-size"  # or --cp-size too: rings of such groups
        )
        raise UserError(f"{problem}: {fix}, or split or truncate such sequences")
    total = int(lengths.sum()) if n else 0
    m_cap = max(1, math.ceil(total / (dp * max_tokens)))
    m = _round_up(max(m_cap, min_micro_batches), micro_batch_multiple)
    if allow_empty:
        limit = max(n, MAX_EMPTY_SLOTS)
        if dp * m > limit:
            raise UserError(
                f"--dp {dp} x {m} micro-batches = {dp * m:,} micro-batches for {n:,} sequences: "
                f"with --allow-empty the plan would hold {dp * m - n:,} empty ones (hundreds of "
                f"bytes each). Use at most {max(1, limit // m):,} {unit}s"
                + (", or lower --min-micro-batches / --micro-batch-multiple" if m > m_cap else "")
            )
        return
    if n == 0:
        raise UserError("there are no sequences to plan (the lengths file is empty)")
    if groups is not None:
        units = int(np.unique(groups).shape[0])
        if units < dp:
            raise UserError(
                f"{units} groups for {dp} {unit}s: a group stays on one {unit}, so "
                f"{dp - units} {_ranks(dp - units, unit)} would get no sequence. Use --dp "
                f"{units} or fewer, or pass --allow-empty to let those {unit}s run empty "
                "(marked) micro-batches"
            )
    elif n < dp:
        raise UserError(
            f"{n} sequences for {dp} {unit}s: {dp - n} {_ranks(dp - n, unit)} would get no "
            f"sequence. Use --dp {n} or fewer, or pass --allow-empty to let those {unit}s run "
            "empty (marked) micro-batches"
        )
    if size == "equal" and groups is None and n % dp:
        raise UserError(
            f"--size equal needs the number of sequences ({n}) to be a multiple of --dp ({dp}); "
            "use --size balanced to allow counts that differ by one"
        )
    if n < dp * m:
        why = [f"the capacity needs {m_cap}"]
        fixes = []
        if min_micro_batches > m_cap:
            why.append(f"--min-micro-batches {min_micro_batches}")
            fixes.append("lower --min-micro-batches")
        if m > max(m_cap, min_micro_batches):
            why.append(f"rounded up to a multiple of --micro-batch-multiple {micro_batch_multiple}")
            fixes.append("lower --micro-batch-multiple")
        if m == m_cap:
            fixes.append("raise --max-tokens")
        fixes += [f"use fewer {unit}s (--dp)", "pass --allow-empty"]
        raise UserError(
            f"{n} sequences cannot fill {dp} {unit}s x {m} micro-batches ({'; '.join(why)}): "
            f"every micro-batch needs at least one sequence. To fix: {', '.join(fixes)}"
        )
