"""MkDocs hook: Sphinx roles in docstrings shown as code.

The docstrings are Google style with Sphinx roles (``:class:`~agentlease.Queue```); Markdown
renders such a role as ``:class:<code>~agentlease.Queue</code>``. This hook drops the role and
the ``~`` (keeping the last dotted part, as Sphinx shows it), and ``:pep:`562``` reads PEP 562.
The ``::`` that opens a reStructuredText literal block reads ``:``.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(
    r":(?:py:)?(class|func|meth|attr|data|exc|mod|obj|const|pep):<code>(~?)([^<]*)</code>"
)


def _code(match: re.Match[str]) -> str:
    role, tilde, target = match.groups()
    if role == "pep":
        return f"PEP {target}"
    if tilde:
        target = target.rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


# reStructuredText's "text::" before a literal block: the block renders as code, the colon stays.
_LITERAL = re.compile(r"::</p>(\s*<div class=\"(?:highlight|language-)?)")


def on_page_content(html: str, **_kwargs: Any) -> str:
    return _LITERAL.sub(r":</p>\1", _ROLE.sub(_code, html))
