"""The package version: the one place it is written (``pyproject.toml`` reads it from here)."""

from __future__ import annotations

__version__ = "1.0.0rc1"
