"""``--sp-size`` and its options: Ulysses (all-to-all) sequence parallelism on the command line.

Under DeepSpeed-Ulysses (verl's ``ulysses_sequence_parallel_size``) the ``S`` GPUs of a
group share every micro-batch, so ``plan`` and ``compare`` plan ``--dp`` groups as
data-parallel ranks whose micro-batches hold ``S x --max-tokens`` tokens (verl multiplies
its per-GPU budget the same way), priced by a :class:`~seqbalance.costs.UlyssesCost`: one
GPU's share plus the exposed all-to-all. Nothing else in the planner changes. With
``--cp-size C`` too (USP), each of the ``C`` ranks of a CP ring is such a group.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from .checks import MAX_INT, UserError, refuse_stray, refuse_unpriced, stray_options

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
    return stray_options(args, _SP_DEFAULTS)


def check_options(args: argparse.Namespace) -> None:
    """Refuse the ``--sp-*`` options without ``--sp-size > 1`` (and without
    ``--sp-bandwidth``, where they would change nothing), and link values no all-to-all
    has, in the flags' words (before anything is read)."""
    stray = _stray(args)
    if args.sp_size == 1:
        refuse_stray(stray, "--sp-size", "S", "Ulysses sequence parallelism")
        return
    for flag, value, low in (
        ("--sp-bandwidth", args.sp_bandwidth, "> 0"),
        ("--sp-bytes-per-token", args.sp_bytes_per_token, ">= 0"),
        ("--sp-comm-passes", args.sp_comm_passes, ">= 0"),
    ):
        if value is not None and (
            not math.isfinite(value) or value < 0 or (low == "> 0" and value == 0)
        ):
            raise UserError(f"{flag} must be finite and {low}, got {value:g}")
    if args.sp_bandwidth is None and args.cost_per_second is not None and args.cp_size == 1:
        stray.append("--cost-per-second")  # it prices the all-to-all, free without one
    if args.sp_bandwidth is None:
        refuse_unpriced(stray, "the all-to-all", "--sp-bandwidth")


# Units whose rate is known without --cost-per-second (cost units per second).
_KNOWN_RATES = {"s": 1.0, "tok": 1.0}


def rate_of(
    args: argparse.Namespace,
    unit: str,
    bandwidth: float | None,
    flag: str,
    sized: bool = False,
    model: Any = None,
) -> float:
    """``--cost-per-second``, or the default for a cost in ``unit`` ("FLOP": 4e14 FLOP/s,
    "s": 1; a ``model`` that is a UlyssesCost with a bandwidth: its own rate). Priced over
    a link (``flag`` names where its bandwidth came from), a cost in other units must say
    its rate, and so must a token cost whose transfer is ``sized`` (bytes a token given;
    tokens a second are unknown)."""
    from ..costs.context_parallel import FLOPS_PER_SECOND

    if args.cost_per_second is not None:
        return float(args.cost_per_second)
    if getattr(model, "sp_size", None) and getattr(model, "bandwidth", None) is not None:
        return float(model.cost_per_second)  # the rate its all-to-all is priced at
    if unit == "FLOP":
        return FLOPS_PER_SECOND
    if bandwidth is not None and (unit not in _KNOWN_RATES or (unit == "tok" and sized)):
        what = (
            "a token cost (its tokens a second are unknown)" if unit == "tok"
            else f"a --cost in unknown units ({unit!r})" if unit
            else 'a --cost of unknown units (its JSON says no "unit")'
        )  # fmt: skip
        raise UserError(
            f"with {flag} and {what}, pass --cost-per-second (cost units per second: the "
            "achieved FLOP/s for a FLOP count, 1 for seconds, tokens a second for tokens)"
        )
    return _KNOWN_RATES.get(unit, 1.0)


def wrap_cost(choice: Any, args: argparse.Namespace) -> Any:
    """The :class:`~.commands.CostChoice` ``choice`` as one GPU's share under Ulysses
    (``--sp-size > 1``); a cost that already is one (a ``UlyssesCost``, a refit of
    Ulysses timings) is kept when its group size is ``--sp-size``, and noted without it."""
    from dataclasses import replace

    from ..costs import TokenCost, UlyssesCost, ulysses_sp_size

    inner = choice.model if choice.model is not None else TokenCost()
    shared = ulysses_sp_size(inner)
    if args.sp_size == 1:
        if shared is not None:
            note = (
                f"note: the cost is one GPU's share of a Ulysses group of {shared} GPUs; "
                f"pass --sp-size {shared} to plan such groups (--max-tokens per GPU)"
            )
            return replace(choice, notes=[*choice.notes, note])
        return choice
    if shared is not None:
        if shared != args.sp_size:
            raise UserError(
                f"the cost ({choice.label}) is one GPU's share of a Ulysses group of {shared} "
                f"GPUs, not {args.sp_size}; pass --sp-size {shared}, or the cost of one GPU"
            )
        rate = args.cost_per_second is not None and args.cp_size == 1  # (else: the ring's)
        if _stray(args) or rate:
            raise UserError(
                f"the cost ({choice.label}) already prices the all-to-all of its Ulysses "
                "group; drop --sp-bandwidth and the other --sp-* options"
                + (" and --cost-per-second" if rate else "")
            )
        if isinstance(inner, UlyssesCost):  # its label says so
            return choice
        return replace(choice, label=f"{choice.label}, one GPU's share (Ulysses sp={shared})")
    bandwidth = args.sp_bandwidth
    size = args.sp_bytes_per_token
    free = bandwidth is None
    if bandwidth is not None and size is None and getattr(inner, "architecture", None) is None:
        if choice.unit != "tok":
            raise UserError(
                "with --sp-bandwidth and a cost that is not a model's FLOPs (--model), pass "
                "--sp-bytes-per-token (Q, K, V and O bytes of a token over all layers)"
            )
        size, free = 0.0, True  # a token count knows no head sizes: free, as for CP
    sized = args.sp_bytes_per_token is not None
    # Without a bandwidth the all-to-all is free and no rate is needed (--cost-per-second
    # then prices the CP ring only).
    rate = None if bandwidth is None else rate_of(
        args, choice.unit, bandwidth, "--sp-bandwidth", sized=sized
    )
    model = UlyssesCost(
        inner,
        args.sp_size,
        bandwidth=bandwidth,
        cost_per_second=rate,
        bytes_per_token=size,
        comm_passes=args.sp_comm_passes,
    )
    link = "free all-to-all" if free else f"all-to-all at {bandwidth:.3g} B/s"
    label = f"{choice.label}, one GPU's share of Ulysses sp={args.sp_size} ({link})"
    return replace(choice, model=model, label=label)


def group_capacity(args: argparse.Namespace, max_tokens: int) -> int:
    """Tokens one micro-batch of a group holds: ``--sp-size x`` the per-GPU ``max_tokens``.

    Raises
    ------
    UserError
        When the product passes 2**53, the exactness limit of every integer flag.
    """
    cap = int(args.sp_size) * int(max_tokens)
    if cap > MAX_INT:
        raise UserError(
            f"--sp-size x --max-tokens = {cap} is too large: at most 2**53 = {MAX_INT} "
            "(larger integers are not exact in the float64 arithmetic of costs and times)"
        )
    return cap
