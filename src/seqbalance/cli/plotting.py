"""Timeline plot of simulated training steps: ranks x time, one panel per strategy.

matplotlib is an optional extra (``pip install ".[cli]"`` in a checkout); it is imported only
when :func:`plot_timeline` runs, with the non-interactive Agg backend.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence, Union

import numpy as np

from .._validate import check_choice, check_positive_int
from ..planning.plans import Plan
from ..planning.simulation import SYNC_MODELS
from .optional import import_optional

__all__ = ["check_plot_path", "plot_timeline"]

PlanSet = Union[Mapping[str, Plan], Sequence[Plan]]

# Two shades per panel so neighbouring micro-batches stand apart; over-capacity in red.
_SHADES = ("#2f6db5", "#8fb8e8")
_OVER = ("#c8372d", "#ee8a80")
_IDLE_FACE = "#eeeeee"
_IDLE_HATCH = "#b0b0b0"
_BOUND = "#d17a00"


def _named(plans: PlanSet) -> list[tuple[str, Plan]]:
    items = list(plans.items()) if isinstance(plans, Mapping) else [(p.strategy, p) for p in plans]
    if not items:
        raise ValueError("plans is empty; pass at least one Plan to plot")
    for name, p in items:
        if not isinstance(p, Plan):
            raise ValueError(f"plans[{name!r}] is a {type(p).__name__}, not a seqbalance Plan")
    return [(str(n), p) for n, p in items]


def _import_pyplot() -> Any:
    matplotlib = import_optional(
        "matplotlib", "plotting",
        'pip install ".[cli]" (in a seqbalance checkout) or pip install matplotlib',
    )  # fmt: skip
    matplotlib.use("Agg", force=True)  # files only; never open a window
    import matplotlib.pyplot as plt

    return plt


def check_plot_path(path: str | os.PathLike[str]) -> None:
    """Raise ValueError unless matplotlib is installed and can write ``path``'s format.

    Cheap (no figure is drawn), so the command line calls it before planning.
    """
    _import_pyplot()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    suffix = os.path.splitext(os.fspath(path))[1].lower().lstrip(".")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if suffix and suffix not in formats:
        raise ValueError(
            f"cannot draw a plot as .{suffix} ({os.fspath(path)}); use one of: "
            + ", ".join(f".{k}" for k in sorted(formats))
        )


def _ranks_shown(busy: np.ndarray, max_ranks: int) -> np.ndarray:
    """All ranks, or the ``max_ranks`` busiest (ties to the lower rank), in rank order."""
    if busy.size <= max_ranks:
        return np.arange(busy.size)
    busiest = np.lexsort((np.arange(busy.size), -busy))[:max_ranks]
    return np.sort(busiest)


def _title(
    name: str, p: Plan, step: float, gap: float, ref: tuple[str, float] | None, shown: int
) -> str:
    parts = [name]
    if ref is not None and ref[0] != name and step > 0:
        ratio = step / ref[1]
        parts.append(f"step time {ratio:.2f}\u00d7 {ref[0]}'s")
    parts.append(f"{gap:+.1%} vs bound")
    parts.append(f"{p.num_micro_batches} micro-batches/rank")
    v = p.violations()
    broken = [f"{v['over_capacity']} over capacity"] if v["over_capacity"] else []
    if v["empty"]:
        broken.append(f"{v['empty']} empty")
    if v["unequal_counts"]:
        broken.append(f"{v['unequal_counts']} ranks with fewer micro-batches")
    parts.append(", ".join(broken) if broken else "no violations")
    if shown < p.dp_size:
        parts.append(f"{shown} busiest of {p.dp_size} ranks shown")
    return "  |  ".join(parts)


def plot_timeline(
    plans: PlanSet,
    path: str | os.PathLike[str],
    *,
    cost: Any = None,
    sync: str = "fsdp",
    max_ranks: int = 16,
    title: str | None = None,
    unit: str = "cost units",
) -> None:
    """Draw the simulated step of each plan as a ranks x time chart and save it.

    One panel per plan on a shared time axis. Each rank is a row; its micro-batches are
    blocks in alternating shades (red where a micro-batch exceeds ``max_tokens``); the time
    it waits is grey and hatched up to the end of the step. A solid line marks each plan's
    step time and a dashed line the lower bound. Panel titles give the step time relative
    to the first plan (or to ``"seqbalance"`` when present), the gap to the bound, the
    micro-batch count and the constraint violations.

    Parameters
    ----------
    plans : dict of str to Plan, or sequence of Plan
        The plans to draw, in panel order; a sequence is labelled by ``Plan.strategy``.
    path : str or path-like
        Output image file (PNG, SVG, PDF: any format matplotlib writes).
    cost : optional
        Cost to simulate with (see :meth:`Plan.simulate`); default: each plan's own costs.
    sync : {"fsdp", "ddp"}
        Sync model of the simulation.
    max_ranks : int
        Rows per panel; with more ranks, the ``max_ranks`` busiest are drawn.
    title : str, optional
        Figure title.
    unit : str
        What the cost measures, for the time axis label (e.g. ``"FLOP"``, ``"tokens"``).

    Raises
    ------
    ValueError
        Bad arguments, or matplotlib is not installed.
    """
    named = _named(plans)
    check_choice(sync, "sync", SYNC_MODELS)
    max_ranks = check_positive_int(max_ranks, "max_ranks")
    sims = [p.simulate(cost, sync) for _, p in named]
    plt = _import_pyplot()
    from matplotlib.collections import PolyCollection
    from matplotlib.legend_handler import HandlerTuple
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter

    names = [n for n, _ in named]
    ref_i = names.index("seqbalance") if "seqbalance" in names else 0
    ref = (names[ref_i], sims[ref_i].step_time) if len(named) > 1 else None
    shown = [_ranks_shown(s.rank_busy, max_ranks) for s in sims]
    heights = [0.75 + 0.24 * len(r) for r in shown]
    top = 0.3 + (0.3 if title else 0.0)  # inches kept for the legend (and title)
    fig_h = top + 0.35 + sum(heights)
    fig, axes = plt.subplots(
        len(named),
        1,
        figsize=(11, fig_h),
        sharex=True,
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    t_max = max(s.step_time for s in sims) or 1.0

    for ax, (name, p), sim, ranks in zip(axes[:, 0], named, sims, shown):
        over = p.microbatch_tokens() > p.max_tokens
        y = np.arange(len(ranks), dtype=np.float64)
        # Idle first: the whole row up to the step end, hatched; busy blocks cover it.
        idle = [rect(0.0, sim.step_time, row) for row in y]
        ax.add_collection(
            PolyCollection(
                idle, facecolors=_IDLE_FACE, edgecolors=_IDLE_HATCH, hatch="///", linewidths=0
            )
        )
        mb = sim.mb_costs[ranks]
        row, j = np.nonzero(np.isfinite(mb) & (mb > 0))
        starts = sim.start[ranks][row, j]
        busy = [rect(a, w, r) for a, w, r in zip(starts, mb[row, j], row.astype(float))]
        colors = [(_OVER if over[ranks[a], b] else _SHADES)[b % 2] for a, b in zip(row, j)]
        ax.add_collection(
            PolyCollection(busy, facecolors=colors, edgecolors="white", linewidths=0.5)
        )
        ax.axvline(sim.step_time, color="black", linewidth=1.6)
        ax.axvline(sim.lower_bound, color=_BOUND, linewidth=1.4, linestyle="--")
        ax.set_yticks(y)
        ax.set_yticklabels([str(r) for r in ranks], fontsize=7 if len(ranks) > 12 else 8)
        ax.set_ylim(len(ranks) - 0.4, -0.6)  # rank 0 on top
        ax.set_ylabel("rank", fontsize=9)
        ax.set_title(
            _title(name, p, sim.step_time, sim.gap, ref, len(ranks)),
            fontsize=9.5,
            loc="left",
            fontweight="bold" if name == names[ref_i] else "normal",
        )
        ax.tick_params(axis="x", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)

    last = axes[-1, 0]
    last.set_xlim(0, t_max * 1.02)
    last.xaxis.set_major_formatter(EngFormatter(sep=""))
    last.set_xlabel(f"simulated time ({unit}, {sync} sync)", fontsize=9)
    handles = [
        (Patch(facecolor=_SHADES[0]), Patch(facecolor=_SHADES[1])),
        (Patch(facecolor=_OVER[0]), Patch(facecolor=_OVER[1])),
        Patch(facecolor=_IDLE_FACE, edgecolor=_IDLE_HATCH, hatch="///"),
        Line2D([], [], color="black", linewidth=1.6),
        Line2D([], [], color=_BOUND, linewidth=1.4, linestyle="--"),
    ]
    labels = [
        "micro-batches (alternating shades)",
        "over max_tokens",
        "idle (waiting for other ranks)",
        "step time",
        "lower bound",
    ]
    fig.legend(
        handles,
        labels,
        handler_map={tuple: HandlerTuple(ndivide=None, pad=0)},
        loc="upper center",
        ncol=len(handles),
        fontsize=8.5,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - (top - 0.3) / fig_h),
    )
    save_figure(plt, fig, path, title, top, fig_h)


def save_figure(plt: Any, fig: Any, path: Any, title: str | None, top: float,
                fig_h: float) -> None:  # fmt: skip
    """Title, layout below a legend band ``top`` inches tall, save, close (both charts)."""
    if title:
        fig.suptitle(title, fontsize=11, y=1 - 0.04 / fig_h, va="top")
    fig.tight_layout(rect=(0, 0, 1, 1 - top / fig_h), pad=0.3, h_pad=0.8)
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)


def rect(left: float, width: float, row: float) -> list[tuple[float, float]]:
    """Corners of a bar of height 0.8 centred on ``row``."""
    lo, hi = row - 0.4, row + 0.4
    return [(left, lo), (left + width, lo), (left + width, hi), (left, hi)]
