"""Store URLs as they may appear in messages: no password, no key file.

A backend URL can carry a password (``redis://user:secret@host``, ``postgresql://...?password=``)
and the path of a TLS private key (``ssl_keyfile=``, ``sslkey=``). Every message, log line,
``repr`` and table that names a store shows :func:`redact_url` of its URL, never the URL itself,
including the messages that refuse a malformed URL, which the parsers cannot split reliably:
the redaction works on the text, and when in doubt masks more rather than less.
"""

from __future__ import annotations

import re

__all__ = ["SECRET_OPTIONS", "misplaced_at", "redact_url", "unreadable"]

SECRET_OPTIONS = frozenset({"password", "sslpassword", "ssl_password", "ssl_keyfile", "sslkey"})
"""URL options whose values never appear in messages."""

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_OPTION = re.compile(r"(?i)([?&;](?:" + "|".join(sorted(SECRET_OPTIONS)) + r")=)[^&;#]*")


def redact_url(url: object) -> str:
    """``url`` as text for a message: the password and secret options replaced by ``***``.

    The user part ends at the last ``@`` of the URL (a password may hold unescaped ``/``, ``?``
    or ``#`` that would end a well-formed one earlier), and everything between its first ``:``
    and that ``@`` is masked. Anything that is not a string is shown by its type only.
    """
    if not isinstance(url, str):
        return f"<{type(url).__name__}>"
    text = _OPTION.sub(r"\1***", url)
    scheme = _SCHEME.match(text)
    start = scheme.end() if scheme else 0
    at = text.rfind("@")
    if at > start:
        colon = text.find(":", start, at)
        if colon != -1:
            text = f"{text[: colon + 1]}***{text[at:]}"
    return text


def misplaced_at(url: str, netloc: str) -> str | None:
    """Why ``url`` cannot be read, if it holds an ``@`` beyond its host part ``netloc`` (as
    split by :func:`urllib.parse.urlsplit`): a password with an unescaped ``/``, ``?`` or ``#``
    ends the host part early, and the parser's own complaint would quote part of it."""
    if "@" in url and "@" not in netloc:
        return (
            f"{redact_url(url)!r} holds an '@' after its host part: percent-encode '/', '?', '#' "
            "and '@' in a user name or password (%2F, %3F, %23, %40)"
        )
    return None


_CONTROL = re.compile(r"[\x00-\x20\x7f\ud800-\udfff]")


def unreadable(url: str) -> str | None:
    """Why ``url`` is refused before it is split, if it holds a space, a control character or a
    lone surrogate: :func:`urllib.parse.urlsplit` silently drops tabs and newlines, so a raw
    newline in ``prefix=a<newline>b`` would name the namespace ``ab``, not the one its author
    meant; a NUL ends a C string in the drivers; a lone surrogate has no UTF-8."""
    found = _CONTROL.search(url)
    if found is None:
        return None
    return (
        f"{redact_url(_CONTROL.sub('?', url))!r} holds a space, a control character or a lone "
        "surrogate (shown as '?'): a URL is printable text (percent-encode others as %XX)"
    )
