"""What the commands share: the cost the user picked, number and table formatting, the
inputs and the pipeline options (the command modules import this, never each other's)."""

from __future__ import annotations

import argparse
import math
import os
import textwrap
from dataclasses import dataclass, field
from typing import Any, Sequence, TextIO

import numpy as np

from .checks import UserError, load_user_cost, stray_options

DEMO_COST = "qwen2.5-7b"


# ---- cost ------------------------------------------------------------------------------


@dataclass
class CostChoice:
    """The cost the user picked: what to pass to the planner, and how to describe it."""

    model: Any = None  # a cost model, or None for tokens
    label: str = "tokens"
    unit: str = "tok"  # in the table: "tok", "FLOP", "s", or "" (unknown)
    notes: list[str] = field(default_factory=list)

    @property
    def axis_unit(self) -> str:
        """The unit spelled out, for the plot's time axis."""
        return {"tok": "tokens", "s": "seconds", "": "cost units"}.get(self.unit, self.unit)


def _load_cost(spec: str | None) -> CostChoice:
    if spec is None or spec.lower() == "tokens":
        return CostChoice()
    return _describe(load_user_cost(spec), spec)


def _describe(model: Any, spec: str) -> CostChoice:
    """The :class:`CostChoice` of a cost model loaded from ``spec``: its label and unit."""
    kind = type(model).__name__
    if kind == "UlyssesCost":  # in the units of the cost it shares
        inner = _describe(model.cost, spec)
        label = f"{inner.label}, one GPU's share of Ulysses sp={model.sp_size} from {spec}"
        return CostChoice(model, label, inner.unit, inner.notes)
    if kind == "TokenCost":
        return CostChoice(model)
    if kind == "FlopsCost":
        name = getattr(model, "name", None) or spec
        return CostChoice(model, f"training FLOPs of {name}", "FLOP")
    meta = getattr(model, "meta", None) or {}
    warned = meta.get("warnings", [])
    if isinstance(warned, str):  # one warning, not one per character
        warned = [warned]
    notes = [f"note: {spec}: {w}" for w in warned]
    # "unit": written by `seqbalance calibrate` and TimingRecorder.refit ("units" by the
    # refit of seqbalance <= 0.1, whose files are still about).
    if "seconds" in (meta.get("unit"), meta.get("units")):
        where = " on ".join(str(meta[k]) for k in ("model", "device") if meta.get(k))
        label = f"calibrated seconds of {where}" if where else f"seconds from {spec}"
        return CostChoice(model, label, "s", notes)
    return CostChoice(model, f"{kind} from {spec}", str(meta.get("unit", "")), notes)


def _demo_cost(name: str = DEMO_COST) -> CostChoice:
    try:
        return _load_cost(name)
    except (UserError, ValueError, OSError) as exc:
        choice = CostChoice()
        choice.notes.append(f"note: cost model {name!r} unavailable ({exc}); using tokens")
        return choice


# ---- formatting ------------------------------------------------------------------------

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _si(x: float, unit: str = "") -> str:
    """``4.2e16, "FLOP"`` -> ``"42.0 PFLOP"``; ``609075, "tok"`` -> ``"609.1 ktok"``;
    seconds as ``"12.3 ms"``, ``"4.56 s"``."""
    if unit == "s":
        return _seconds(x)
    if not math.isfinite(x) or abs(x) >= 1e21:  # beyond the prefixes: 1.6e+305 FLOP
        return f"{x:.3g} {unit}".rstrip()
    for scale, prefix in _PREFIXES:
        if abs(x) >= scale:
            text = f"{x / scale:.1f}{prefix}"
            break
    else:
        text = f"{x:.4g}"
    if not unit:
        return text
    return f"{text} {unit}" if text[-1].isdigit() else f"{text[:-1]} {text[-1]}{unit}"


def _seconds(x: float) -> str:
    """``0.0123`` -> ``"12.3 ms"``; ``4.5678`` -> ``"4.57 s"``; ``4567.8`` -> ``"4,568 s"``."""
    ax = abs(x)
    if ax == 0 or not math.isfinite(x):
        return f"{x:g} s"
    if ax < 1e-3:
        return f"{x * 1e6:.3g} \u00b5s"
    if ax < 1:
        return f"{x * 1e3:.3g} ms"
    return f"{x:.3g} s" if ax < 1000 else f"{x:,.0f} s"


def _terminal_width(out: TextIO) -> int | None:
    """Columns of the terminal ``out`` writes to, or None when it is not a terminal."""
    try:
        if out.isatty():
            return os.get_terminal_size(out.fileno()).columns
    except (AttributeError, OSError, ValueError):  # a StringIO, a closed or odd stream
        pass
    return None


def _say(text: str, out: TextIO) -> None:
    """Print a line of prose, wrapped at word boundaries to the terminal's width (a file or
    pipe gets it unwrapped)."""
    width = _terminal_width(out)
    if width is None or len(text) <= width:
        print(text, file=out)
        return
    print(textwrap.fill(text, width=max(width, 20), subsequent_indent="  "), file=out)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Print a table: with rich when installed, else as plain aligned text.

    Columns are two spaces apart, so the usual table is under 80 columns wide. On a
    narrower terminal the strategy names fold onto a second line (down to 8 characters);
    the numbers are never cut. A file or pipe gets the full width.
    """
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    try:
        from rich import box
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        have_rich = False
    else:
        have_rich = True
    if have_rich:
        first = widths[0]
        natural = sum(widths) + 2 * (len(widths) - 1)
        term = _terminal_width(out)
        if term is not None and natural > term:
            first = max(8, first - (natural - term))
        # A rule under the header, one space of padding either side of a blank separator.
        table = Table(
            box=box.SIMPLE_HEAD,
            padding=(0, 1),
            collapse_padding=True,
            show_edge=False,
            pad_edge=False,
            header_style="bold",
        )
        for i, h in enumerate(headers):
            if i == 0:
                table.add_column(h, justify="left", width=first, overflow="fold")
            else:
                table.add_column(h, justify="right", width=widths[i], no_wrap=True)
        for row in rows:
            table.add_row(*row)
        # Exactly the table's width: rich then neither shrinks columns nor pads lines.
        Console(file=out, width=natural - widths[0] + first).print(table)
        return

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    print(line(headers), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in rows:
        print(line(row), file=out)


# ---- reading inputs --------------------------------------------------------------------


def _read_inputs(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray | None]:
    from .readers import read_groups, read_lengths

    lengths = read_lengths(args.lengths, args.column)
    groups = None
    if args.groups_column is not None:
        groups = read_groups(args.lengths, args.groups_column)
    return lengths, groups


# The pipeline options besides --pp-size, with their defaults (no pipelining).
_PP_DEFAULTS = {"schedule": "1f1b", "virtual_stages": 1, "pp_comm": 0.0}


def _stray_pp_options(args: argparse.Namespace) -> list[str]:
    """The pipeline options set away from their defaults, as flags."""
    return stray_options(args, _PP_DEFAULTS)


def _pp_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """Pipeline keywords, only when pipelining (so pp_size 1 plans as without a pipeline)."""
    if args.pp_size == 1 and not _stray_pp_options(args):
        return {}
    return {k: getattr(args, k) for k in ("pp_size", *_PP_DEFAULTS)}
