"""The ``count_raised`` note, which of them a count search drops or restates, and which
notes on a count state amounts of tokens.

The note says why a plan has more micro-batches per rank than the capacity needs
(``min_micro_batches``, ``micro_batch_multiple``, a pipeline schedule's multiple). A search
that plans a larger count asks for it with ``min_micro_batches``, and static context
parallelism plans its replicas at the schedule's multiple; the note would then blame an
argument the caller did not pass. Those callers drop or restate it by its kind and
fields, never by its words.
"""

from __future__ import annotations

from collections.abc import Iterable

from .._notes import Note, as_note, as_text, term

__all__ = ["count_raised", "states_tokens", "with_asked_multiple", "without_raised_to"]

# The planner's notes that speak of tokens (the capacity, a rank's tokens under a rule,
# ranks split by tokens); a count_fixed note does where the capacity raised the count, a
# won_full_rank note where the ranks were split by tokens.
_TOKEN_KINDS = frozenset({"count_bins", "count_padded", "count_rule", "count_not_found",
                          "count_alone"})  # fmt: skip


def states_tokens(note: Note) -> bool:
    """Whether ``note`` speaks of the sequences' tokens (static CP's replica plans count each
    sequence's largest piece as its tokens, and say so beside such a note)."""
    f = note.fields
    return (
        note.kind in _TOKEN_KINDS
        or (note.kind == "count_fixed" and f.get("reason") == "capacity")
        or (note.kind == "won_full_rank" and f.get("by") == "tokens")
    )


def count_raised(
    count: int, needed: int, m_min: int, mult: int, *, schedule: str | None = None,
    pp_size: int | None = None, by_schedule: bool = False, asked: int | None = None,
) -> Note:
    """Why ``count`` micro-batches per rank where the capacity alone needs ``needed``:
    ``min_micro_batches=m_min`` and the multiple ``mult``, which is ``micro_batch_multiple``
    and (``by_schedule``) the ``schedule``'s multiple on ``pp_size`` stages, or (``asked``
    given) the caller's ``micro_batch_multiple=asked`` raised to ``mult`` by the
    ``schedule``."""
    why = []
    if m_min > needed:
        why.append("{@min_micro_batches:{m_min}}")
    if count > max(needed, m_min):
        if by_schedule:
            why.append("rounded up to a multiple of {mult} ({@micro_batch_multiple} and the "
                       "{schedule} schedule's multiple of {@pp_size:{pp_size}})")  # fmt: skip
        elif asked is not None:
            why.append("rounded up to a multiple of {@micro_batch_multiple:{asked}} (raised to "
                       "{mult} by {@schedule:{schedule!r}})")  # fmt: skip
        else:
            why.append("rounded up to a multiple of {@micro_batch_multiple:{mult}}")
    fields = {"count": count, "needed": needed, "m_min": m_min, "mult": mult,
              "schedule": schedule, "pp_size": pp_size}  # fmt: skip
    if asked is not None:
        fields["asked"] = asked
    return Note(
        "count_raised", fields,
        "{count} micro-batches per " + term("rank") + " where the capacity alone needs "
        "{needed}: " + " and ".join(why),
    )  # fmt: skip


def with_asked_multiple(
    notes: Iterable[str], asked: int, mult: int, schedule: str
) -> tuple[str, ...]:
    """``notes`` with the ``count_raised`` note of a plan made at the multiple ``mult``
    restated: the caller asked for ``micro_batch_multiple=asked``, and the ``schedule``
    raised it (static CP's replicas planned without their pipeline). In the words of the
    planning call running now (:func:`.term`)."""

    def restated(text: str) -> str:
        note = as_note(text)
        f = note.fields
        if note.kind != "count_raised" or f.get("mult") != mult or "asked" in f:
            return text
        return as_text(count_raised(f["count"], f["needed"], f["m_min"], mult,
                                    schedule=schedule, pp_size=f.get("pp_size"),
                                    asked=asked))  # fmt: skip

    return tuple(restated(n) for n in notes)


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
