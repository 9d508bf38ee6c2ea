"""Pipeline output of ``seqbalance compare --pp-size P``: the order table and the stage timeline.

The planner's pipelined plan is compared with the same micro-batches run in each baseline
order (:data:`seqbalance.planning.pipeline_orders.ORDERS`). matplotlib is imported only by
:func:`plot_pipeline`.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Sequence, TextIO

import numpy as np

from ..partitioning.stats import relative_gap
from ..planning.pipeline_orders import ORDERS
from ..planning.pipeline_plans import reorder
from ..planning.plans import Plan

__all__ = ["order_plans", "pipeline_results", "plot_pipeline", "print_pipeline"]


def order_plans(plan: Plan) -> dict[str, Plan]:
    """The planner's plan and its micro-batches in every baseline order, by name."""
    out = {"seqbalance": plan}
    for name in ORDERS:
        out[name] = reorder(plan, name)
    return out


def pipeline_results(plans: Mapping[str, Plan]) -> list[dict[str, Any]]:
    """One row per order: simulated pipeline step, ratio to seqbalance, gap, bubble."""
    sims = {name: p.simulate_pipeline() for name, p in plans.items()}
    ref = sims["seqbalance"].step_time
    bound = sims["seqbalance"].lower_bound  # same micro-batches: the same bound for all
    rows = []
    for name, sim in sims.items():
        spec = plans[name].pipeline.spec
        rows.append(
            {
                "order": name,
                "pp_size": spec.pp_size,
                "schedule": spec.schedule,
                "virtual_stages": spec.virtual_stages,
                "step_time": sim.step_time,
                "vs_seqbalance": sim.step_time / ref if ref else None,
                "lower_bound": bound,
                "gap": relative_gap(sim.step_time, bound),
                "bubble": sim.bubble_fraction,
            }
        )
    return rows


def print_pipeline(
    rows: Sequence[dict[str, Any]],
    si: Callable[[float, str], str],
    unit: str,
    table: Callable[[Sequence[str], Sequence[Sequence[str]], TextIO], None],
    out: TextIO,
) -> None:
    """Print the order table with the CLI's formatter ``si`` and table printer ``table``."""
    headers = ["order", "pipeline step", "vs seqbalance", "gap", "bubble"]
    cells = [
        [
            r["order"],
            si(r["step_time"], unit),
            "-" if r["vs_seqbalance"] is None else f"{r['vs_seqbalance']:.3f}x",
            f"{r['gap']:+.1%}",
            f"{r['bubble']:.1%}",
        ]
        for r in rows
    ]
    table(headers, cells, out)


_FWD = "#8fb8e8"
_BWD = "#2f6db5"
_IDLE_FACE = "#eeeeee"
_IDLE_HATCH = "#b0b0b0"
_BOUND = "#d17a00"


def plot_pipeline(
    plans: Mapping[str, Plan],
    path: str | os.PathLike[str],
    *,
    title: str | None = None,
    unit: str = "cost units",
) -> None:
    """Draw the pipeline that sets the step of each plan: stages x time, one panel per plan.

    Forward blocks light, backward blocks dark, each labelled with the micro-batch's
    position in the run order where it fits; idle time hatched; a solid line at the step
    time and a dashed one at the lower bound.
    """
    from .plotting import _import_pyplot, rect, save_figure

    plt = _import_pyplot()
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import EngFormatter

    named = list(plans.items())
    sims = [p.simulate_pipeline() for _, p in named]
    p_size = max(s.slowest.spec.pp_size for s in sims)
    heights = [0.8 + 0.3 * p_size for _ in named]
    fig_h = 1.2 + sum(heights)
    fig, axes = plt.subplots(
        len(named),
        1,
        figsize=(12, fig_h),
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    t_max = max(s.step_time for s in sims) or 1.0
    ref = sims[0].step_time
    for ax, (name, _), sim in zip(axes[:, 0], named, sims):
        pipe = sim.slowest
        p = pipe.spec.pp_size
        ax.add_collection(
            PolyCollection(
                [rect(0.0, sim.step_time, s) for s in range(p)],
                facecolors=_IDLE_FACE,
                edgecolors=_IDLE_HATCH,
                hatch="///",
                linewidths=0,
            )
        )
        width = pipe.end - pipe.start
        blocks = [rect(a, w, s) for a, w, s in zip(pipe.start, width, pipe.stage)]
        colors = [_FWD if ph == 0 else _BWD for ph in pipe.phase]
        ax.add_collection(
            PolyCollection(blocks, facecolors=colors, edgecolors="white", linewidths=0.4)
        )
        for a, w, s, ph, pos in zip(pipe.start, width, pipe.stage, pipe.phase, pipe.position):
            if w > t_max / 90:  # label only blocks wide enough for a number
                ax.text(
                    a + w / 2,
                    s,
                    str(pos),
                    ha="center",
                    va="center",
                    fontsize=6,
                    color="black" if ph == 0 else "white",
                )
        ax.axvline(sim.step_time, color="black", linewidth=1.5)
        ax.axvline(sim.lower_bound, color=_BOUND, linewidth=1.3, linestyle="--")
        ax.set_yticks(np.arange(p))
        ax.set_yticklabels([str(s) for s in range(p)], fontsize=8)
        ax.set_ylim(p - 0.4, -0.6)
        ax.set_ylabel("stage", fontsize=9)
        spec = pipe.spec
        layout = spec.schedule + (f" v={spec.virtual_stages}" if spec.virtual_stages > 1 else "")
        ratio = f"{sim.step_time / ref:.3f}\u00d7 seqbalance  |  " if name != named[0][0] else ""
        ax.set_title(
            f"{name}  |  {ratio}{sim.gap:+.1%} vs bound  |  bubble {pipe.bubble_fraction:.1%}"
            f"  |  {layout}, {pipe.forward.size} micro-batches",
            fontsize=9.5,
            loc="left",
            fontweight="bold" if name == named[0][0] else "normal",
        )
        ax.tick_params(axis="x", labelsize=8)
        ax.spines[["top", "right"]].set_visible(False)
    last = axes[-1, 0]
    last.set_xlim(0, t_max * 1.02)
    last.xaxis.set_major_formatter(EngFormatter(sep=""))
    last.set_xlabel(f"simulated time ({unit}); the replica that sets the step", fontsize=9)
    handles = [
        Patch(facecolor=_FWD),
        Patch(facecolor=_BWD),
        Patch(facecolor=_IDLE_FACE, edgecolor=_IDLE_HATCH, hatch="///"),
        Line2D([], [], color="black", linewidth=1.5),
        Line2D([], [], color=_BOUND, linewidth=1.3, linestyle="--"),
    ]
    labels = ["forward (run position)", "backward", "bubble", "step time", "lower bound"]
    top = 0.35 + (0.3 if title else 0.0)  # inches kept for the legend (and title)
    fig.legend(
        handles,
        labels,
        loc="upper center",
        ncol=5,
        fontsize=8.5,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - (top - 0.35) / fig_h),
    )
    save_figure(plt, fig, path, title, top, fig_h)
