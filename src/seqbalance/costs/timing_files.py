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

A job can also write its records as they arrive (:meth:`TimingRecorder.stream_to`), so a
long run keeps every step, not only the recorder's window, and a stopped job loses at
most the line it was writing. A job that resumes from a checkpoint and streams to the
same file (``resume=True``) first writes a resume marker, a header with ``"resumed":
true`` that repeats the file's settings; on loading, the steps timed after a marker
replace the same steps timed before it (a job resumed from a checkpoint runs them
again), with a warning that says which.

A file without a header is accepted (records written by other tools); the settings then
come from the caller. Records are written in (step, rank, slot) order with Python's
shortest round-trip float text, so a file loaded and saved again is byte-identical, and
every rank that loads it refits the same cost.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from .._validate import check_choice, check_positive_int
from ._timing import SYNC_MODELS, Timing, _checked_timing, _nonneg_int, _resolve_cost
from .base import TokenCost
from .context_parallel import ContextParallelCost
from .load import cost_from_dict

if TYPE_CHECKING:  # the recorder builds on this module; these only name its type
    from .feedback import TimingRecorder

__all__ = [
    "FORMAT",
    "VERSION",
    "ResumedStepsWarning",
    "TimingFileError",
    "TimingStream",
    "load_timings",
    "read_link",
    "save_timings",
    "with_link",
]

FORMAT = "seqbalance-timings"
VERSION = 1
_HEADER_KEYS = ("format", "version", "sync", "window", "cost", "cp_cost", "resumed")
_RECORD_KEYS = ("rank", "step", "slot", "lengths", "seconds", "pieces")
_REQUIRED = _RECORD_KEYS[:5]
_PHYSICAL = ("bandwidth", "overlap", "kv_bytes_per_token", "comm_passes")


class TimingFileError(ValueError):
    """A timing file's own content is invalid: the message names the file (and line) and
    the file's keys and values, not a caller's arguments."""


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
    target = Path(os.path.realpath(path))  # through a symbolic link, not over it
    stream = recorder._stream
    if stream is not None and not stream.closed and stream._real == str(target):
        # The rename would leave the stream appending to the replaced file.
        raise ValueError(
            f"{path} is the file this recorder streams to, which holds every record "
            "already; save to another path"
        )
    if _held_elsewhere(target):
        # The rename would leave that stream appending to a file no longer at path.
        raise ValueError(
            f"{path} is being streamed to by another recorder or process; save to another "
            "path"
        )
    text = _dumps(_header(recorder)) + "\n" + _lines(recorder.records)
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


def _header(recorder: TimingRecorder) -> dict[str, Any]:
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
    return header


def _lines(records: Iterable[Timing]) -> str:
    """The records as lines of text, each ending in a newline."""
    out = []
    for r in records:
        rec: dict[str, Any] = {
            "rank": r.rank,
            "step": r.step,
            "slot": r.slot,
            "lengths": r.lengths.tolist(),
            "seconds": r.seconds,
        }
        if r.pieces is not None:
            rec["pieces"] = r.pieces.tolist()
        out.append(_dumps(rec) + "\n")
    return "".join(out)


class ResumedStepsWarning(UserWarning):
    """Steps timed again after a resume marker replaced their earlier records on loading."""


class TimingStream:
    """An open timing file that a :class:`TimingRecorder` appends its records to.

    Made by :meth:`TimingRecorder.stream_to`, which documents the behaviour; ``close()``
    (or ``stream_to(None)``) ends it.
    """

    def __init__(
        self, recorder: TimingRecorder, path: str | os.PathLike[str], *, resume: bool = False
    ) -> None:
        self.path = Path(path)
        self._file: IO[str] | None = None
        self._real = os.path.realpath(self.path)  # for save(): the same file?
        # Made before the file is opened: a cost that cannot be written leaves no file.
        fresh = _dumps(_header(recorder)) + "\n" + _lines(recorder.records)
        # Opened for appending (every write lands at the end, also after a crash) and
        # locked before it is read, so two writers cannot both find it empty.
        file = open(self.path, "a", encoding="utf-8")
        try:
            _lock(file, self.path)
            head = _existing_header(self.path)
            if head is None:
                text = fresh
            else:
                if not resume:
                    raise ValueError(
                        f"{self.path} already holds timings; pass resume=True if this job "
                        "resumes the one that wrote them (from a checkpoint), or stream to "
                        "a new file"
                    )
                _check_resumable(head, recorder, self.path)
                _mend_last_line(self.path)
                text = _dumps({**head, "resumed": True}) + "\n"
        except BaseException:
            file.close()
            raise
        self._file = file
        try:
            self._write(text)
        except BaseException:
            self.close()
            raise

    def write(self, records: Iterable[Timing]) -> None:
        """Append ``records`` and flush them to the operating system."""
        text = _lines(records)
        if text:
            self._write(text)

    def _write(self, text: str) -> None:
        if self._file is None:
            raise ValueError(f"the timing stream to {self.path} is closed")
        self._file.write(text)
        self._file.flush()

    def close(self) -> None:
        """Close the file (again: nothing); an OSError if its last records cannot be
        written, after which it is closed all the same."""
        file, self._file = self._file, None
        if file is not None:
            try:
                file.flush()
            finally:
                # Unlocked explicitly: a forked child (a DataLoader worker) shares the
                # open file and would otherwise hold the lock until it exits.
                _unlock(file)
                file.close()  # closes the descriptor even when the final flush fails

    def same_file(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` is the open file streamed to (the same inode: a renamed-away
        file is not, a hard link is)."""
        if self._file is None:
            return False
        try:
            there = os.stat(path)
        except OSError:
            return False
        mine = os.fstat(self._file.fileno())
        return (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino)

    @property
    def closed(self) -> bool:
        return self._file is None

    def __repr__(self) -> str:
        return f"TimingStream({str(self.path)!r}{', closed' if self.closed else ''})"


def _try_lock(file: IO[Any]) -> bool | None:
    """Take an exclusive advisory lock on ``file`` without waiting: True when taken, False
    when another open file holds it, None where the system or file system has no such
    locks (not POSIX; some network mounts)."""
    try:
        import fcntl
    except ImportError:
        return None
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:
        return None
    return True


def _lock(file: IO[str], path: Path) -> None:
    """Hold an exclusive advisory lock on ``file`` until it is unlocked or closed, or raise
    a ValueError when another stream holds one. Where there are no such locks, go on
    without (one writer is then the caller's to ensure)."""
    if _try_lock(file) is False:
        raise ValueError(
            f"another stream is writing to {path} (another process, or another recorder "
            "in this one); their lines would interleave. Records gathered by "
            "MicroBatchTimer are the same on every rank: stream on one (if rank == 0), or "
            "give each writer its own file"
        )


def _unlock(file: IO[Any]) -> None:
    try:
        import fcntl

        fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    except (ImportError, OSError, ValueError):  # no locks here, or the file is gone
        pass


def _held_elsewhere(path: Path) -> bool:
    """Whether another stream holds ``path``'s lock (False where locks are unknown)."""
    try:
        with open(path, "rb") as f:
            taken = _try_lock(f)
            if taken:
                _unlock(f)
    except OSError:  # no file there
        return False
    return taken is False


def _existing_header(path: Path) -> dict[str, Any] | None:
    """The header of a timing file to append to; None when there is no file or it holds
    nothing (blank lines, a byte-order mark: emptied)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size == 0:
        return None
    header, _ = _read(path, header_only=True)
    if header is None:
        if _read(path)[1]:
            raise ValueError(
                f"{path} holds records without a header (not written by seqbalance); "
                "stream to a new file"
            )
        os.truncate(path, 0)
    return header


def _mend_last_line(path: Path) -> None:
    """Remove a last line cut short (a job stopped while writing it), with a warning; give
    a complete last line without its newline one."""
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        f.seek(max(0, end - 1))
        if f.read(1) == b"\n":
            return
        # Find the start of the last line (the file is small enough to scan from the end).
        start = end
        while start > 0:
            step = min(65536, start)
            f.seek(start - step)
            chunk = f.read(step)
            i = chunk.rfind(b"\n")
            if i >= 0:
                start = start - step + i + 1
                break
            start -= step
        f.seek(start)
        tail = f.read()
        try:
            complete = isinstance(json.loads(tail.decode("utf-8-sig")), dict)
        except (UnicodeDecodeError, ValueError):
            complete = False
        if complete:  # (the header alone is complete: _read parsed it)
            f.seek(end)
            f.write(b"\n")
        else:
            f.truncate(start)
            warnings.warn(
                f"{path}: removed its last line, cut short ({len(tail)} bytes; the job "
                "that wrote it stopped mid-line), before appending",
                stacklevel=4,
            )


def _check_resumable(head: dict[str, Any], recorder: TimingRecorder, path: Path) -> None:
    """A recorder may append to a file saved with the same sync and CP link (the cost and
    window may differ: a job resumes with its refitted cost); a header that leaves the
    sync or the cost out leaves them to the reader."""
    mine = _header(recorder)
    if "cp_cost" in head:  # with its defaults filled in, as loading reads it
        try:
            head = {**head, "cp_cost": ContextParallelCost.from_dict(head["cp_cost"]).to_dict()}
        except ValueError as exc:
            raise TimingFileError(f"{path}: the header's cp_cost: {exc}") from None
    for key, what in (("sync", "sync"), ("link", "CP link")):
        if _setting(head, "cost" if key == "link" else key) is None:
            continue
        theirs = _setting(head, key)
        ours = _setting(mine, key)
        if key == "link" and theirs is not None and ours is not None:
            # The physical link must agree; the sequence cost and its units may not.
            theirs = {k: theirs.get(k) for k in _PHYSICAL}
            ours = {k: ours.get(k) for k in _PHYSICAL}
        if theirs != ours:
            raise ValueError(
                f"{path} holds timings recorded with another {what} ({theirs!r}, not "
                f"{ours!r}); stream to a new file"
            )


def load_timings(
    paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    *,
    cost: Any = None,
    sync: str | None = None,
    window: int | None = None,
    recorder_type: type[TimingRecorder],
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
    recorder_type : type
        The class to build: :class:`TimingRecorder` or a subclass
        (:meth:`TimingRecorder.load`, which callers use, passes its own).

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
        records.extend((path, line, rec) for line, rec in _latest_steps(path, recs))
    settings: dict[str, Any] = {
        "sync": _agreed(headers, "sync", "pass sync= to say which to use")
        if sync is None else sync,
        "window": max((h["window"] for _, h in headers if "window" in h), default=1),
    }  # fmt: skip
    if cost is None:
        chosen = _agreed(headers, "cost", "pass cost= to say which to use")
        if chosen is not None:
            src = next(p for p, h in headers if _setting(h, "cost") is not None)
            field = "cost" if "kind" in chosen else "cp_cost"  # (a UlyssesCost has a "cost" too)
            try:
                if field == "cp_cost":
                    chosen = ContextParallelCost.from_dict(dict(chosen))
                else:
                    chosen = cost_from_dict(chosen)
            except ValueError as exc:
                raise TimingFileError(f"{src}: the header's {field}: {exc}") from None
    elif isinstance(cost, ContextParallelCost):
        chosen = cost  # its link replaces the files', which need not agree
    else:
        chosen = cost
        link = _agreed(headers, "link", "pass a ContextParallelCost as cost= to say which")
        if link is not None:
            src = next(p for p, h in headers if _setting(h, "link") is not None)
            try:
                check_link_values(link)
            except ValueError as exc:
                raise TimingFileError(f"{src}: the header's cp_cost: {exc}") from None
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
            raise TimingFileError(f"{path}:{line}: {exc}") from None
        seen[key] = (path, line)
    recorder.window = window if window is not None else max(settings["window"],
                                                            len(recorder.steps))  # fmt: skip
    recorder._trim()  # as record() would have: the oldest steps first
    return recorder


def _latest_steps(
    path: Path, recs: list[tuple[int, int, tuple[Any, ...]]]
) -> list[tuple[int, tuple[Any, ...]]]:
    """The records of one file with every step taken from the last segment (run of a
    job) that timed it; the records it replaces are checked, then dropped with a
    :class:`ResumedStepsWarning`."""
    last: dict[int, int] = {}
    for _, seg, rec in recs:
        step = rec[1]
        if isinstance(step, int) and not isinstance(step, bool):
            last[step] = max(seg, last.get(step, seg))
    kept, dropped = [], []
    for line, seg, rec in recs:
        step = rec[1]
        if isinstance(step, int) and not isinstance(step, bool) and last[step] > seg:
            dropped.append((line, seg, rec))
        else:
            kept.append((line, rec))
    if not dropped:
        return kept
    seen: set[tuple[int, ...]] = set()
    for line, seg, rec in dropped:
        try:
            t = _checked_timing(*rec)
            key = (seg, t.rank, t.step, t.slot)
            if key in seen:
                raise ValueError(
                    f"rank {t.rank} step {t.step} slot {t.slot} is recorded twice in one run"
                )
            seen.add(key)
        except ValueError as exc:
            raise TimingFileError(f"{path}:{line}: {exc}") from None
    steps = sorted({rec[1] for _, _, rec in dropped})
    span = str(steps[0]) if len(steps) == 1 else f"{steps[0]}..{steps[-1]}"
    warnings.warn(
        f"{path}: {len(steps)} step(s) ({span}) were timed again after a resume; their "
        f"{len(dropped)} earlier record(s) (from line {dropped[0][0]}) are replaced by the "
        "later ones",
        ResumedStepsWarning,
        stacklevel=4,
    )
    return kept


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
    link: dict[str, Any] | None = _agreed(headers, "link", "pass the link to use")
    return link


def check_link_values(link: Mapping[str, Any], skip: Iterable[str] = ()) -> None:
    """Check the settings of ``link`` (:func:`read_link`'s dict) as a
    :class:`ContextParallelCost` would, apart from its cost; ``skip`` names settings the
    caller replaces. A ValueError here is about the link's own values, not about a cost
    it is asked to price."""
    skipped = set(skip)
    given = {k: link[k] for k in (*_PHYSICAL, "cost_per_second")
             if k not in skipped and link.get(k) is not None}  # fmt: skip
    bandwidth = given.get("bandwidth")
    ContextParallelCost(
        TokenCost(),
        bandwidth=bandwidth,
        cost_per_second=given.get("cost_per_second", 1.0),
        overlap=given.get("overlap", 0.0),
        kv_bytes_per_token=given.get("kv_bytes_per_token", None if bandwidth is None else 0.0),
        comm_passes=given.get("comm_passes", 3.0),
    )


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
        raise TimingFileError(
            f"{where}: key {exc.args[0]!r} appears twice in one object"
        ) from None
    except json.JSONDecodeError as exc:
        raise TimingFileError(f"{where}: not a JSON object ({exc.msg})") from None
    except RecursionError:
        raise TimingFileError(f"{where}: nested too deeply to be a record") from None
    if not isinstance(obj, dict):
        raise TimingFileError(
            f"{where}: expected a JSON object (a header or a record), got {type(obj).__name__}"
        )
    return obj


def _read(
    path: Path, header_only: bool = False
) -> tuple[dict[str, Any] | None, list[tuple[int, int, tuple[Any, ...]]]]:
    """The header (or None) and the records ``(line, segment, (rank, step, slot, lengths,
    seconds, pieces))`` of one file (none with ``header_only``: it stops after the first
    line); ``segment`` counts the resume markers above the record. Raises ValueError
    naming the file and line of a bad one."""
    header: dict[str, Any] | None = None
    records: list[tuple[int, int, tuple[Any, ...]]] = []
    segment = 0
    try:
        with _open(path) as f:
            for number, text in enumerate(f, start=1):
                if not text.strip():
                    continue
                where = f"{path}:{number}"
                try:
                    obj = _parse(text, where)
                except ValueError as exc:
                    if text.endswith("\n"):
                        raise
                    raise TimingFileError(
                        f"{exc}; it is the last line and has no newline: cut short when "
                        "the job that wrote it stopped? Delete that line"
                    ) from None
                if "format" in obj:
                    if header is None and not records and obj.get("resumed") is not True:
                        header = _check_header(obj, where)
                    else:
                        _check_marker(obj, header, where)
                        segment += 1
                elif not header_only:
                    records.append((number, segment, _check_record(obj, where)))
                if header_only:
                    break
    except UnicodeDecodeError:
        raise TimingFileError(
            f"{path}: not UTF-8 text (compressed, or another format?); timing files are "
            "JSON Lines written by TimingRecorder.save"
        ) from None
    return header, records


def _check_marker(obj: dict[str, Any], header: dict[str, Any] | None, where: str) -> None:
    """A header below the first line must be a resume marker that repeats the first."""
    if obj.get("resumed") is not True:
        raise TimingFileError(
            f"{where}: a header after the first line; files joined with `cat`? Pass them "
            "as separate files"
        )
    if header is None:
        raise TimingFileError(
            f"{where}: a resume marker in a file that does not start with a header"
        )
    if {k: v for k, v in obj.items() if k != "resumed"} != header:
        raise TimingFileError(
            f"{where}: a resume marker whose settings differ from the file's header; "
            "resumed jobs repeat the header (TimingRecorder.stream_to)"
        )


def _check_header(obj: dict[str, Any], where: str) -> dict[str, Any]:
    if obj.get("format") != FORMAT:
        raise TimingFileError(f"{where}: format {obj.get('format')!r} is not {FORMAT!r}")
    version = obj.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise TimingFileError(f"{where}: version must be a positive integer, got {version!r}")
    if version > VERSION:
        raise TimingFileError(
            f"{where}: written as version {version} by a newer seqbalance; this one reads "
            f"version {VERSION}: upgrade seqbalance"
        )
    unknown = sorted(set(obj) - set(_HEADER_KEYS))
    if unknown:
        raise TimingFileError(
            f"{where}: unknown header key(s) {unknown}; a header has {list(_HEADER_KEYS)}"
        )
    if "resumed" in obj:
        raise TimingFileError(
            f"{where}: 'resumed' belongs to resume markers, not to the first header"
        )
    if "cost" in obj and "cp_cost" in obj:
        raise TimingFileError(f"{where}: a header has 'cost' or 'cp_cost', not both")
    if "sync" in obj and obj["sync"] not in SYNC_MODELS:
        raise TimingFileError(
            f"{where}: sync must be one of {list(SYNC_MODELS)}, got {obj['sync']!r}"
        )
    window = obj.get("window", 1)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise TimingFileError(f"{where}: window must be a positive integer, got {window!r}")
    if "cost" in obj and not (isinstance(obj["cost"], dict) and "kind" in obj["cost"]):
        raise TimingFileError(
            f"{where}: 'cost' must be a cost model's to_dict() (an object with a 'kind')"
        )
    if "cp_cost" in obj and not (
        isinstance(obj["cp_cost"], dict) and isinstance(obj["cp_cost"].get("cost"), dict)
    ):
        raise TimingFileError(
            f"{where}: 'cp_cost' must be a ContextParallelCost's to_dict() (an object with "
            "the sequence 'cost')"
        )
    return obj


def _check_record(obj: dict[str, Any], where: str) -> tuple[Any, ...]:
    unknown = sorted(set(obj) - set(_RECORD_KEYS))
    if unknown:
        raise TimingFileError(
            f"{where}: unknown key(s) {unknown}; a record has {list(_RECORD_KEYS[:5])} and, "
            "for a GPU of a context-parallel plan, 'pieces'"
        )
    missing = [k for k in _REQUIRED if k not in obj]
    if missing:
        raise TimingFileError(f"{where}: the record lacks {missing}")
    pieces = obj.get("pieces", [])
    if pieces is None:
        raise TimingFileError(f"{where}: 'pieces' is null; leave it out for whole sequences")
    return (*(obj[k] for k in _REQUIRED), obj.get("pieces"))
