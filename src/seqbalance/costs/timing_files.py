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

from .._validate import check_choice, check_positive_int
from .context_parallel import ContextParallelCost
from .feedback import SYNC_MODELS, TimingRecorder, _nonneg_int
from .load import cost_from_dict

__all__ = ["FORMAT", "VERSION", "load_timings", "read_link", "save_timings", "with_link"]

FORMAT = "seqbalance-timings"
VERSION = 1
_HEADER_KEYS = ("format", "version", "sync", "window", "cost", "cp_cost")
_RECORD_KEYS = ("rank", "step", "slot", "lengths", "seconds", "pieces")
_REQUIRED = _RECORD_KEYS[:5]


def save_timings(recorder: TimingRecorder, path: str | os.PathLike[str]) -> Path:
    """Write ``recorder``'s settings and records to ``path`` (JSON Lines; see the module).

    The file is written under a temporary name and renamed over ``path`` (over the file
    a symbolic link at ``path`` points to), so a reader never sees half of it: a job may
    save every few steps while another process reads. It gets the permissions of the
    file it replaces, or those the umask gives a new file.

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
    target = Path(os.path.realpath(path))  # through a symbolic link, not over it
    try:
        mode = target.stat().st_mode & 0o7777
    except FileNotFoundError:
        mode = 0o666 & ~_umask()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)  # mkstemp makes it 0600
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
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
    recorder_type: type[TimingRecorder] = TimingRecorder,
) -> TimingRecorder:
    """A :class:`TimingRecorder` holding the records of one or more timing files.

    Parameters
    ----------
    paths
        One file or several (e.g. one a rank, when the ranks did not gather their
        records); a (rank, step, slot) may appear in only one of them.
    cost : optional
        The cost to predict with (anything :class:`TimingRecorder` takes). Default: the
        headers' cost, else tokens. A plain cost given for files whose header carries a
        context-parallel link is wrapped in that link (bandwidth, overlap, K/V bytes,
        passes: the refit still subtracts the communication); pass a
        :class:`ContextParallelCost` to replace the link as well.
    sync : {"fsdp", "ddp"}, optional
        Default: the headers' sync model, else ``"fsdp"``.
    window : int, optional
        Steps kept. Default: the largest of the headers' windows, raised to the number
        of steps in the files, so that loading drops nothing (a smaller ``window`` drops
        the oldest steps, after every record was checked).
    recorder_type : type, optional
        The class to build (:meth:`TimingRecorder.load` passes its own).

    Raises
    ------
    ValueError
        A file that is not UTF-8 text or given twice, a line that is not a JSON object or
        repeats a key, a header of another format or a newer version, a record with a
        missing, unknown or malformed field (the message names the file and line), the
        same (rank, step, slot) twice, headers that disagree on the sync or the cost when
        it is not given here, or a plain ``cost`` of unknown units for a CP link.
    """
    if sync is not None:
        check_choice(sync, "sync", SYNC_MODELS)
    if window is not None:
        window = check_positive_int(window, "window")
    files = _files(paths)
    headers: list[tuple[Path, dict[str, Any]]] = []
    records: list[tuple[Path, int, tuple[Any, ...]]] = []
    for path in files:
        header, recs = _read(path)
        if header is not None:
            headers.append((path, header))
        records.extend((path, line, rec) for line, rec in recs)
    settings = {
        "sync": _agreed(headers, "sync", "pass sync= to say which to use")
        if sync is None else sync,
        "window": max((h["window"] for _, h in headers if "window" in h), default=1),
    }  # fmt: skip
    if cost is None:
        chosen = _agreed(headers, "cost", "pass cost= to say which to use")
        if chosen is not None:
            src = next(p for p, h in headers if _setting(h, "cost") is not None)
            try:
                if "cost" in chosen:
                    chosen = ContextParallelCost.from_dict(dict(chosen))
                else:
                    chosen = cost_from_dict(chosen)
            except ValueError as exc:
                raise ValueError(f"{src}: the header's cost: {exc}") from None
    else:
        chosen = cost
        link = _agreed(headers, "link", "pass a ContextParallelCost as cost= to say which")
        if link is not None and not isinstance(cost, ContextParallelCost):
            src = next(p for p, h in headers if _setting(h, "link") is not None)
            try:
                chosen = with_link(cost, link)
            except ValueError as exc:
                raise ValueError(f"{src}: {exc}") from None
    recorder = recorder_type(
        chosen,
        sync=settings["sync"] or "fsdp",
        # Everything first; the window given, else the headers' raised to the steps the
        # files hold, is applied below.
        window=2**62,
    )
    seen: dict[tuple[int, int, int], tuple[Path, int]] = {}
    for path, line, rec in records:
        try:
            key = (_nonneg_int(rec[0], "rank"), _nonneg_int(rec[1], "step"),
                   _nonneg_int(rec[2], "slot"))  # fmt: skip
            prior = seen.get(key)
            if prior is not None:
                hint = "" if prior[0] == path else (
                    " (MicroBatchTimer gathers every rank's records onto every rank: save "
                    "them on one rank, or load one rank's file)"
                )  # fmt: skip
                raise ValueError(
                    f"rank {key[0]} step {key[1]} slot {key[2]} is also recorded at "
                    f"{prior[0]}:{prior[1]}; each micro-batch may be recorded once{hint}"
                )
            recorder.record(*key, rec[3], rec[4], pieces=rec[5])
        except ValueError as exc:
            raise ValueError(f"{path}:{line}: {exc}") from None
        seen[key] = (path, line)
    recorder.window = window if window is not None else max(settings["window"],
                                                            len(recorder.steps))  # fmt: skip
    recorder._trim()  # as record() would have: the oldest steps first
    return recorder


def read_link(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]
              ) -> dict[str, Any] | None:  # fmt: skip
    """The context-parallel link the files' headers name, or None; reads only the first
    lines. The link is the ``cp_cost``'s ``to_dict()`` with its sequence cost under
    ``"saved_cost"`` (whose units ``"cost_per_second"`` counts), for :func:`with_link`.

    Raises
    ------
    ValueError
        As :func:`load_timings` for a malformed header, or when headers name different
        links.
    """
    headers = []
    for path in _files(paths):
        header, _ = _read(path, header_only=True)
        if header is not None:
            headers.append((path, header))
    return _agreed(headers, "link", "pass the link to use")


def with_link(cost: Any, link: Mapping[str, Any]) -> ContextParallelCost:
    """``cost`` (anything :func:`load_cost` takes) under the link ``link`` (see
    :func:`read_link`); ``link["cost_per_second"]`` applies only to the cost it was saved
    with, other costs get their own default (4e14 for a FlopsCost, 1 in seconds).

    Raises
    ------
    ValueError
        When ``cost``'s units per second are unknown (e.g. a token cost other than the
        one saved): pass a :class:`ContextParallelCost` instead.
    """
    from .feedback import _resolve_cost

    model = _resolve_cost(cost)
    same = model.to_dict() == link.get("saved_cost")
    params = {k: link[k] for k in ("bandwidth", "overlap", "kv_bytes_per_token", "comm_passes")
              if k in link}  # fmt: skip
    cps = link.get("cost_per_second") if same else None
    try:
        return ContextParallelCost(model, cost_per_second=cps, **params)
    except ValueError as exc:
        raise ValueError(
            f"the files' CP link cannot price this cost ({exc}); pass a "
            "ContextParallelCost(cost, cost_per_second=..., ...) as the cost"
        ) from None


def _umask() -> int:
    """The process's umask (Linux: read, not set, so no other thread sees it change)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _files(paths: Any) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    files = [Path(p) for p in paths]
    if not files:
        raise ValueError("no timing files given")
    seen: dict[str, Path] = {}
    for p in files:
        real = os.path.realpath(p)
        if real in seen:
            raise ValueError(f"{p} is given twice (also as {seen[real]}); give each file once")
        seen[real] = p
    return files


def _agreed(headers: list[tuple[Path, dict[str, Any]]], key: str, how: str) -> Any:
    """The headers' sync, cost (``cp_cost`` when there is one) or CP link; a ValueError
    when two headers differ."""
    values = [(p, v) for p, h in headers if (v := _setting(h, key)) is not None]
    if not values:
        return None
    first_path, first = values[0]
    for p, v in values[1:]:
        if v != first:
            what = {"sync": "syncs", "cost": "costs", "link": "CP links"}[key]
            raise ValueError(f"the headers of {first_path} and {p} give different {what}; {how}")
    return first


def _setting(header: dict[str, Any], key: str) -> Any:
    if key == "cost":
        return header.get("cp_cost", header.get("cost"))
    if key == "link":
        cp = header.get("cp_cost")
        if cp is None:
            return None
        out = {k: v for k, v in cp.items() if k != "cost"}
        out["saved_cost"] = cp["cost"]
        return out
    return header.get(key)


def _dumps(obj: Mapping[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _open(path: Path) -> Any:
    # utf-8-sig: a byte-order mark (some Windows editors write one) is not part of the JSON.
    return open(path, encoding="utf-8-sig")


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _RepeatedKey(k)
        out[k] = v
    return out


class _RepeatedKey(ValueError):
    pass


def _parse(text: str, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(text, object_pairs_hook=_no_repeats)
    except _RepeatedKey as exc:
        raise ValueError(f"{where}: key {exc.args[0]!r} appears twice in one object") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{where}: not a JSON object ({exc.msg})") from None
    except RecursionError:
        raise ValueError(f"{where}: nested too deeply to be a record") from None
    if not isinstance(obj, dict):
        raise ValueError(
            f"{where}: expected a JSON object (a header or a record), got {type(obj).__name__}"
        )
    return obj


def _read(
    path: Path, header_only: bool = False
) -> tuple[dict[str, Any] | None, list[tuple[int, tuple[Any, ...]]]]:
    """The header (or None) and the records ``(line, (rank, step, slot, lengths, seconds,
    pieces))`` of one file (none with ``header_only``: it stops after the first line);
    raises ValueError naming the file and line of a bad one."""
    header: dict[str, Any] | None = None
    records: list[tuple[int, tuple[Any, ...]]] = []
    try:
        with _open(path) as f:
            for number, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                where = f"{path}:{number}"
                obj = _parse(text, where)
                if "format" in obj:
                    if header is not None or records:
                        raise ValueError(
                            f"{where}: a header after the first line; files joined with "
                            "`cat`? Pass them as separate files"
                        )
                    header = _check_header(obj, where)
                elif not header_only:
                    records.append((number, _check_record(obj, where)))
                if header_only:
                    break
    except UnicodeDecodeError:
        raise ValueError(
            f"{path}: not UTF-8 text (compressed, or another format?); timing files are "
            "JSON Lines written by TimingRecorder.save"
        ) from None
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
    if "cost" in obj and not (isinstance(obj["cost"], dict) and "kind" in obj["cost"]):
        raise ValueError(
            f"{where}: 'cost' must be a cost model's to_dict() (an object with a 'kind')"
        )
    if "cp_cost" in obj and not (
        isinstance(obj["cp_cost"], dict) and isinstance(obj["cp_cost"].get("cost"), dict)
    ):
        raise ValueError(
            f"{where}: 'cp_cost' must be a ContextParallelCost's to_dict() (an object with "
            "the sequence 'cost')"
        )
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
    pieces = obj.get("pieces", [])
    if pieces is None:
        raise ValueError(f"{where}: 'pieces' is null; leave it out for whole sequences")
    return (*(obj[k] for k in _REQUIRED), obj.get("pieces"))
