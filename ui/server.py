"""The dashboard's server: Streamlit's ASGI app (``st.App``) serving ``app.py``, which ``advisor dashboard`` runs
with ``streamlit run ui/server.py``.

Why not ``streamlit run ui/app.py``: on a deep link (``/study?study=…``) Streamlit's page cannot tell a page's
path from a base URL path, so it first asks ``/study/_stcore/health`` and ``/study/_stcore/host-config`` — two
404s per page load — before it finds the server at ``/``. The page reads its base URL from
``window.__streamlit.BACKEND_BASE_URL`` when that is set, so this app's one middleware sets it, in the HTML page
it serves, to the root of the address the page was loaded from: the server is always at ``/`` (``advisor
dashboard`` sets no base URL path), and a page then asks only there.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware

#: Set before Streamlit's own script runs; ``location.origin + "/"``: the server's root, as the page was reached.
BASE_URL_SCRIPT = b'<script>window.__streamlit={BACKEND_BASE_URL: window.location.origin + "/"};</script>'


def plotly_chunk() -> str | None:
    """The path of Streamlit's Plotly chunk (``/static/js/PlotlyChart.<hash>.js``, about 4.7 MB), which its page
    otherwise fetches only when the first chart's data arrives (None where this Streamlit has none)."""
    found = sorted((Path(st.__file__).resolve().parent / "static" / "static" / "js").glob("PlotlyChart.*.js"))
    return f"/static/js/{found[0].name}" if found else None


def head_tags() -> bytes:
    """What goes right after ``<head>``: the base URL, and a ``modulepreload`` of the Plotly chunk, so the browser
    fetches and compiles it while the script runs — every page of this dashboard draws a Plotly chart first."""
    chunk = plotly_chunk()
    preload = f'<link rel="modulepreload" href="{chunk}">'.encode() if chunk else b""
    return BASE_URL_SCRIPT + preload


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
# gzip outermost: the JavaScript and CSS (7-8 MB, Plotly's chunk the most) and the patched page go compressed
# to a browser that asks for it; Streamlit's own static serving sends them as they are on disk
app = st.App(Path(__file__).resolve().parent / "app.py",
             middleware=[Middleware(GZipMiddleware, minimum_size=1024), Middleware(BaseUrlAtRoot)])
