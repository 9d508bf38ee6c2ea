"""``--sp-size`` and its options: Ulysses (all-to-all) sequence parallelism on the command line.

Under DeepSpeed-Ulysses (verl's ``ulysses_sequence_parallel_size``) the ``S`` GPUs of a
group share every micro-batch, so ``plan`` and ``compare`` plan ``--dp`` groups as
data-parallel ranks whose micro-batches hold ``S x --max-tokens`` tokens (verl multiplies
its per-GPU budget the same way), priced by a :class:`~seqbalance.costs.UlyssesCost`: one
GPU's share plus the exposed all-to-all. Nothing else in the planner changes.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .checks import UserError

__all__ = ["add_arguments", "check_options", "group_capacity", "rate_of", "wrap_cost"]

#: Defaults of the options that act only with ``--sp-size > 1``.
_SP_DEFAULTS: dict[str, Any] = {
    "sp_bandwidth": None,
    "sp_bytes_per_token": None,
    "sp_comm_passes": 2.0,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``--sp-*`` options of ``plan`` and ``compare``."""
    g = p.add_argument_group(
        "Ulysses sequence parallelism (--dp groups of S GPUs share each micro-batch; "
        "--max-tokens per GPU)"
    )
    g.add_argument(
        "--sp-size",
        type=int,
        default=1,
        metavar="S",
        help="GPUs per Ulysses group (verl's ulysses_sequence_parallel_size); each "
        "micro-batch holds S x --max-tokens tokens; must split the model's heads",
    )
    g.add_argument(
        "--sp-bandwidth",
        type=float,
        default=_SP_DEFAULTS["sp_bandwidth"],
        metavar="B",
        help="bytes/s per GPU of the all-to-all (e.g. 1.5e11 NVLink, 2.5e10 inter-node); "
        "default: communication is free",
    )
    g.add_argument(
        "--sp-bytes-per-token",
        type=float,
        default=_SP_DEFAULTS["sp_bytes_per_token"],
        metavar="X",
        help="Q, K, V and O bytes of one token over all layers (default: from --model's "
        "architecture; needed with --sp-bandwidth and a --cost)",
    )
    g.add_argument(
        "--sp-comm-passes",
        type=float,
        default=_SP_DEFAULTS["sp_comm_passes"],
        metavar="N",
        help="times the all-to-all volume is exchanged per step (default 2: forward and "
        "backward; 1 for a forward-only pass)",
    )


def _stray(args: argparse.Namespace) -> list[str]:
    return [
        "--" + key.replace("_", "-")
        for key, default in _SP_DEFAULTS.items()
        if getattr(args, key) != default
    ]


def check_options(args: argparse.Namespace) -> None:
    """Refuse the ``--sp-*`` options without ``--sp-size > 1``, Ulysses with ring CP, and
    link values no all-to-all has, in the flags' words (before anything is read)."""
    stray = _stray(args)
    if args.sp_size == 1:
        if stray:
            one = len(stray) == 1
            raise UserError(
                f"{', '.join(stray)} only {'applies' if one else 'apply'} with --sp-size > 1 "
                f"(Ulysses sequence parallelism); pass --sp-size S, or drop "
                f"{'it' if one else 'them'}"
            )
        return
    if args.cp_size != 1:
        raise UserError(
            "--sp-size and --cp-size together (Ulysses with ring context parallelism) are "
            "not modelled; plan one of the two"
        )
    for flag, value, low in (
        ("--sp-bandwidth", args.sp_bandwidth, "> 0"),
        ("--sp-bytes-per-token", args.sp_bytes_per_token, ">= 0"),
        ("--sp-comm-passes", args.sp_comm_passes, ">= 0"),
    ):
        if value is not None and (
            not math.isfinite(value) or value < 0 or (low == "> 0" and value == 0)
        ):
            raise UserError(f"{flag} must be finite and {low}, got {value:g}")
    if args.sp_bandwidth is None and stray:
        one = len(stray) == 1
        raise UserError(
            f"{' and '.join(stray)} {'sizes' if one else 'size'} the all-to-all, which is free "
            f"without --sp-bandwidth: give --sp-bandwidth too, or drop {'it' if one else 'them'}"
        )


def rate_of(args: argparse.Namespace, unit: str, bandwidth: float | None, flag: str) -> float:
    """``--cost-per-second``, or the default for a cost in ``unit`` ("FLOP": 4e14 FLOP/s,
    "s" and "tok": 1); a cost of unknown units priced over a link (``flag`` gave its
    bandwidth) must say its rate."""
    from ..costs.context_parallel import FLOPS_PER_SECOND

    if args.cost_per_second is not None:
        return float(args.cost_per_second)
    if unit == "FLOP":
        return FLOPS_PER_SECOND
    if unit == "" and bandwidth is not None:
        raise UserError(
            f"with {flag} and a --cost of unknown units (its JSON says no \"unit\"), pass "
            "--cost-per-second (cost units per second: the achieved FLOP/s for a FLOP count, "
            "1 for seconds)"
        )
    return 1.0


def wrap_cost(choice: Any, args: argparse.Namespace) -> Any:
    """The :class:`~.commands.CostChoice` ``choice`` as one GPU's share under Ulysses
    (``--sp-size > 1``), or ``choice`` itself."""
    if args.sp_size == 1:
        return choice
    from dataclasses import replace

    from ..costs import TokenCost, UlyssesCost

    inner = choice.model if choice.model is not None else TokenCost()
    if isinstance(inner, UlyssesCost):
        raise UserError(
            f"the cost ({choice.label}) is already one GPU's share of a Ulysses group of "
            f"{inner.sp_size} GPUs; drop --sp-size, or give the cost of one GPU"
        )
    bandwidth = args.sp_bandwidth
    size = args.sp_bytes_per_token
    if bandwidth is not None and size is None and choice.unit != "FLOP":
        if choice.unit != "tok":
            raise UserError(
                "with --sp-bandwidth and a cost that is not a model's FLOPs (--model), pass "
                "--sp-bytes-per-token (Q, K, V and O bytes of a token over all layers)"
            )
        size = 0.0  # a token count knows no head sizes: the all-to-all is free, as for CP
    model = UlyssesCost(
        inner,
        args.sp_size,
        bandwidth=bandwidth,
        cost_per_second=rate_of(args, choice.unit, bandwidth, "--sp-bandwidth"),
        bytes_per_token=size,
        comm_passes=args.sp_comm_passes,
    )
    link = "free all-to-all" if bandwidth is None else f"all-to-all at {bandwidth:.3g} B/s"
    return replace(
        choice, model=model, label=f"{choice.label}, one GPU's share of Ulysses sp={args.sp_size} "
        f"({link})"
    )


def group_capacity(args: argparse.Namespace, max_tokens: int) -> int:
    """Tokens one micro-batch of a group holds: ``--sp-size x`` the per-GPU ``max_tokens``."""
    return int(args.sp_size) * int(max_tokens)
