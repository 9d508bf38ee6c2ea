"""Tests of seqbalance.readers: every format, column handling, and error messages."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seqbalance.cli.readers import read_column, read_groups, read_lengths

LENGTHS = [120, 4096, 7, 0, 32768]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


# ---- formats ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["lengths.txt", "lengths", "lengths.lst"])
def test_text_one_integer_per_line(tmp_path, name):
    p = _write(tmp_path / name, "# tokens per sample\n120\n\n4096\n  7 \n0\n32768\n")
    out = read_lengths(p)
    assert out.dtype == np.int64
    assert out.tolist() == LENGTHS


def test_json_list_and_objects(tmp_path):
    assert read_lengths(_write(tmp_path / "a.json", json.dumps(LENGTHS))).tolist() == LENGTHS
    records = [{"id": i, "n": n} for i, n in enumerate(LENGTHS)]
    p = _write(tmp_path / "b.json", json.dumps(records))
    assert read_lengths(p, "n").tolist() == LENGTHS


def test_npy_that_numpy_cannot_read_plainly_names_the_file(tmp_path):
    np.save(tmp_path / "obj.npy", np.array([1, "a", None], dtype=object))
    (tmp_path / "bin.npy").write_bytes(b"\x93NUMPY not a header")
    with open(tmp_path / "huge.npy", "wb") as f:  # a header promising 80 GB, 8 bytes of data
        header = {"descr": "<i8", "fortran_order": False, "shape": (10**10,)}
        np.lib.format.write_array_header_1_0(f, header)
        f.write(b"\0" * 8)
    for name in ("obj.npy", "bin.npy", "huge.npy"):
        with pytest.raises(ValueError, match=rf"{name}: not a plain \.npy array \("):
            read_lengths(tmp_path / name)
    with open(tmp_path / "arch.npy", "wb") as f:
        np.savez(f, a=np.arange(3))
    with pytest.raises(ValueError, match=r"arch\.npy: an \.npz archive"):
        read_lengths(tmp_path / "arch.npy")
    with pytest.raises(OSError):  # as for every format: not a content error
        read_lengths(tmp_path / "missing.npy")


def test_npy_plain_and_structured(tmp_path):
    np.save(tmp_path / "a.npy", np.asarray(LENGTHS, dtype=np.int32))
    out = read_lengths(tmp_path / "a.npy")
    assert out.dtype == np.int64 and out.tolist() == LENGTHS
    rec = np.zeros(len(LENGTHS), dtype=[("id", "i4"), ("tokens", "i8")])
    rec["tokens"] = LENGTHS
    np.save(tmp_path / "b.npy", rec)
    assert read_lengths(tmp_path / "b.npy", "tokens").tolist() == LENGTHS
    with pytest.raises(ValueError, match="'id', 'tokens'"):
        read_lengths(tmp_path / "b.npy")


def test_csv_named_column_and_groups(tmp_path):
    rows = "".join(f"s{i},{n},prompt-{i // 2}\n" for i, n in enumerate(LENGTHS))
    p = _write(tmp_path / "data.csv", "id,n_tokens,prompt\n" + rows)
    assert read_lengths(p, column="n_tokens").tolist() == LENGTHS
    groups = read_column(p, "prompt", what="group ids")
    assert groups.tolist() == [f"prompt-{i // 2}" for i in range(len(LENGTHS))]


def test_csv_single_column_needs_no_name(tmp_path):
    p = _write(tmp_path / "one.csv", "tokens\n" + "\n".join(map(str, LENGTHS)) + "\n")
    assert read_lengths(p).tolist() == LENGTHS


def test_tsv(tmp_path):
    p = _write(tmp_path / "d.tsv", "a\tlen\n" + "".join(f"x\t{n}\n" for n in LENGTHS))
    assert read_lengths(p, "len").tolist() == LENGTHS


def test_jsonl_objects_and_numbers(tmp_path):
    text = "".join(json.dumps({"len": n, "g": i % 2}) + "\n" for i, n in enumerate(LENGTHS))
    p = _write(tmp_path / "d.jsonl", text + "\n")
    assert read_lengths(p, "len").tolist() == LENGTHS
    assert read_column(p, "g").tolist() == [0, 1, 0, 1, 0]
    q = _write(tmp_path / "n.ndjson", "\n".join(map(str, LENGTHS)))
    assert read_lengths(q).tolist() == LENGTHS


def _pyarrow():
    """pyarrow and pyarrow.parquet, or a skip where they are missing or do not import
    (pyarrow 26 beside numpy 1.26 raises ImportError, which importorskip lets through)."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        pytest.skip(f"pyarrow does not import here: {exc}")
    return pa, pq


@pytest.mark.slow
def test_parquet(tmp_path):
    pa, pq = _pyarrow()
    table = pa.table({"len": LENGTHS, "group": ["a", "a", "b", "b", "c"]})
    pq.write_table(table, tmp_path / "d.parquet")
    assert read_lengths(tmp_path / "d.parquet", "len").tolist() == LENGTHS
    assert read_column(tmp_path / "d.parquet", "group").tolist() == ["a", "a", "b", "b", "c"]
    with pytest.raises(ValueError, match="available columns: 'len', 'group'"):
        read_lengths(tmp_path / "d.parquet", "tokens")


def test_parquet_without_pyarrow_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ValueError, match=r'pip install "\.\[parquet\]"'):
        read_lengths(tmp_path / "d.parquet", "len")


def test_empty_file_gives_empty_lengths(tmp_path):
    out = read_lengths(_write(tmp_path / "e.txt", ""))
    assert out.shape == (0,) and out.dtype == np.int64


# ---- errors ----------------------------------------------------------------------------


def test_missing_column_lists_available(tmp_path):
    p = _write(tmp_path / "d.csv", "id,len\na,1\n")
    with pytest.raises(ValueError, match=r"no column 'tokens'; available columns: 'id', 'len'"):
        read_lengths(p, "tokens")


def test_ambiguous_table_asks_for_column(tmp_path):
    p = _write(tmp_path / "d.jsonl", '{"a": 1, "b": 2}\n')
    with pytest.raises(ValueError, match=r"2 columns \('a', 'b'\); say which"):
        read_lengths(p)


def test_unknown_extension(tmp_path):
    with pytest.raises(ValueError, match=r"unknown file type '\.xlsx'"):
        read_lengths(_write(tmp_path / "d.xlsx", "1\n"))


def test_bad_line_is_located(tmp_path):
    p = _write(tmp_path / "d.txt", "12\n13\nabc\n")
    with pytest.raises(ValueError, match=r"d\.txt:3: 'abc' is not a number"):
        read_lengths(p)


@pytest.mark.parametrize(
    ("text", "pattern"),
    [("5\n-3\n", r"lengths\[1\] = -3 is negative"), ("5\n2.5\n", r"lengths\[1\].*whole")],
)
def test_invalid_lengths_name_file_and_index(tmp_path, text, pattern):
    p = _write(tmp_path / "d.txt", text)
    with pytest.raises(ValueError, match=pattern) as info:
        read_lengths(p)
    assert str(p) in str(info.value)


@pytest.mark.parametrize("cell", ["1_000", "\u0661\u0662", "0x10", "1,000", "12 34"])
def test_only_plain_decimal_cells_are_numbers(tmp_path, cell):
    # int() alone took "1_000" as 1000 and Arabic-Indic digits as 12 (a likely bad cell).
    p = _write(tmp_path / "d.csv", f'len\n5\n"{cell}"\n')
    with pytest.raises(ValueError, match=r"lengths value 1: .* is not a number \(plain"):
        read_lengths(p)
    with pytest.raises(ValueError, match=r"d\.txt:2: .* is not a number"):
        read_lengths(_write(tmp_path / "d.txt", f"5\n{cell}\n"))


def test_decimal_cells_in_every_plain_form_are_read(tmp_path):
    p = _write(tmp_path / "d.csv", "len\n+7\n 12 \n3.0\n4e2\n.5e1\n")
    assert read_lengths(p).tolist() == [7, 12, 3, 400, 5]


def test_csv_cell_not_a_number(tmp_path):
    p = _write(tmp_path / "d.csv", "len\n5\nten\n")
    with pytest.raises(ValueError, match=r"lengths value 1: 'ten' is not a number"):
        read_lengths(p)


def test_column_on_plain_list_is_refused(tmp_path):
    with pytest.raises(ValueError, match="no named columns"):
        read_lengths(_write(tmp_path / "d.txt", "1\n"), "len")


def test_null_and_nested_values_are_refused(tmp_path):
    with pytest.raises(ValueError, match="missing"):
        read_lengths(_write(tmp_path / "a.json", "[1, null, 3]"))
    with pytest.raises(ValueError, match="nested"):
        read_lengths(_write(tmp_path / "b.json", "[1, [2], 3]"))
    with pytest.raises(ValueError, match="JSON list"):
        read_lengths(_write(tmp_path / "c.json", '{"a": 1}'))
    with pytest.raises(ValueError, match="not valid JSON"):
        read_lengths(_write(tmp_path / "d.jsonl", '{"a": 1}\n{oops\n'))


def test_values_the_python_api_refuses_are_refused_here_too(tmp_path):
    # Read as numpy would, true became length 1, 1 and "1" one group, an empty cell a
    # group named "" (review): each is an error in the Python API.
    with pytest.raises(ValueError, match="value 1 is True, not a number"):
        read_lengths(_write(tmp_path / "a.jsonl", '{"n": 3}\n{"n": true}\n'), "n")
    with pytest.raises(ValueError, match="mix numbers and strings"):
        read_column(_write(tmp_path / "b.json", '[1, "1", 2]'), what="group ids")
    with pytest.raises(ValueError, match="group ids value 1 is missing"):
        read_column(_write(tmp_path / "c.csv", "n,g\n3,a\n4,\n5,b\n"), "g", what="group ids")
    # One kind each is fine, floats and ints together too.
    assert read_column(_write(tmp_path / "d.json", "[1, 2.5, 3]")).tolist() == [1, 2.5, 3]
    assert read_column(_write(tmp_path / "e.json", '["1", "x"]')).tolist() == ["1", "x"]


def test_csv_group_ids_of_one_number_written_two_ways_are_refused(tmp_path):
    # CSV kept "1" and "1.0" as two groups (JSONL reads both as 1): now an error naming both.
    csv_path = _write(tmp_path / "g.csv", "n,g\n100,1\n200,1.0\n300,2\n50,2\n")
    with pytest.raises(ValueError, match=r"g.csv: group ids '1' and '1.0' are one number"):
        read_groups(csv_path, "g")
    jsonl = _write(tmp_path / "g.jsonl", '{"g": 1}\n{"g": 1.0}\n{"g": 2}\n')
    assert read_groups(jsonl, "g").tolist() == [1, 1, 2]
    # One spelling per number, and labels (compared as text), are read as they are.
    ok = _write(tmp_path / "h.csv", "n,g\n1,07\n2,07\n3,2.5\n4,-1\n")
    assert read_groups(ok, "g").tolist() == ["07", "07", "2.5", "-1"]
    labels = _write(tmp_path / "i.csv", "n,g\n1,1\n2,1.0\n3,x\n")
    assert read_groups(labels, "g").tolist() == ["1", "1.0", "x"]


def test_csv_group_ids_in_the_cli(tmp_path, capsys):
    from seqbalance.cli import main

    csv_path = _write(tmp_path / "g.csv", "n,g\n100,1\n200,1.0\n300,2\n50,2\n")
    argv = ["plan", str(csv_path), "--column", "n", "--groups-column", "g", "--dp", "2",
            "--max-tokens", "1000"]  # fmt: skip
    assert main(argv) == 2
    assert "group ids '1' and '1.0' are one number" in capsys.readouterr().err


def test_missing_file_is_oserror(tmp_path):
    with pytest.raises(OSError):
        read_lengths(tmp_path / "absent.txt")


# ---- every format round-trips ----------------------------------------------------------

_WRITERS = {
    "txt": lambda p, v: p.write_text("".join(f"{x}\n" for x in v)),
    "json": lambda p, v: p.write_text(json.dumps(v)),
    "npy": lambda p, v: np.save(p, np.asarray(v, dtype=np.int64)),
    "csv": lambda p, v: p.write_text("k,len\n" + "".join(f"{i},{x}\n" for i, x in enumerate(v))),
    "jsonl": lambda p, v: p.write_text("".join(json.dumps({"len": x}) + "\n" for x in v)),
}


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.integers(0, 2**40 - 1), max_size=40),
    fmt=st.sampled_from(sorted(_WRITERS)),
)
def test_round_trip_every_format(tmp_path_factory, values, fmt):
    path = tmp_path_factory.mktemp("rt") / f"lengths.{fmt}"
    _WRITERS[fmt](path, values)
    # An empty JSONL file has no fields to name; a CSV always has its header.
    column = "len" if fmt == "csv" or (fmt == "jsonl" and values) else None
    out = read_lengths(path, column)
    assert out.dtype == np.int64
    assert out.tolist() == values


def test_docstring_examples():
    import doctest

    import seqbalance.cli.readers

    result = doctest.testmod(seqbalance.cli.readers)
    assert result.attempted > 0 and result.failed == 0


# ---- byte-order marks, ragged rows, duplicate names, encodings ---------------------------


@pytest.mark.parametrize(
    ("name", "text", "column"),
    [
        ("a.txt", "120\n4096\n7\n0\n32768\n", None),
        ("a.csv", "n\n120\n4096\n7\n0\n32768\n", "n"),
        ("a.tsv", "id\tn\na\t120\nb\t4096\nc\t7\nd\t0\ne\t32768\n", "n"),
        ("a.json", json.dumps(LENGTHS), None),
        ("a.jsonl", "".join(json.dumps({"n": x}) + "\n" for x in LENGTHS), "n"),
    ],
)
def test_utf8_byte_order_mark_is_skipped(tmp_path, name, text, column):
    """Spreadsheet exports (Excel's "CSV UTF-8") start with a BOM: it is not part of the
    first value or column name."""
    p = tmp_path / name
    p.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    assert read_lengths(p, column).tolist() == LENGTHS


def test_csv_row_with_more_cells_than_header_is_refused(tmp_path):
    # "1,200" is one length written with a thousands separator, or a shifted row: reading
    # the first cell alone would silently give 1.
    p = _write(tmp_path / "a.csv", "n\n5\n1,200\n7\n")
    with pytest.raises(ValueError, match=r"a.csv:3: row has 2 cells but the header names 1"):
        read_lengths(p)


def test_csv_row_with_fewer_cells_than_header_is_refused(tmp_path):
    # With a cell missing, the cells after it have shifted into the wrong columns.
    p = _write(tmp_path / "a.csv", "id,n,label\na,5,x\nb,7\n")
    with pytest.raises(ValueError, match=r"a.csv:3: row has 2 cells but the header names 3"):
        read_lengths(p, "n")


def test_csv_trailing_empty_cells_are_fine(tmp_path):
    p = _write(tmp_path / "a.csv", "id,n\na,5,\nb,7,,\n")
    assert read_lengths(p, "n").tolist() == [5, 7]


@pytest.mark.parametrize("header", ["n,n", "n, n ", "id,n,n"])
def test_csv_duplicate_column_names_are_refused(tmp_path, header):
    cells = len(header.split(","))
    p = _write(tmp_path / "a.csv", f"{header}\n" + ",".join(["1"] * cells) + "\n")
    with pytest.raises(ValueError, match="column 'n' appears 2 times"):
        read_lengths(p, "n")


@pytest.mark.parametrize(
    ("name", "text"),
    [("a.json", '[{"n": 1, "n": 2}]'), ("a.jsonl", '{"n": 1}\n{"n": 2, "n": 3}\n')],
)
def test_json_duplicate_keys_are_refused(tmp_path, name, text):
    # json keeps the last of two equal keys without a word; which one is meant is unknown.
    with pytest.raises(ValueError, match="field 'n' appears twice"):
        read_lengths(_write(tmp_path / name, text), "n")


@pytest.mark.parametrize("name", ["a.txt", "a.csv", "a.json", "a.jsonl"])
def test_non_utf8_file_names_the_file_and_the_fix(tmp_path, name):
    p = tmp_path / name
    p.write_bytes("n\n5\n".encode("utf-16"))
    with pytest.raises(ValueError, match=rf"{name}: not UTF-8 text.*save it as UTF-8"):
        read_lengths(p)


def test_parquet_duplicate_column_names_are_refused(tmp_path):
    pa, pq = _pyarrow()
    p = tmp_path / "a.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([1, 2]), pa.array([3, 4])], ["n", "n"]), p)
    with pytest.raises(ValueError, match="column 'n' appears 2 times"):
        read_lengths(p, "n")
