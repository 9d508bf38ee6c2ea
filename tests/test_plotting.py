"""Tests of seqbalance.plotting.plot_timeline: what is drawn, and its errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from seqbalance.cli.plotting import _ranks_shown, plot_timeline
from seqbalance.planning.baselines import BASELINES
from seqbalance.planning.planner import plan

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def plans():
    lengths = np.random.default_rng(0).integers(100, 3000, size=120)
    out = {"seqbalance": plan(lengths, 4, 8192)}
    out.update({k: f(lengths, 4, 8192) for k, f in BASELINES.items()})
    return out


@pytest.fixture
def captured(monkeypatch):
    """Keep the figure plot_timeline closes, to inspect what it drew."""
    import matplotlib.pyplot as plt

    figs = []
    monkeypatch.setattr(plt, "close", figs.append)
    return figs


def test_writes_png(plans, tmp_path):
    path = tmp_path / "t.png"
    plot_timeline(plans, path, title="demo")
    assert path.read_bytes()[:8] == PNG_MAGIC


@pytest.mark.slow
def test_panels_blocks_and_lines(plans, tmp_path, captured):
    plot_timeline(plans, tmp_path / "t.png")
    (fig,) = captured
    axes = fig.axes
    assert len(axes) == len(plans)
    for ax, (name, p) in zip(axes, plans.items()):
        sim = p.simulate()
        assert ax.get_title(loc="left").startswith(name)
        idle, busy = ax.collections
        assert len(idle.get_paths()) == p.dp_size  # one idle row per rank
        assert idle.get_hatch() == "///"
        # One block per non-empty micro-batch, as wide as its simulated cost.
        assert len(busy.get_paths()) == int((sim.mb_costs > 0).sum())
        widths = sorted(np.ptp(path.vertices[:, 0]) for path in busy.get_paths())
        np.testing.assert_allclose(widths, np.sort(sim.mb_costs[sim.mb_costs > 0]))
        xs = sorted(line.get_xdata()[0] for line in ax.lines)
        assert xs == pytest.approx(sorted([sim.step_time, sim.lower_bound]))
    # Titles: relative step time against seqbalance, and violations where there are any.
    seq = plans["sequential"]
    ratio = seq.simulate().step_time / plans["seqbalance"].simulate().step_time
    assert f"{ratio:.2f}\u00d7 seqbalance" in axes[1].get_title(loc="left")
    assert "no violations" in axes[0].get_title(loc="left")
    for ax, p in zip(axes, plans.values()):
        n_over = p.violations()["over_capacity"]
        assert (f"{n_over} over capacity" in ax.get_title(loc="left")) == (n_over > 0)


@pytest.mark.slow
def test_many_ranks_shows_the_busiest(tmp_path, captured):
    lengths = np.random.default_rng(1).integers(100, 3000, size=400)
    p = plan(lengths, 40, 8192)
    plot_timeline([p], tmp_path / "t.png", max_ranks=6)
    (ax,) = captured[0].axes
    sim = p.simulate()
    shown = [int(t.get_text()) for t in ax.get_yticklabels()]
    assert len(shown) == 6 and shown == sorted(shown)
    # No rank left out is busier than a rank shown.
    hidden = np.setdiff1d(np.arange(40), shown)
    assert sim.rank_busy[hidden].max() <= sim.rank_busy[shown].min()
    assert "6 busiest of 40 ranks shown" in ax.get_title(loc="left")


def test_ranks_shown_ties_to_lower_rank():
    busy = np.array([1.0, 5.0, 3.0, 5.0, 0.0, 3.0])
    assert _ranks_shown(busy, 3).tolist() == [1, 2, 3]
    assert _ranks_shown(busy, 10).tolist() == list(range(6))


@pytest.mark.slow
def test_list_input_labels_by_strategy(plans, tmp_path, captured):
    plot_timeline(list(plans.values()), tmp_path / "t.png", sync="ddp")
    titles = [ax.get_title(loc="left") for ax in captured[0].axes]
    assert [t.split()[0] for t in titles] == list(plans)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"plans": {}}, "plans is empty"),
        ({"plans": {"x": [1, 2]}}, "not a seqbalance Plan"),
        ({"sync": "nccl"}, "sync must be one of"),
        ({"max_ranks": 0}, "max_ranks must be >= 1"),
    ],
)
def test_bad_arguments(plans, tmp_path, kwargs, match):
    args = {"plans": plans, **kwargs}
    with pytest.raises(ValueError, match=match):
        plot_timeline(args.pop("plans"), tmp_path / "t.png", **args)


def test_without_matplotlib_says_how_to_install(plans, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match=r'pip install "\.\[cli\]"'):
        plot_timeline(plans, tmp_path / "t.png")


@pytest.mark.slow
def test_cli_plot(tmp_path):
    from seqbalance.cli.commands import main

    lengths = tmp_path / "l.json"
    lengths.write_text("[" + ",".join(str(100 + 37 * i % 2900) for i in range(200)) + "]")
    out = tmp_path / "cmp.png"
    argv = ["compare", str(lengths), "--dp", "4", "--max-tokens", "8192", "--plot", str(out)]
    assert main(argv) == 0
    assert out.read_bytes()[:8] == PNG_MAGIC
