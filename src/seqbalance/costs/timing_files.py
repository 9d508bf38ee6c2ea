"""Timing records on disk: what :meth:`TimingRecorder.save` writes and ``load`` reads.

A training job times its micro-batches (:class:`~seqbalance.torch.MicroBatchTimer`); the
records are worth keeping beyond the job, to refit a cost offline (``seqbalance refit``),
to compare cost models on the same steps, or to hand a measured workload to someone else.

The file is JSON Lines, one object a line:

- first, optionally, a header: ``{"format": "seqbalance-timings", "version": 1, "sync":
  "fsdp", "window": 50, "cost": {...}}``, with ``"cp_cost"`` in place of ``"cost"`` for a
  recorder that models a context-parallel link (each the model's ``to_dict()``);
- then one record a line: ``{"rank": 0, "step": 3, "slot": 1, "lengths": [812, 90],
  "seconds": 0.0412}``, plus ``"pieces": [[position, d, start, end], ...]`` for a GPU of
  a context-parallel plan (see :meth:`TimingRecorder.record`).

A file without a header is accepted (records written by other tools); the settings then
come from the caller. Records are written in (step, rank, slot) order with Python's
shortest round-trip float text, so a file loaded and saved again is byte-identical, and
every rank that loads it refits the same cost.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .context_parallel import ContextParallelCost
from .feedback import SYNC_MODELS, TimingRecorder

__all__ = ["FORMAT", "VERSION", "load_timings", "save_timings"]

FORMAT = "seqbalance-timings"
VERSION = 1
_HEADER_KEYS = ("format", "version", "sync", "window", "cost", "cp_cost")
_RECORD_KEYS = ("rank", "step", "slot", "lengths", "seconds", "pieces")
_REQUIRED = _RECORD_KEYS[:5]


def save_timings(recorder: TimingRecorder, path: str | os.PathLike[str]) -> Path:
    """Write ``recorder``'s settings and records to ``path`` (JSON Lines; see the module).

    The file is written under a temporary name and renamed over ``path``, so a reader
    never sees half of it (a job may save every few steps while another process reads).

    Returns
    -------
    Path
        The path written.
    """
    path = Path(path)
    header: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "sync": recorder.sync,
        "window": recorder.window,
    }
    if recorder.cp_cost is not None:
        header["cp_cost"] = recorder.cp_cost.to_dict()
    else:
        header["cost"] = recorder.cost.to_dict()
    lines = [_dumps(header)]
    for r in recorder.records:
        rec: dict[str, Any] = {
            "rank": r.rank,
            "step": r.step,
            "slot": r.slot,
            "lengths": r.lengths.tolist(),
            "seconds": r.seconds,
        }
        if r.pieces is not None:
            rec["pieces"] = r.pieces.tolist()
        lines.append(_dumps(rec))
    text = "\n".join(lines) + "\n"
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def load_timings(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    cost: Any = None,
    sync: str | None = None,
    window: int | None = None,
) -> TimingRecorder:
    """A :class:`TimingRecorder` holding the records of one or more timing files.

    Parameters
    ----------
    paths
        One file or several (e.g. one a rank, when the ranks did not gather their
        records); a (rank, step, slot) may appear in only one of them.
    cost : optional
        The cost to predict with (anything :class:`TimingRecorder` takes, a
        :class:`ContextParallelCost` included). Default: the headers' cost, else tokens.
    sync : {"fsdp", "ddp"}, optional
        Default: the headers' sync model, else ``"fsdp"``.
    window : int, optional
        Steps kept. Default: the headers' window, raised to the number of steps in the
        files, so that loading drops nothing (a smaller ``window`` drops the oldest).

    Raises
    ------
    ValueError
        A line that is not a JSON object, a header of another format or a newer version,
        a record with a missing, unknown or malformed field (the message names the file
        and line), the same (rank, step, slot) twice, or headers that disagree on a
        setting not given here.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no timing files given")
    headers: list[tuple[Path, dict[str, Any]]] = []
    records: list[tuple[Path, int, tuple[Any, ...]]] = []
    for path in files:
        header, recs = _read(path)
        if header is not None:
            headers.append((path, header))
        records.extend((path, line, rec) for line, rec in recs)

    given = {"cost": cost, "sync": sync}
    settings: dict[str, Any] = {}
    for key, what in (("sync", "sync"), ("window", "window"), ("cost", "cost")):
        if key in given and given[key] is not None:
            continue
        values = [(p, _setting(h, key)) for p, h in headers if _setting(h, key) is not None]
        if not values:
            continue
        first_path, first = values[0]
        for p, v in values[1:]:
            if v != first and key != "window":
                raise ValueError(
                    f"the headers of {first_path} and {p} give different {what}s; pass "
                    f"{what}= (--{what} on the command line) to say which to use"
                )
        settings[key] = max(v for _, v in values) if key == "window" else first
    chosen_cost = cost if cost is not None else settings.get("cost")
    try:
        if isinstance(chosen_cost, Mapping) and "cost" in chosen_cost and "kind" not in chosen_cost:
            chosen_cost = ContextParallelCost.from_dict(dict(chosen_cost))
        recorder = TimingRecorder(
            chosen_cost,
            sync=sync if sync is not None else settings.get("sync", "fsdp"),
            # Everything first; the window given, else the header's raised to the steps
            # the files hold, is applied below.
            window=window if window is not None else 2**62,
        )
    except ValueError as exc:
        if cost is not None or "cost" not in settings:
            raise
        where = next(p for p, h in headers if _setting(h, "cost") is not None)
        raise ValueError(f"{where}: the header's cost: {exc}") from None
    seen: dict[tuple[Any, ...], tuple[Path, int]] = {}
    for path, line, rec in records:
        try:
            recorder.record(*rec[:5], pieces=rec[5])
        except ValueError as exc:
            try:
                prior = seen.get(tuple(rec[:3]))
            except TypeError:  # an unhashable rank, step or slot: not a duplicate
                prior = None
            if prior is not None:
                hint = "" if prior[0] == path else (
                    " (MicroBatchTimer gathers every rank's records onto every rank: save "
                    "them on one rank, or load one rank's file)"
                )  # fmt: skip
                raise ValueError(
                    f"{path}:{line}: rank {rec[0]} step {rec[1]} slot {rec[2]} is also "
                    f"recorded at {prior[0]}:{prior[1]}; each micro-batch may be recorded "
                    f"once{hint}"
                ) from None
            raise ValueError(f"{path}:{line}: {exc}") from None
        seen[tuple(rec[:3])] = (path, line)
    if window is None:
        recorder.window = max(settings.get("window", 1), len(recorder.steps))
    return recorder


def _setting(header: dict[str, Any], key: str) -> Any:
    """A header's sync, window or cost (its ``cp_cost`` when it has one)."""
    if key == "cost":
        return header.get("cp_cost", header.get("cost"))
    return header.get(key)


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _read(path: Path) -> tuple[dict[str, Any] | None, list[tuple[int, tuple[Any, ...]]]]:
    """The header (or None) and the records ``(line, (rank, step, slot, lengths, seconds,
    pieces))`` of one file; raises ValueError naming the file and line of a bad one."""
    header: dict[str, Any] | None = None
    records: list[tuple[int, tuple[Any, ...]]] = []
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            where = f"{path}:{number}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not a JSON object ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise ValueError(
                    f"{where}: expected a JSON object (a header or a record), got "
                    f"{type(obj).__name__}"
                )
            if "format" in obj:
                if header is not None or records:
                    raise ValueError(
                        f"{where}: a header after the first line; files joined with `cat`? "
                        "Pass them as separate files"
                    )
                header = _check_header(obj, where)
                continue
            records.append((number, _check_record(obj, where)))
    return header, records


def _check_header(obj: dict[str, Any], where: str) -> dict[str, Any]:
    if obj.get("format") != FORMAT:
        raise ValueError(f"{where}: format {obj.get('format')!r} is not {FORMAT!r}")
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{where}: version must be a positive integer, got {version!r}")
    if version > VERSION:
        raise ValueError(
            f"{where}: written as version {version} by a newer seqbalance; this one reads "
            f"version {VERSION}: upgrade seqbalance"
        )
    unknown = sorted(set(obj) - set(_HEADER_KEYS))
    if unknown:
        raise ValueError(
            f"{where}: unknown header key(s) {unknown}; a header has {list(_HEADER_KEYS)}"
        )
    if "cost" in obj and "cp_cost" in obj:
        raise ValueError(f"{where}: a header has 'cost' or 'cp_cost', not both")
    if "sync" in obj and obj["sync"] not in SYNC_MODELS:
        raise ValueError(f"{where}: sync must be one of {list(SYNC_MODELS)}, got {obj['sync']!r}")
    window = obj.get("window", 1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"{where}: window must be a positive integer, got {window!r}")
    for key in ("cost", "cp_cost"):
        if key in obj and not isinstance(obj[key], dict):
            raise ValueError(f"{where}: {key!r} must be a cost model's to_dict() object")
    return obj


def _check_record(obj: dict[str, Any], where: str) -> tuple[Any, ...]:
    unknown = sorted(set(obj) - set(_RECORD_KEYS))
    if unknown:
        raise ValueError(
            f"{where}: unknown key(s) {unknown}; a record has {list(_RECORD_KEYS[:5])} and, "
            "for a GPU of a context-parallel plan, 'pieces'"
        )
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise ValueError(f"{where}: the record lacks {missing}")
    if obj.get("pieces", []) is None:
        raise ValueError(f"{where}: 'pieces' is null; leave it out for whole sequences")
    return (*(obj[k] for k in _REQUIRED), obj.get("pieces"))
