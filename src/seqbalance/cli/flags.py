"""The command line's words for the library's terms: each argument's flag.

Library notes and errors are :class:`~seqbalance.Note`\\ s whose terms (``{@max_tokens}``)
name :func:`seqbalance.plan`'s arguments; the command line shows them with these words
(``--max-tokens``), and an :class:`~seqbalance.ArgumentError` names its flag through the
same table (:data:`FLAGS`, by ``.argument``). Nothing here reads a message's text.
"""

from __future__ import annotations

from collections.abc import Mapping

from .._notes import Note, NotedError, as_note

__all__ = ["FLAGS", "WORDS", "flag_of", "shown", "words_for"]

#: plan()'s argument (or a costs object's field) -> the flag that sets it.
FLAGS: Mapping[str, str] = {
    "dp_size": "--dp",
    "k": "--dp",  # partition()'s number of parts is the number of ranks here
    "max_tokens": "--max-tokens",
    "min_micro_batches": "--min-micro-batches",
    "micro_batch_multiple": "--micro-batch-multiple",
    "extra_micro_batches": "--extra-micro-batches",
    "pp_size": "--pp-size",
    "virtual_stages": "--virtual-stages",
    "pp_comm": "--pp-comm",
    "schedule": "--schedule",
    "size": "--size",
    "groups": "--groups-column",
    "cp_size": "--cp-size",
    "sp_size": "--sp-size",
    "cost_per_second": "--cost-per-second",
    "overlap": "--cp-overlap",
    "bandwidth": "--cp-bandwidth",
    "kv_bytes_per_token": "--kv-bytes-per-token",
    "comm_passes": "--cp-comm-passes",
}

# Terms that read differently as flags than as a name plus "=".
_PHRASES: Mapping[str, str] = {
    "allow_empty=True": "--allow-empty",
    "padded=True": "--padded",
    "multiple of k": "multiple of --dp",
    "and groups": "and --groups-column",
    "cp_size or max_tokens": "--cp-size or --max-tokens",
    "bandwidth must be > 0 bytes/s (or None for free communication)":
        "--cp-bandwidth must be > 0 bytes/s (leave it out for free communication)",
    "with bandwidth= and a cost that is not a FlopsCost, pass kv_bytes_per_token=":
        "with --cp-bandwidth and a cost that is not a model's FLOPs (--model), pass "
        "--kv-bytes-per-token",
}  # fmt: skip

# A choice takes its value after a space, unquoted: size='equal' -> --size equal.
_CHOICES = ("size", "schedule")


def _words() -> dict[str, str]:
    words = {**FLAGS, **_PHRASES}
    for name, flag in FLAGS.items():
        words[f"{name} = "] = f"{flag} "  # "overlap = 2.0 is invalid" -> "--cp-overlap 2.0 ..."
    words.update({f"{name}=": f"--{name} " for name in _CHOICES})
    return words


#: The terms of library messages in the command line's words.
WORDS: Mapping[str, str] = _words()

# Under --sp-size the planner's capacity is --sp-size x --max-tokens, and in a CP ring its
# "GPUs" are Ulysses groups.
_SP_WORDS: Mapping[str, str] = {
    "max_tokens=": "--sp-size x --max-tokens=",
    "cp_size or max_tokens": "--cp-size, --sp-size or --max-tokens",
}
_RING_WORDS: Mapping[str, str] = {"GPUs": "Ulysses groups"}


def flag_of(argument: str) -> str:
    """The flag that sets ``argument`` (``"dp_size"`` -> ``"--dp"``); the argument itself
    when no flag does."""
    return FLAGS.get(argument, argument)


def words_for(sp_size: int = 1, cp_size: int = 1) -> dict[str, str]:
    """:data:`WORDS`, with those of a planner under ``--sp-size`` (and a ``--cp-size`` ring)."""
    words = dict(WORDS)
    if sp_size > 1:
        words.update(_SP_WORDS)
        if cp_size > 1:
            words.update(_RING_WORDS)
    return words


def shown(message: str | Note | BaseException, words: Mapping[str, str] | None = None) -> str:
    """A library note or error as the command line shows it: its terms as flags. Plain
    text (a message made without terms) is shown as it is."""
    if isinstance(message, NotedError):
        message = message.note
    elif isinstance(message, BaseException):
        return str(message)
    return as_note(message).render(WORDS if words is None else words)
