"""Notes and error messages as data: a kind, its fields, and the words to write them in.

A planner's note ("3 sequences longer than max_tokens=8192 run alone") is made once, as a
:class:`Note`, and written out as text only where it reaches a person. Its template names
the values it shows (``{count}``) and, apart from them, the *terms* it uses
(``{@max_tokens}``, ``{@rank}``): the words that depend on who reads it. Python callers read
``max_tokens`` and ``rank``; the command line renders the same note with its flag table
(``--max-tokens``), static context parallelism with ``rank -> replica``. Nothing rewrites a
finished string.
"""

from __future__ import annotations

import contextlib
import contextvars
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "REPLICA_WORDS",
    "Note",
    "NoteText",
    "NotedError",
    "arg",
    "as_note",
    "as_text",
    "term",
    "using_words",
]

#: Static context parallelism plans its replicas with :func:`seqbalance.plan`, whose ranks
#: are the replicas there.
REPLICA_WORDS: Mapping[str, str] = MappingProxyType({"rank": "replica", "ranks": "replicas"})


_WORDS: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "seqbalance_words", default=MappingProxyType({})
)


def term(name: str) -> str:
    """``name`` (``"rank"``, ``"ranks"``) in the words of the planning call running now:
    static CP plans its replicas inside :func:`using_words` ``(REPLICA_WORDS)``, so a
    message made there says "replica" from the start."""
    return _WORDS.get().get(name, name)


@contextlib.contextmanager
def using_words(words: Mapping[str, str]) -> Iterator[None]:
    """Make :func:`term` answer from ``words`` inside the block (this thread or task)."""
    token = _WORDS.set(MappingProxyType({**_WORDS.get(), **words}))
    try:
        yield
    finally:
        _WORDS.reset(token)


class _Formatter(string.Formatter):
    """``{@term}`` from the words (the term itself when they have none), the rest from
    the note's fields.

    A term may carry the value it was given, as written in Python, after a colon:
    ``{@max_tokens:{cap}}`` reads ``max_tokens=8192``, or with ``words={"max_tokens":
    "--max-tokens"}`` ``--max-tokens=8192``; a word for ``"size="`` (``"--size "``) takes
    the value unquoted instead: ``{@size:{size!r}}`` reads ``size='equal'`` or
    ``--size equal``.
    """

    def __init__(self, words: Mapping[str, str]) -> None:
        self.words = words

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        if field_name.startswith("@"):
            return _Term(field_name[1:]), field_name
        return super().get_field(field_name, args, kwargs)

    def format_field(self, value: Any, format_spec: str) -> Any:
        if isinstance(value, (Note, NoteText)):  # a note inside a note: the same words
            return format(as_note(value).render(self.words), format_spec)
        if not isinstance(value, _Term):
            return super().format_field(value, format_spec)
        word = self.words.get(value.name, value.name)
        if not format_spec:
            return word
        prefix = self.words.get(value.name + "=")
        if prefix is None:
            return f"{word}={format_spec}"
        return prefix + format_spec.strip("'\"")


@dataclass(frozen=True)
class _Term:
    name: str


@dataclass(frozen=True)
class Note:
    """One note of a plan, or one error message, as data.

    Parameters
    ----------
    kind : str
        What the note is about, stable across wording changes (``"oversized_alone"``,
        ``"text"`` for a note made from plain text).
    fields : mapping of str to value
        The values the note reports (counts, sizes, step times).
    template : str
        How the note reads, in :meth:`str.format` syntax over ``fields``; ``{@name}``
        marks a term (an argument's name, the word for a rank) that :meth:`render` takes
        from its ``words``; ``{@name:value}`` a term given a value (``max_tokens=8192``).
        Default: the ``text`` field as it is.
    words : mapping of str to str
        Words the note is already written in (static CP's ``{"rank": "replica"}``); those
        passed to :meth:`render` come on top.

    Examples
    --------
    >>> note = Note("oversized_alone", {"count": 3, "cap": 8192},
    ...             "{count} sequences longer than {@max_tokens:{cap}} run alone")
    >>> str(note)
    '3 sequences longer than max_tokens=8192 run alone'
    >>> note.render({"max_tokens": "--max-tokens"})
    '3 sequences longer than --max-tokens=8192 run alone'
    """

    kind: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    template: str = "{text}"
    #: Words the note is already written in (static CP's ``rank -> replica``); the
    #: reader's words in :meth:`render` come on top.
    words: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))
        object.__setattr__(self, "words", MappingProxyType(dict(self.words)))

    @classmethod
    def text(cls, text: str) -> Note:
        """A note that is only ``text`` (it names no term)."""
        return cls("text", {"text": text})

    def render(self, words: Mapping[str, str] | None = None) -> str:
        """The note as text; ``words`` maps terms to the reader's words (default: as
        :func:`seqbalance.plan` spells them)."""
        merged = {**self.words, **(words or {})}
        return _Formatter(merged).vformat(self.template, (), dict(self.fields))

    def with_fields(self, template: str | None = None, **fields: Any) -> Note:
        """This note with more (or changed) fields, and optionally another template."""
        return Note(self.kind, {**self.fields, **fields},
                    self.template if template is None else template, self.words)  # fmt: skip

    def after(self, prefix: str) -> Note:
        """This note with the plain text ``prefix`` before it (``"static CP: "``)."""
        escaped = prefix.replace("{", "{{").replace("}", "}}")
        return Note(self.kind, self.fields, escaped + self.template, self.words)

    def in_words(self, words: Mapping[str, str]) -> Note:
        """This note written in ``words`` from now on (``REPLICA_WORDS``: its ranks are
        replicas)."""
        return Note(self.kind, self.fields, self.template, {**self.words, **words})

    def __str__(self) -> str:
        return self.render()

    def __hash__(self) -> int:
        # Equal notes have equal kinds and templates (the fields' values may be unhashable).
        return hash((self.kind, self.template))

    def __reduce__(self) -> Any:  # MappingProxyType does not pickle
        return (Note, (self.kind, dict(self.fields), self.template, dict(self.words)))


class NoteText(str):
    """A note's text (in :func:`seqbalance.plan`'s words) that keeps its :class:`Note`:
    notes passed on as text (``(*plan.notes, extra)``) keep their kind and fields."""

    note: Note

    def __new__(cls, note: Note) -> NoteText:
        self = super().__new__(cls, note.render())
        self.note = note
        return self

    def __str__(self) -> str:  # str(text) keeps the note too
        return self

    def __reduce__(self) -> Any:
        return (NoteText, (self.note,))


def as_text(note: str | Note) -> str:
    """``note`` as text that keeps its note (a plain string stays as it is)."""
    return note if isinstance(note, str) else NoteText(note)


def arg(name: str, suffix: str = "") -> str:
    """``name`` (an argument's name or a phrase, then ``suffix``) as a term of a template,
    ``{@name}``; one that cannot be a term (it holds ``{}:!``) is written as it is."""
    term = name + suffix
    if set(term) & set("{}:!"):
        return term.replace("{", "{{").replace("}", "}}")
    return "{@" + term + "}"


def as_note(note: str | Note) -> Note:
    """``note`` as a :class:`Note`: a :class:`NoteText`'s own, a ``"text"`` note for other
    strings."""
    if isinstance(note, NoteText):
        return note.note
    return Note.text(note) if isinstance(note, str) else note


class NotedError(ValueError):
    """A :class:`ValueError` whose message is a :class:`Note`, so the layer that shows it
    can write its terms in its reader's words (:meth:`render`)."""

    def __init__(self, message: str | Note) -> None:
        self.note = as_note(message)
        super().__init__(self.note.render())

    def render(self, words: Mapping[str, str] | None = None) -> str:
        """The message with its terms in ``words``."""
        return self.note.render(words)

    def __reduce__(self) -> Any:
        return (type(self), (self.note,))
