"""Integration: the ``seqbalance`` command line (``plan``, ``compare``, ``calibrate``).

- :mod:`.commands`: argument parsing and the commands; :func:`main` is the console entry point.
- :mod:`.readers`: length files (text, JSON, .npy, CSV, JSONL, Parquet).
- :mod:`.plotting`: the timeline plot (matplotlib, imported when a plot is asked for).

rich, matplotlib and pyarrow are optional (``pip install ".[cli]"``) and imported lazily.
"""

from __future__ import annotations

from .commands import main

__all__ = ["main"]
