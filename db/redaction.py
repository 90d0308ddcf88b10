"""Hiding database passwords: the one place a URL is made fit to print or store.

A URL reaches a message, a log, a tune summary or the stored job only through ``redact_url``; a driver's or a
parser's message about a URL only through ``scrub``. Both work on the text as the user typed it, not on what a
URL parser makes of it: a password with an unencoded ``/``, ``@``, ``?`` or ``#`` parses as something else (part
of it as the host, the path or the query), and would then be printed in part by a parser-based redaction.

What counts as the password, generously (hiding too much costs a less precise message, too little a secret):
- in the userinfo, everything after the first ``:`` up to the *last* ``@`` of the URL;
- in the query, everything after the first secret parameter's ``=`` to the end of the URL (an unencoded ``&`` in
  the password could not be told from the next parameter). A parameter is secret when its key *as the driver
  reads it* names a secret: SQLAlchemy decodes query keys with ``parse_qsl`` (``+`` is a space, ``%XX`` a byte)
  and libpq ignores the spaces around a key, so ``%70assword``, ``pass%77ord`` and ``+password`` all log in
  with the value. A key that decodes to more than a secret's name (``password%3Dhunter2``) holds the secret
  itself: everything from the key on is hidden.
"""

from __future__ import annotations

import re
from urllib.parse import quote, quote_plus, unquote, unquote_plus

__all__ = ["HIDDEN", "SECRET_KEYS", "redact_url", "scrub"]

#: What a password is replaced with.
HIDDEN = "***"
#: Query keys whose value is a secret, as the driver reads them (libpq's ``password`` and ``sslpassword``).
SECRET_KEYS = frozenset({"password", "sslpassword"})
#: A decoded key holding any of these is taken for a secret's (generously: a misspelled or unknown one too).
_SECRET_MARKS = ("pass", "secret", "token")
_QUERY_PARAM = re.compile(r"[?&;]([^&;]*)")


def _decoded_key(key: str) -> str:
    """A query key as the driver reads it: ``parse_qsl``'s decoding, then libpq's trimming of spaces."""
    return unquote_plus(key).strip().lower()


def _query_secret(url: str) -> tuple[int, int, int] | None:
    """(where the first secret query parameter starts, where its hidden part starts, the URL's end), or None."""
    for m in _QUERY_PARAM.finditer(url):
        key, eq, _ = m.group(1).partition("=")
        name = _decoded_key(key)
        if not any(mark in name for mark in _SECRET_MARKS):
            continue
        hidden = m.start(1) + len(key) + 1 if name in SECRET_KEYS and eq else m.start(1)
        return m.start(), hidden, len(url)
    return None


def _secrets(url: str) -> list[tuple[int, int]]:
    """The spans of ``url`` that hold a password, in order."""
    spans: list[tuple[int, int]] = []
    end = len(url)
    scheme = url.find("://")
    start = scheme + 3 if scheme >= 0 else 0
    if (q := _query_secret(url)) is not None:
        colon = url.find(":", start, q[0])
        if "@" not in url[start:q[0]] and "@" in url[q[0]:] and colon >= 0:
            # the "query" may be part of a userinfo password (``alice:x?password@host``): hide all after its ":"
            return [(colon + 1, len(url))]
        spans.append((q[1], q[2]))
        end = q[0]
    at = url.rfind("@", start, end)
    colon = url.find(":", start, at)
    if at > start and colon >= 0:
        spans.insert(0, (colon + 1, at))
    return spans


def redact_url(url: str) -> str:
    """``url`` with every password in it replaced by ``***`` (the userinfo's and a secret query parameter's)."""
    out, pos = [], 0
    for a, b in _secrets(url):
        out += [url[pos:a], HIDDEN]
        pos = b
    return "".join([*out, url[pos:]])


def scrub(text: str, url: str) -> str:
    """``text`` (a driver's or parser's message about ``url``) with ``url`` redacted and its password hidden in
    every spelling a message could use (as typed, percent-encoded, percent-decoded), and each ``=``-separated
    part of a hidden span on its own (a secret inside a key, ``password%3Dhunter2``, is echoed as the option
    ``password=hunter2``)."""
    text = text.replace(url, redact_url(url))
    for a, b in _secrets(url):
        raw = url[a:b]
        spellings = {raw, unquote(raw), unquote_plus(raw), quote(raw, safe=""), quote_plus(raw)}
        parts = {p for s in spellings for p in s.split("=") if len(p) > 1 and _decoded_key(p) not in SECRET_KEYS}
        for secret in sorted(spellings | parts, key=len, reverse=True):
            if secret:
                text = text.replace(secret, HIDDEN)
    return text
