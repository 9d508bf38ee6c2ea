"""Read sequence lengths (and optional group ids) from files.

Supported formats, chosen by the file extension:

``.txt``, ``.lst`` or no extension
    One integer per line; blank lines and lines starting with ``#`` are skipped.
``.json``
    A JSON list of numbers, or a list of objects (then ``column`` picks the field).
``.npy``
    A 1-D numpy array, or a structured array (then ``column`` picks the field).
``.csv``, ``.tsv``
    A table with a header row; ``column`` names the column.
``.jsonl``, ``.ndjson``
    One JSON object per line (``column`` names the field), or one number per line.
``.parquet``, ``.pq``
    A Parquet table (needs pyarrow: ``pip install ".[parquet]"`` in a checkout).

For tables, ``column`` may be omitted when the table has exactly one column. Text formats
are UTF-8 (a byte-order mark is skipped). A CSV row must have one cell per header column
(trailing empty cells aside), and a column or JSON field may be named only once.
"""

from __future__ import annotations

import csv
import json
import os
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .._validate import as_lengths
from .optional import import_optional

__all__ = ["FORMATS", "read_column", "read_groups", "read_lengths"]

_TEXT = ("", ".txt", ".lst")
FORMATS: dict[str, str] = {
    **dict.fromkeys(_TEXT, "text"),
    ".json": "json",
    ".npy": "npy",
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".parquet": "parquet",
    ".pq": "parquet",
}


def _format_of(path: Path) -> str:
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(sorted(s for s in FORMATS if s))
        raise ValueError(
            f"{path}: unknown file type {suffix!r}; use one of {known} "
            "(or a file with no extension holding one integer per line)"
        )
    return FORMATS[suffix]


def _pick(columns: Sequence[str], column: str | None, path: Path, what: str) -> str:
    """The column to read: ``column`` if given and present, else the only column."""
    listed = ", ".join(repr(c) for c in columns) or "(none)"
    if column is None:
        if len(columns) == 1:
            return columns[0]
        raise ValueError(
            f"{path} has {len(columns)} columns ({listed}); say which one holds the {what} "
            "(--column / column=)"
        )
    if column not in columns:
        raise ValueError(f"{path} has no column {column!r}; available columns: {listed}")
    return column


def _unique(columns: Sequence[str], key: str, path: Path) -> str:
    """``key``, refused when several columns bear that name (which one is meant?)."""
    count = list(columns).count(key)
    if count > 1:
        raise ValueError(
            f"{path}: column {key!r} appears {count} times in the header; rename the "
            "columns so that each name is used once"
        )
    return key


# Plain decimal notation only: Python's int()/float() also take "1_000" and non-ASCII
# digits, which no CSV writer produces for a number and which more likely mark a bad cell.
_DECIMAL = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|infinity|nan)",
                      re.IGNORECASE | re.ASCII)  # fmt: skip


def _number(text: str, where: str) -> int | float:
    s = text.strip()
    if not _DECIMAL.fullmatch(s):
        raise ValueError(f"{where}: {text!r} is not a number (plain decimal notation, "
                         "such as 4096 or 4.5e3, without digit separators)")  # fmt: skip
    try:
        return int(s)
    except ValueError:
        return float(s)


def _open(path: Path) -> Any:
    """``path`` opened for reading text.

    ``utf-8-sig`` drops a byte-order mark (spreadsheets write one), which would otherwise
    stick to the first value or column name.
    """
    return open(path, encoding="utf-8-sig", newline="")


class _DuplicateKey(ValueError):
    pass


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook`` for json: refuse an object naming a field twice (json would
    keep the last value without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"field {key!r} appears twice in one object; keep one of them")
        out[key] = value
    return out


def _no_column(column: str | None, path: Path, kind: str) -> None:
    if column is not None:
        raise ValueError(
            f"{path} is {kind} and has no named columns, but column {column!r} was asked for; "
            "use a CSV, JSONL, Parquet file or a JSON list of objects to read named columns"
        )


def _read_text(path: Path, column: str | None) -> list[Any]:
    _no_column(column, path, "a plain list (one value per line)")
    out: list[Any] = []
    with _open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            s = line.strip()
            if s and not s.startswith("#"):
                out.append(_number(s, f"{path}:{lineno}"))
    return out


def _records_column(
    records: Sequence[Any], column: str | None, path: Path, what: str, where: str
) -> list[Any]:
    """``column`` of a list of dicts (or the values themselves when they are not dicts)."""
    if not records or not isinstance(records[0], dict):
        if any(isinstance(r, dict) for r in records):
            raise ValueError(f"{path}: mixes objects and plain values; use one or the other")
        _no_column(column, path, "a list of plain values")
        return list(records)
    names: list[str] = list(records[0])
    key = _pick(names, column, path, what)
    out = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict) or key not in rec:
            raise ValueError(f"{path}: {where} {i + 1} has no field {key!r}")
        out.append(rec[key])
    return out


def _read_json(path: Path, column: str | None, what: str) -> list[Any]:
    with _open(path) as fh:
        try:
            data = json.load(fh, object_pairs_hook=_no_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc})") from None
        except _DuplicateKey as exc:
            raise ValueError(f"{path}: {exc}") from None
    if not isinstance(data, list):
        raise ValueError(
            f"{path}: expected a JSON list of numbers (or of objects), got {type(data).__name__}"
        )
    return _records_column(data, column, path, what, "item")


def _read_jsonl(path: Path, column: str | None, what: str) -> list[Any]:
    records = []
    with _open(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line, object_pairs_hook=_no_duplicate_keys))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from None
            except _DuplicateKey as exc:
                raise ValueError(f"{path}:{lineno}: {exc}") from None
    return _records_column(records, column, path, what, "record")


def _read_csv(path: Path, column: str | None, what: str) -> list[Any]:
    delimiter = "\t" if path.suffix.lower() == ".tsv" else ","
    with _open(path) as fh:
        reader = csv.reader(fh, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path} is empty; a CSV file needs a header row naming its columns")
        header = [h.strip() for h in header]
        key = _unique(header, _pick(header, column, path, what), path)
        k = header.index(key)
        out = []
        for rowno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            # Trailing empty cells (a trailing delimiter) are harmless; any other count
            # means cells shifted between columns, or a value holding the delimiter
            # ("1,200"), and the cell read would be the wrong one.
            cells = len(row)
            while cells > len(header) and not row[cells - 1].strip():
                cells -= 1
            if cells != len(header):
                raise ValueError(
                    f"{path}:{rowno}: row has {cells} cells but the header names "
                    f"{len(header)} columns; quote values that contain the delimiter "
                    f"({delimiter!r}) and give every row one cell per column"
                )
            out.append(row[k].strip())
    return out


def _read_npy(path: Path, column: str | None, what: str) -> np.ndarray:
    try:
        # Never unpickle a file given on a command line; the memory map checks the header's
        # shape against the file size before anything is allocated.
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, EOFError) as exc:  # OSError (no such file) passes as for any format
        raise ValueError(
            f"{path}: not a plain .npy array ({exc}); save the values with "
            "numpy.save(path, values) from an array of numbers or strings (not objects)"
        ) from None
    if not isinstance(arr, np.ndarray):  # np.load opens an .npz archive whatever its name
        raise ValueError(f"{path}: an .npz archive, not a .npy array; save it with numpy.save")
    arr = np.array(arr)  # off the memory map
    if arr.dtype.names:
        return arr[_pick(list(arr.dtype.names), column, path, what)]
    _no_column(column, path, "a plain array")
    return arr


def _read_parquet(path: Path, column: str | None, what: str) -> list[Any]:
    pq = import_optional(
        "pyarrow.parquet", f"reading {path}",
        'pip install ".[parquet]" (in a seqbalance checkout) or pip install pyarrow',
    )  # fmt: skip
    names = list(pq.read_schema(path).names)
    key = _unique(names, _pick(names, column, path, what), path)
    return pq.read_table(path, columns=[key]).column(key).to_pylist()


def read_column(
    path: str | os.PathLike[str], column: str | None = None, *, what: str = "values"
) -> np.ndarray:
    """Read one column of values (numbers or labels) from a file.

    Parameters
    ----------
    path : str or path-like
        The file; its extension picks the format (see the module docstring).
    column : str, optional
        Column (CSV, Parquet) or field (JSONL, JSON objects, structured .npy) to read.
        May be omitted when the table has exactly one column.
    what : str
        What the column holds, for error messages (e.g. ``"lengths"``, ``"group ids"``).

    Returns
    -------
    np.ndarray
        One value per row, as numpy makes of them (CSV cells stay strings).

    Raises
    ------
    ValueError
        Unknown file type, unparsable content, or a missing or ambiguous column (the message
        lists the available columns).
    OSError
        The file cannot be opened.
    """
    p = Path(path)
    fmt = _format_of(p)
    if fmt == "npy":
        return np.asarray(_read_npy(p, column, what))
    try:
        if fmt == "text":
            values = _read_text(p, column)
        elif fmt == "json":
            values = _read_json(p, column, what)
        elif fmt == "jsonl":
            values = _read_jsonl(p, column, what)
        elif fmt == "csv":
            values = _read_csv(p, column, what)
        else:
            values = _read_parquet(p, column, what)
    except UnicodeDecodeError as exc:  # its message names neither the file nor the fix
        raise ValueError(
            f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8 "
            "(e.g. UTF-16 files from some spreadsheet tools must be converted)"
        ) from None
    if any(isinstance(v, (list, dict)) for v in values):
        raise ValueError(f"{p}: the {what} must be single values, found a nested list or object")
    if any(v is None or (fmt == "csv" and v == "") for v in values):
        i = next(i for i, v in enumerate(values) if v is None or (fmt == "csv" and v == ""))
        raise ValueError(f"{p}: {what} value {i} is missing (empty); fill or drop such rows")
    # numpy would read true as 1, and make one kind of 1 and "1" (two groups for the
    # Python API, which refuses such a mix): refuse both here too.
    if any(isinstance(v, (bool, np.bool_)) for v in values):
        i = next(i for i, v in enumerate(values) if isinstance(v, (bool, np.bool_)))
        raise ValueError(f"{p}: {what} value {i} is {values[i]!r}, not a number or label")
    kinds = {isinstance(v, str) for v in values}
    if len(kinds) > 1:
        first = isinstance(values[0], str)
        i = next(i for i, v in enumerate(values) if isinstance(v, str) != first)
        raise ValueError(
            f"{p}: the {what} mix numbers and strings (value 0 is {values[0]!r}, value {i} is "
            f"{values[i]!r}); use one kind, so that 1 and \"1\" cannot be read as one"
        )
    return np.asarray(values) if values else np.zeros(0, dtype=np.int64)


def read_lengths(path: str | os.PathLike[str], column: str | None = None) -> np.ndarray:
    """Read sequence lengths (tokens per sequence) from a file.

    Parameters
    ----------
    path : str or path-like
        One integer per line (``.txt`` or no extension), a JSON list (``.json``), ``.npy``,
        or a table (CSV/TSV, JSONL, Parquet) with ``column`` naming the lengths.
    column : str, optional
        Column holding the lengths; required for tables with more than one column.

    Returns
    -------
    np.ndarray
        int64 lengths, validated with :func:`seqbalance._validate.as_lengths`.

    Raises
    ------
    ValueError
        Unreadable content, a missing column, or lengths that are negative or not whole.

    Examples
    --------
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> path = os.path.join(d, "lengths.csv")
    >>> with open(path, "w") as fh:
    ...     _ = fh.write("id,n_tokens\\na,120\\nb,4096\\n")
    >>> read_lengths(path, column="n_tokens").tolist()
    [120, 4096]
    """
    values = read_column(path, column, what="lengths")
    if values.dtype.kind in "US":  # CSV cells: parse them, naming the row on failure
        where = f"{path}: lengths value"
        values = np.asarray([_number(str(v), f"{where} {i}") for i, v in enumerate(values)])
    try:
        return as_lengths(values)
    except ValueError as exc:  # say which file the bad value came from
        raise ValueError(f"{os.fspath(path)}: {exc}") from None


def read_groups(path: str | os.PathLike[str], column: str) -> np.ndarray:
    """Read group ids (numbers or labels) from a file's ``column``.

    CSV cells are text, so ``1`` and ``1.0`` would be two groups there while JSONL reads
    both as the number 1. Two different cells of one number are refused rather than
    guessed at; cells that are not all numbers stay labels, compared as text.

    Raises
    ------
    ValueError
        As :func:`read_column`, or for two spellings of one number (both named).
    """
    values = read_column(path, column, what="group ids")
    if values.dtype.kind not in "US":
        return values
    cells = list(dict.fromkeys(str(v) for v in values))  # distinct, in file order
    try:
        numbers = [float(text) for text in cells]
    except ValueError:
        return values  # labels, not numbers
    seen: dict[float, str] = {}
    for text, number in zip(cells, numbers):
        other = seen.setdefault(number, text)
        if other != text:
            raise ValueError(
                f"{os.fspath(path)}: group ids {other!r} and {text!r} are one number written "
                "two ways; write each group's id the same way in every row"
            )
    return values
