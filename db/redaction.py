"""Hiding database passwords: the one place a URL is made fit to print or store.

A URL reaches a message, a log, a tune summary or the stored job only through ``redact_url``; a driver's or a
parser's message about a URL only through ``scrub``. Both work on the text as the user typed it, not on what a
URL parser makes of it: a password with an unencoded ``/``, ``@``, ``?`` or ``#`` parses as something else (part
of it as the host, the path or the query), and would then be printed in part by a parser-based redaction.

What counts as the password, generously (hiding too much costs a less precise message, too little a secret):
- in the userinfo, everything after the first ``:`` up to the *last* ``@`` of the URL;
- in the query, everything after ``password=`` to the end of the URL (an unencoded ``&`` in the password could
  not be told from the next parameter).
"""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus, unquote, unquote_plus

__all__ = ["HIDDEN", "redact_url", "scrub"]

#: What a password is replaced with.
HIDDEN = "***"
_QUERY_PASSWORD = re.compile(r"[?&;]password=", re.IGNORECASE)


def _secrets(url: str) -> list[tuple[int, int]]:
    """The spans of ``url`` that hold a password, in order."""
    spans: list[tuple[int, int]] = []
    end = len(url)
    if (q := _QUERY_PASSWORD.search(url)) is not None:
        spans.append((q.end(), len(url)))
        end = q.start()
    scheme = url.find("://", 0, end)
    start = scheme + 3 if scheme >= 0 else 0
    at = url.rfind("@", start, end)
    colon = url.find(":", start, at)
    if at > start and colon >= 0:
        spans.insert(0, (colon + 1, at))
    return spans


def redact_url(url: str) -> str:
    """``url`` with every password in it replaced by ``***`` (the userinfo's and a ``?password=`` parameter's)."""
    out, pos = [], 0
    for a, b in _secrets(url):
        out += [url[pos:a], HIDDEN]
        pos = b
    return "".join([*out, url[pos:]])


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's or parser's message about ``url``) with ``url`` redacted and its password hidden in
    every spelling a message could use (as typed, percent-encoded, percent-decoded)."""
    text = text.replace(url, redact_url(url))
    for a, b in _secrets(url):
        raw = url[a:b]
        for secret in sorted({raw, unquote(raw), unquote_plus(raw), quote(raw, safe=""), quote_plus(raw)},
                             key=len, reverse=True):
            if secret:
                text = text.replace(secret, HIDDEN)
    return text
