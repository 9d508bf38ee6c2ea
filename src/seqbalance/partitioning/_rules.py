"""Size rules shared by the partitioners and the lower bound.

A size rule says how many items (or groups, when groups are given) each of the ``k``
parts may hold:

``"free"``      any count, empty parts allowed;
``"equal"``     exactly ``m / k`` per part (``m`` must be a multiple of ``k``);
``"balanced"``  ``m // k`` or ``m // k + 1`` per part (so counts differ by at most one).
"""

from __future__ import annotations

from .._notes import Note
from .._validate import ArgumentError, check_choice

SIZES: tuple[str, ...] = ("free", "equal", "balanced")


def check_size(size: object, m: int, k: int, *, grouped: bool = False) -> str:
    """Validate ``size`` and check that ``m`` counted units can meet it on ``k`` parts.

    Returns the size rule. Raises a ValueError for an unknown rule or for ``"equal"``
    when ``m`` is not a multiple of ``k``.
    """
    rule = check_choice(size, "size", SIZES)
    if rule == "equal" and m % k != 0:
        unit = "groups" if grouped else "items"
        raise ArgumentError(Note(
            "size_equal", {"unit": unit, "m": m, "k": k, "rest": m % k},
            '{@size:"equal"} needs the number of {unit} to be a {@multiple of k}, but there '
            "are {m} {unit} and {@k:{k}} ({m} % {k} = {rest}); use {@size:\"balanced\"} to "
            "allow counts that differ by one"
            + (", or regroup the items" if grouped else ", or drop/pad items"),
        ), argument="size")  # fmt: skip
    return rule


def min_count(m: int, k: int, size: str) -> int:
    """The fewest units any part holds under ``size`` (0 for ``"free"``)."""
    return 0 if size == "free" else m // k
