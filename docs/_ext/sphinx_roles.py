"""Griffe extension for the API reference: Sphinx roles in docstrings as inline code.

The docstrings cross-reference with Sphinx roles (``:func:`plan```, ``:class:`~x.Plan```),
which Markdown would print as they are. This turns each into inline code of the name
(the last component when the target starts with ``~``, as Sphinx shows it), and a
literal-block marker ``text::`` into ``text:``.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|term):`(~?)([^`]+)`")


def _code(m: re.Match[str]) -> str:
    target = m.group(2).strip()
    if m.group(1):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles of every docstring griffe loads."""

    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            text = _ROLE.sub(_code, obj.docstring.value)
            obj.docstring.value = re.sub(r"(?<=\w)::$", ":", text, flags=re.M)
