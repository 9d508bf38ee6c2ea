"""Notes and error messages are data (:class:`seqbalance.Note`), written as text where they
are shown: no layer rewrites another's finished text with a regular expression."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path

import numpy as np
import pytest

import seqbalance as sb
from seqbalance import ArgumentError, Note
from seqbalance._notes import as_text, term

ROOT = Path(sb.__file__).parent

# The modules that may use `re`, and why: each parses something a user gave, not a message.
REGEX_ALLOWED = {
    "cli/readers.py": "numbers in a user's lengths file",
    "compat/_verl_dropin.py": "verl's version string",
}


def _regex_users(root: Path = ROOT) -> dict[str, list[int]]:
    """Module (relative path) -> lines that import `re` (also inside functions)."""
    found: dict[str, list[int]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n == "re" or n.startswith("re.") or n == "regex" for n in names):
                found.setdefault(path.relative_to(root).as_posix(), []).append(node.lineno)
    return found


def test_no_regular_expression_outside_parsing_of_users_input():
    users = _regex_users()
    stray = {m: lines for m, lines in users.items() if m not in REGEX_ALLOWED}
    assert not stray, f"a regex on a note or message? use Note terms instead: {stray}"
    assert set(users) == set(REGEX_ALLOWED), "drop the allowance of a module that no longer uses re"


def test_the_check_catches_a_lazy_import(tmp_path):
    pkg = tmp_path / "seqbalance"
    pkg.mkdir()
    (pkg / "x.py").write_text("def f(s):\n    import re\n    return re.sub('a', 'b', s)\n")
    assert _regex_users(pkg) == {"x.py": [2]}


# ---- Note -------------------------------------------------------------------------------


def test_a_note_renders_its_terms_in_the_readers_words():
    note = Note("x", {"n": 3, "cap": 8192, "size": "equal"},
                "{n} per {@rank}; {@max_tokens:{cap}}; {@size:{size!r}}; {@allow_empty=True}")
    assert str(note) == "3 per rank; max_tokens=8192; size='equal'; allow_empty=True"
    words = {"rank": "replica", "max_tokens": "--max-tokens", "size=": "--size ",
             "allow_empty=True": "--allow-empty"}  # fmt: skip
    assert note.render(words) == "3 per replica; --max-tokens=8192; --size equal; --allow-empty"
    assert note.in_words({"rank": "replica"}).render({"max_tokens": "-m"}) == (
        "3 per replica; -m=8192; size='equal'; allow_empty=True"
    )


def test_values_are_never_read_as_templates():
    note = Note("x", {"v": "{@rank} {0}"}, "got {v}")
    assert note.render({"rank": "replica"}) == "got {@rank} {0}"
    assert str(Note.text("a {b} c")) == "a {b} c"


def test_notes_and_their_text_pickle_with_their_fields():
    note = Note("k", {"a": 1}, "{a} {@rank}").in_words({"rank": "replica"})
    assert pickle.loads(pickle.dumps(note)) == note
    again = pickle.loads(pickle.dumps(as_text(note)))
    assert again == "1 replica" and again.note == note
    err = ArgumentError(note, argument="a")
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == "1 replica" and back.argument == "a" and back.note == note


def test_plan_keeps_structured_notes_and_their_text():
    lengths = [100, 200, 50_000, 300] * 8
    p = sb.plan(lengths, 2, 8192, oversized="alone")
    kinds = [n.kind for n in p.note_items]
    assert "oversized_alone" in kinds
    alone = p.note_items[kinds.index("oversized_alone")]
    assert dict(alone.fields) == {"count": 8, "cap": 8192, "first": 2}
    assert p.notes[kinds.index("oversized_alone")] == (
        "8 sequences longer than max_tokens=8192 run alone in their own micro-batches "
        "(oversized='alone'), first at index 2"
    )
    # Passing the text on keeps the note; new text becomes a "text" note.
    p.notes = (*p.notes, "added")
    assert [n.kind for n in p.note_items] == [*kinds, "text"]
    q = sb.Plan.from_json(p.to_json())
    assert q.notes == p.notes  # a saved plan keeps the text


def test_static_cp_notes_speak_of_replicas_and_pieces():
    p = sb.plan([100, 200, 50_000, 300] * 8, 2, 8192, cp_size=4, cp="static",
                oversized="alone")  # fmt: skip
    (alone,) = [n for n in p.note_items if n.kind == "oversized_alone"]
    assert str(alone) == (
        "8 sequences whose largest piece over cp_size=4 GPUs is longer than max_tokens=8192 "
        "run alone in their own micro-batches (oversized='alone'), first at index 2"
    )
    rng = np.random.default_rng(0)
    p = sb.plan(rng.integers(100, 30_000, 64), 4, 8192, cp_size=4, cp="static",
                groups=np.arange(64) // 4)  # fmt: skip
    assert p.notes[0].startswith("9 micro-batches per replica where"), p.notes
    assert term("rank") == "rank"  # the replica words were the call's, and ended with it


def test_the_planners_notes_carry_their_kind_and_fields():
    p = sb.plan([5000] * 6 + [100] * 10, 2, 8192)
    assert [(n.kind, dict(n.fields)) for n in p.note_items] == [
        ("count_bins", {"count": 3, "needed": 2, "bins": 6, "cap": 8192, "big": 6}),
        ("won_greedy", {"ranks": "ranks"}),
    ]
    assert p.notes[0].startswith("3 micro-batches per rank where the token total alone")
    p = sb.plan(np.full(40, 1000), 2, 2500, sequences_per_micro_batch=3)
    (fixed,) = p.note_items
    assert (fixed.kind, dict(fixed.fields)) == (
        "count_fixed", {"count": 10, "n": 40, "per_mb": 3, "reason": "capacity"}
    )
    assert str(fixed) == (
        "10 micro-batches per rank: 40 sequences at most sequences_per_micro_batch=3 per "
        "micro-batch, to fit max_tokens"
    )
    rng = np.random.default_rng(0)
    p = sb.plan(rng.integers(100, 30_000, 64), 4, 32768, groups=np.arange(64) // 4)
    assert [n.kind for n in p.note_items] == ["count_bins", "count_not_found"]
    missing = p.note_items[1]
    assert dict(missing.fields) == {"count": 10, "fewer": 9, "cap": 32768, "status": "skipped",
                                    "limit": 24, "rule": "size='free' and groups"}  # fmt: skip


def test_a_count_not_found_above_the_exact_search_says_it_was_skipped():
    # 178 lengths on one rank: the packers find no packing into 100 micro-batches, and the
    # exhaustive search runs on at most 64 sequences, so the note must not claim it ran.
    rng = np.random.default_rng(1)
    lens = rng.integers(1, 1000, int(rng.integers(70, 300)))
    p = sb.plan(lens, int(rng.choice([1, 2, 4])), int(lens.max()), sync="ddp")
    (missing,) = [n for n in p.note_items if n.kind == "count_not_found"]
    assert missing.fields["status"] == "skipped" and missing.fields["limit"] == 64
    assert "exhaustive search runs on at most 64 sequences" in str(missing)


def test_static_cp_says_its_tokens_are_pieces_by_the_notes_kinds():
    # A replica note that states tokens (by its kind) gets the largest-piece note beside
    # it; a replica plan without one does not.
    from seqbalance._notes import as_note
    from seqbalance.planning._count_notes import states_tokens

    rng = np.random.default_rng(0)
    p = sb.plan(rng.integers(100, 30_000, 64), 4, 8192, cp_size=4, cp="static",
                groups=np.arange(64) // 4)  # fmt: skip
    assert [n.kind for n in p.note_items] == ["count_bins", "count_not_found", "largest_piece"]
    p = sb.plan([5000] * 6 + [100] * 10, 2, 8192, cp_size=2, cp="static")
    assert not any(n.kind == "largest_piece" for n in p.note_items)
    assert not states_tokens(as_note("12 tokens"))  # (text is never read for it)
    hold = sb.plan(np.full(40, 1000), 2, 4000, sequences_per_micro_batch=3).note_items[0]
    assert hold.fields["reason"] == "count" and not states_tokens(hold)
    # ranks split by tokens, and the count that lets an oversized sequence run alone
    lengths = [193, 335, 1176, 509, 35, 573, 336, 969, 26, 778, 46, 681, 968, 1053, 144, 239,
               192, 126, 31, 477, 555, 166]  # fmt: skip
    p = sb.plan(lengths, 4, 1210, cp_size=2, cp="static", effort="thorough")
    assert [n.kind for n in p.note_items] == ["won_full_rank", "largest_piece"]
    assert p.note_items[0].fields["by"] == "tokens"
    p = sb.plan([20000, 0, 0], 1, 8192, oversized="alone", cp_size=2, cp="static")
    kinds = [n.kind for n in p.note_items]
    assert "count_alone" in kinds and kinds[-1] == "largest_piece"
    assert p.notes[kinds.index("count_alone")].startswith(
        "oversized='alone': 2 micro-batches per replica, the fewest at which every sequence "
        "longer than max_tokens runs alone"
    )


def test_replica_count_note_restated_from_its_fields():
    # Static CP's replicas planned without their pipeline run at the interleaved
    # schedule's multiple; their count note names the caller's multiple and what raised it,
    # rebuilt from the note's kind and fields (nothing rewrites its text).
    from seqbalance.planning import context_parallel as cpm

    seen = []
    restate = cpm.with_asked_multiple

    def spy(notes, asked, mult, schedule):
        out = restate(notes, asked, mult, schedule)
        seen.append(out)
        return out

    cpm.with_asked_multiple = spy
    try:
        sb.plan(np.full(8, 300), 2, 4096, cp_size=2, pp_size=2, schedule="interleaved",
                virtual_stages=2)  # fmt: skip
    finally:
        cpm.with_asked_multiple = restate
    assert seen
    note = next(n for n in seen[0] if "micro-batches per replica" in n)
    assert note == (
        "2 micro-batches per replica where the capacity alone needs 1: rounded up to a "
        "multiple of micro_batch_multiple=1 (raised to 2 by schedule='interleaved')"
    )
    from seqbalance._notes import as_note

    restated = as_note(note)  # (the text keeps its note: kind and fields, not just words)
    assert restated.kind == "count_raised"
    assert (restated.fields["asked"], restated.fields["mult"]) == (1, 2)


# ---- the command line's words ---------------------------------------------------------


def _parser_flags() -> set[str]:
    import argparse

    from seqbalance.cli.commands import build_parser

    flags: set[str] = set()
    stack = [build_parser()]
    while stack:
        parser = stack.pop()
        for action in parser._actions:
            flags.update(s for s in action.option_strings if s.startswith("--"))
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
    return flags


def test_every_flag_in_the_table_is_a_flag_of_the_command_line():
    from seqbalance.cli.flags import FLAGS

    missing = sorted(set(FLAGS.values()) - _parser_flags())
    assert not missing, missing


@pytest.mark.parametrize(
    ("call", "python", "cli"),
    [
        (lambda: sb.plan([1, 2], 0, 10), "dp_size must be >= 1, got 0",
         "--dp must be >= 1, got 0"),
        (lambda: sb.plan([1, 2, 3], 2, 10, size="equal"), 'size="equal" needs',
         "--size equal needs"),
        (lambda: sb.plan([1, 2], 1, 10, pp_size=2, schedule="interleaved"),
         "schedule='interleaved' needs virtual_stages >= 2",
         "--schedule interleaved needs --virtual-stages >= 2"),
        (lambda: sb.plan([1, 2], 1, 10, cp_size=3), "cp_size must be a power of two",
         "--cp-size must be a power of two"),
        (lambda: sb.plan([600_000], 1, 16_384, cp_size=8),
         "split over cp_size=8 GPUs its largest piece has 75000 tokens, more than "
         "max_tokens=16384; raise cp_size or max_tokens",
         "split over --cp-size=8 GPUs its largest piece has 75000 tokens, more than "
         "--max-tokens=16384; raise --cp-size or --max-tokens"),
    ],
)  # fmt: skip
def test_errors_carry_their_terms_to_the_command_line(call, python, cli):
    from seqbalance.cli.flags import shown

    with pytest.raises(ArgumentError) as info:
        call()
    assert python in str(info.value)
    assert cli in shown(info.value)


def test_under_ulysses_groups_the_capacity_and_gpus_are_the_groups():
    from seqbalance.cli.flags import shown, words_for

    with pytest.raises(ArgumentError) as info:
        sb.plan([600_000], 1, 65_536, cp_size=8)
    assert shown(info.value, words_for(sp_size=4, cp_size=8)) == (
        "sequence 0 has 600000 tokens: split over --cp-size=8 Ulysses groups its largest "
        "piece has 75000 tokens, more than --sp-size x --max-tokens=65536; raise --cp-size, "
        "--sp-size or --max-tokens, or truncate it"
    )


def test_refit_warnings_name_refit_without_rewriting_fit_costs():
    from seqbalance.costs.fit import EXACTLY_DETERMINED, exactly_determined_message

    assert EXACTLY_DETERMINED.startswith("fit_cost: ")
    assert exactly_determined_message("refit") == "refit" + EXACTLY_DETERMINED[len("fit_cost"):]


def test_render_notes_speaks_an_integrations_words():
    p = sb.plan([100, 200, 300, 5000], 2, 1000, oversized="alone")
    assert p.notes and p.render_notes() == p.notes
    flags = p.render_notes({"max_tokens": "--max-tokens", "oversized": "--oversized"})
    assert any("--max-tokens" in n for n in flags)
    assert not any("--max-tokens" in n for n in p.notes)
