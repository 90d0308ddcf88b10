"""The dashboard's server: Streamlit's ASGI app (``st.App``) serving ``app.py``, which ``advisor dashboard`` runs
with ``streamlit run ui/server.py``.

Why not ``streamlit run ui/app.py``: on a deep link (``/study?study=…``) Streamlit's page cannot tell a page's
path from a base URL path, so it first asks ``/study/_stcore/health`` and ``/study/_stcore/host-config`` — two
404s per page load — before it finds the server at ``/``. The page reads its base URL from
``window.__streamlit.BACKEND_BASE_URL`` when that is set, so a middleware of this app (``BaseUrlAtRoot``) sets
it, in the HTML page it serves, to the root of the address the page was loaded from: the server is always at ``/``
(``advisor dashboard`` sets no base URL path), and a page then asks only there. The same page preloads the chunks
its first picture and its first chart need (``head_tags``), and Streamlit's static files go gzipped from a cache
filled once per server (``StaticGzip``), not compressed again for every browser.
"""

from __future__ import annotations

import asyncio
import gzip
import re
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import streamlit as st
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware

#: Set before Streamlit's own script runs; ``location.origin + "/"``: the server's root, as the page was reached.
BASE_URL_SCRIPT = b'<script>window.__streamlit={BACKEND_BASE_URL: window.location.origin + "/"};</script>'


def chunk(name: str) -> str | None:
    """The path of Streamlit's JavaScript chunk ``name`` (``/static/js/<name>.<hash>.js``); None where this
    Streamlit has none."""
    found = sorted((Path(st.__file__).resolve().parent / "static" / "static" / "js").glob(f"{name}.*.js"))
    return f"/static/js/{found[0].name}" if found else None


def plotly_chunk() -> str | None:
    """The path of Streamlit's Plotly chunk (``/static/js/PlotlyChart.<hash>.js``, about 4.7 MB), which its page
    otherwise fetches only when the first chart's data arrives (None where this Streamlit has none)."""
    return chunk("PlotlyChart")


def head_tags() -> bytes:
    """What goes right after ``<head>``: the base URL, and a ``prefetch`` of the Plotly chunk, fetched at low
    priority into the browser's cache while the script runs and compiled only when a chart arrives. Preloaded as a
    module instead, its 4.7 MB were compiled while the page started, on the same CPU the page's first picture and
    text were drawn with (the study page's first picture, the headline's topology, needs no Plotly)."""
    plotly = plotly_chunk()
    return BASE_URL_SCRIPT + (f'<link rel="prefetch" href="{plotly}">'.encode() if plotly else b"")


# ---------------------------------------------------------------------------------- static files, gzipped once
# Streamlit's static files (``/static/…``: JavaScript, CSS, fonts), gzipped once per server rather than once per
# request.
# Why: compressing on every request (Starlette's ``GZipMiddleware``, level 9) costs ~1 CPU s for Plotly's 4.7 MB
# chunk alone, on the server's event loop — the same loop that sends the page's script output, so each fresh
# browser waited for it before the first element of the page arrived. The files' names carry their content's hash,
# so one compression serves every later request; the Plotly chunk, which every page fetches, is compressed in a
# thread when the server starts (``warm``). Level 6: within 0.3% of level 9's size for a third less time.

#: Where Streamlit's files lie on disk: ``/static/js/x.js`` is ``STATIC_ROOT / "static/js/x.js"``.
STATIC_ROOT = Path(st.__file__).resolve().parent / "static"
GZIP_LEVEL = 6
#: Below this many bytes a file goes as it is (the gzip header would eat the gain).
MINIMUM_SIZE = 1024
#: Content types worth compressing (fonts in woff2 are compressed already).
COMPRESSIBLE = (b"text/", b"application/javascript", b"application/json", b"image/svg+xml",
                b"application/wasm")


#: ``/static/`` path → its gzipped bytes, for this server's life (the names carry their content's hash).
GZIPPED: dict[str, bytes] = {}
_LOCK = threading.Lock()


def put(path: str, raw: bytes) -> bytes:
    """``raw`` compressed, kept for ``path`` (compressed once, whoever asks first)."""
    with _LOCK:
        if path in GZIPPED:
            return GZIPPED[path]
    packed = gzip.compress(raw, compresslevel=GZIP_LEVEL, mtime=0)
    with _LOCK:
        return GZIPPED.setdefault(path, packed)


def page_assets() -> list[str]:
    """The ``/static/`` files Streamlit's page names in its ``<head>`` (its entry script, CSS, preloads)."""
    index = STATIC_ROOT / "index.html"
    text = index.read_text(errors="replace") if index.is_file() else ""
    return sorted(set(re.findall(r'(?:src|href)="\.?(/static/[^"]+)"', text)))


def warm(paths: Iterable[str]) -> threading.Thread:
    """Compress these ``/static/`` files from disk in a daemon thread (the server starts serving meanwhile)."""
    def run() -> None:
        for path in paths:
            f = STATIC_ROOT / path.lstrip("/")
            if f.is_file():
                put(path, f.read_bytes())
    t = threading.Thread(target=run, name="static-gzip-warm", daemon=True)
    t.start()
    return t


class StaticGzip:
    """ASGI middleware: a ``/static/`` file asked for with ``Accept-Encoding: gzip`` is taken from the app
    uncompressed and sent gzipped from ``GZIPPED`` (compressed in a thread the first time); every other request
    passes untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "GET" or not scope["path"].startswith("/static/") \
                or not any(k.lower() == b"accept-encoding" and b"gzip" in v.lower() for k, v in scope["headers"]):
            await self.app(scope, receive, send)
            return
        plain = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]}
        start: dict[str, Any] = {}
        body: list[bytes] = []

        async def collect(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                body.append(message.get("body", b""))

        await self.app(plain, receive, collect)
        headers = [(k, v) for k, v in start.get("headers") or []]
        raw = b"".join(body)
        kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        if start.get("status") != 200 or len(raw) < MINIMUM_SIZE or not kind.startswith(COMPRESSIBLE):
            await send(start)
            await send({"type": "http.response.body", "body": raw})
            return
        path = scope["path"]
        packed = GZIPPED.get(path) or await asyncio.to_thread(put, path, raw)
        kept = [(k, v) for k, v in headers if k.lower() not in (b"content-length", b"content-encoding", b"vary")]
        await send({**start, "headers": [*kept, (b"content-encoding", b"gzip"), (b"vary", b"Accept-Encoding"),
                                          (b"content-length", str(len(packed)).encode())]})
        await send({"type": "http.response.body", "body": packed})


def _page(path: str) -> bool:
    """A path Streamlit answers with its HTML page: ``/``, a page (``/study``), no file, no ``_stcore`` route."""
    last = path.rstrip("/").rsplit("/", 1)[-1]
    return "." not in last and "/_stcore/" not in f"{path}/" and not path.startswith(("/media/", "/static/"))


class BaseUrlAtRoot:
    """ASGI middleware: into every HTML page served (Streamlit's ``index.html``), ``head_tags`` right after
    ``<head>`` (asked for uncompressed; the gzip around it compresses the result); everything else passes
    untouched."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _page(scope["path"]):  # a page is sent plain, to be patched (a few kilobytes)
            scope = {**scope, "headers": [(k, v) for k, v in scope["headers"] if k.lower() != b"accept-encoding"]}
        start: dict[str, Any] | None = None
        body: list[bytes] = []

        async def patched(message: dict[str, Any]) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers") or [])
                if message.get("status") == 200 and headers.get(b"content-type", b"").startswith(b"text/html") \
                        and b"content-encoding" not in headers:
                    start = message  # held until the whole page is here
                    return
                await send(message)
            elif message["type"] == "http.response.body" and start is not None:
                body.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                page = b"".join(body).replace(b"<head>", b"<head>" + HEAD, 1)
                headers = [(k, v) for k, v in start.get("headers") or [] if k.lower() != b"content-length"]
                await send({**start, "headers": [*headers, (b"content-length", str(len(page)).encode())]})
                await send({"type": "http.response.body", "body": page})
            else:
                await send(message)

        await self.app(scope, receive, patched)


HEAD = head_tags()
# Streamlit's own static serving sends its files as they are on disk. Outermost, its JavaScript and CSS (7-8 MB,
# Plotly's chunk the most) go gzipped from a cache (``StaticGzip``: compressed once, the page's own files and
# Plotly's chunk while the server starts); then the patched page and the rest, gzipped per request
warm([*(c for c in (plotly_chunk(),) if c), *page_assets()])
app = st.App(Path(__file__).resolve().parent / "app.py",
             middleware=[Middleware(StaticGzip),
                         Middleware(GZipMiddleware, minimum_size=1024, compresslevel=6), Middleware(BaseUrlAtRoot)])
