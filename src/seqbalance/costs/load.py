"""``load_cost``: turn whatever the user names into a cost model."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .base import CostModel, TokenCost, cost_from_dict
from .flops import SHIPPED, FlopsCost

__all__ = ["cost_from_dict", "load_cost"]


def _from_mapping(data: Mapping[str, Any]) -> CostModel:
    if "kind" in data:
        return cost_from_dict(data)
    return FlopsCost.from_hf_config(dict(data))  # a Hugging Face config


def load_cost(spec: Any = None) -> CostModel:
    """Return the cost model ``spec`` names.

    Parameters
    ----------
    spec
        - a cost model: returned as is;
        - None or ``"tokens"``: :class:`TokenCost`;
        - a shipped model name such as ``"qwen2.5-7b"`` (case-insensitive):
          :class:`FlopsCost` of that config;
        - a path to a Hugging Face ``config.json`` or to a folder holding one, a dict of
          one, or an object with ``to_dict()``: :class:`FlopsCost`;
        - a path to a cost JSON (written by ``seqbalance calibrate`` or ``save``/
          ``to_json``) or its dict: the model it describes (a :class:`QuadraticCost` for a
          calibrated cost).

    Raises
    ------
    ValueError
        If ``spec`` names nothing of the above; the message lists the shipped names.

    Examples
    --------
    >>> load_cost(None)
    TokenCost(per_microbatch=0, per_sequence=0, per_token=1, per_token_sq=0)
    >>> load_cost("Qwen2.5-7B").name
    'qwen2.5-7b'
    """
    if isinstance(spec, CostModel):
        return spec
    if spec is None or (isinstance(spec, str) and spec.lower() == "tokens"):
        return TokenCost()
    if isinstance(spec, Mapping):
        return _from_mapping(spec)
    if isinstance(spec, str) and not spec.strip():
        raise ValueError(
            "cost is an empty string; pass None or 'tokens' to balance tokens, a shipped "
            f"model name ({', '.join(SHIPPED)}), or a path to a config/cost JSON"
        )
    if isinstance(spec, str) and spec.lower() in SHIPPED:
        return FlopsCost.from_name(spec)
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if path.is_dir():
            return FlopsCost.from_hf_config(path)
        if path.is_file():
            try:
                data = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"cost file {str(path)!r} is not valid JSON ({exc})") from exc
            except ValueError:  # json.loads applies Python's digit limit for int()
                raise ValueError(
                    f"cost file {str(path)!r} holds an integer of more than 4,300 digits, "
                    "which no cost field needs; fix the file"
                ) from None
            if not isinstance(data, dict):
                raise ValueError(f"cost file {str(path)!r} must hold a JSON object")
            try:
                return _from_mapping(data)
            except ValueError as exc:
                if str(path) in str(exc):
                    raise
                raise ValueError(f"{path}: {exc}") from None
        raise ValueError(
            f"unknown cost {str(spec)!r}: not 'tokens', not a shipped model name "
            f"({', '.join(SHIPPED)}), and no such file or folder (a HF config.json, its "
            "folder, or a cost JSON from `seqbalance calibrate`)"
        )
    if callable(getattr(spec, "to_dict", None)):
        return FlopsCost.from_hf_config(spec)
    raise ValueError(
        f"cost must be a cost model, None, 'tokens', a shipped model name "
        f"({', '.join(SHIPPED)}), or a path to a config/cost JSON; got {type(spec).__name__}"
    )
