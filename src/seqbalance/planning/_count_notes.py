"""Which notes a count search drops from the plans it makes.

A search that plans a larger count asks for it with ``min_micro_batches``; the plan's
``count_raised`` note (made where the starting count is chosen) would then blame an
argument the caller did not pass. The search says why in a note of its own, and drops
that one by its kind and fields, never by its words.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._notes import as_note

__all__ = ["without_raised_to"]


def without_raised_to(notes: Iterable[str], m: int) -> tuple[str, ...]:
    """``notes`` less the ``count_raised`` note that names ``min_micro_batches=m`` (the
    count was raised above what the capacity needs because ``m`` was asked for)."""

    def names_m(text: str) -> bool:
        note = as_note(text)
        if note.kind != "count_raised":
            return False
        f = note.fields
        return bool(f["m_min"] == m and f["m_min"] > f["needed"])

    return tuple(n for n in notes if not names_m(n))
