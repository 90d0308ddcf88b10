"""The dashboard's static files go gzipped from a cache, compressed once per server (``ui.server.StaticGzip``), and its
page fetches the Plotly chunk early, at low priority (``ui.server.head_tags``).

The middleware is driven as the server drives it: an ASGI request to an app that answers as Streamlit's static
route does (a file's bytes, its content type, a cache header); the page check reads Streamlit's own files.
"""

from __future__ import annotations

import asyncio
import gzip
from typing import Any

import pytest

from ui import server

BODY = b"function f(){return 1}\n" * 2000  # a compressible script well above MINIMUM_SIZE


class _Static:
    """An app answering like Streamlit's static route; counts the requests it saw and their headers."""

    def __init__(self, status: int = 200, body: bytes = BODY, kind: bytes = b"application/javascript") -> None:
        self.status, self.body, self.kind = status, body, kind
        self.seen: list[dict[bytes, bytes]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.seen.append(dict(scope["headers"]))
        await send({"type": "http.response.start", "status": self.status,
                    "headers": [(b"content-type", self.kind), (b"content-length", str(len(self.body)).encode()),
                                (b"cache-control", b"public, immutable")]})
        half = len(self.body) // 2  # sent in two parts, as a file response streams
        await send({"type": "http.response.body", "body": self.body[:half], "more_body": True})
        await send({"type": "http.response.body", "body": self.body[half:]})


def _get(app: Any, path: str, gzip_ok: bool = True) -> tuple[int, dict[bytes, bytes], bytes]:
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    headers = [(b"accept-encoding", b"gzip, deflate")] if gzip_ok else []
    asyncio.run(app({"type": "http", "method": "GET", "path": path, "headers": headers}, receive, send))
    start = sent[0]
    return start["status"], dict(start["headers"]), b"".join(m.get("body", b"") for m in sent[1:])


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "GZIPPED", {})


def test_a_static_file_is_compressed_once_and_served_from_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    inner = _Static()
    app = server.StaticGzip(inner)
    calls = []
    real_put = server.put
    monkeypatch.setattr(server, "put", lambda p, raw: calls.append(p) or real_put(p, raw))
    for _ in range(3):
        status, headers, body = _get(app, "/static/js/x.abc.js")
        assert status == 200 and headers[b"content-encoding"] == b"gzip" and gzip.decompress(body) == BODY
        assert int(headers[b"content-length"]) == len(body) < len(BODY) / 10
        assert headers[b"cache-control"] == b"public, immutable" and headers[b"vary"] == b"Accept-Encoding"
    assert calls == ["/static/js/x.abc.js"]  # compressed the first time only
    # the app itself was asked for the plain file (no second compression under it)
    assert all(b"accept-encoding" not in h for h in inner.seen)


def test_everything_else_passes_as_it_is() -> None:
    cases = [(_Static(), "/static/js/x.js", False),  # no gzip asked for
             (_Static(), "/study", True),  # not a static file: the per-request gzip handles it
             (_Static(status=304, body=b""), "/static/js/x.js", True),
             (_Static(body=b"tiny"), "/static/js/x.js", True),
             (_Static(kind=b"font/woff2"), "/static/media/f.woff2", True)]
    for inner, path, gz in cases:
        status, headers, body = _get(server.StaticGzip(inner), path, gz)
        assert b"content-encoding" not in headers and body == inner.body and status == inner.status, path
    assert not {"/static/js/x.js", "/static/media/f.woff2"} & set(server.GZIPPED)


def test_warm_compresses_the_page_s_own_files_from_disk() -> None:
    assets = server.page_assets()
    js = [a for a in assets if a.endswith(".js")]
    assert any("/index." in a for a in js), assets
    chunk = server.plotly_chunk()
    assert chunk is not None
    server.warm([chunk, js[0]]).join(timeout=120)
    assert {chunk, js[0]} <= set(server.GZIPPED)  # (importing ``ui.server`` warms the page's files too)
    assert gzip.decompress(server.GZIPPED[chunk]) == (server.STATIC_ROOT / chunk.lstrip("/")).read_bytes()


def test_the_page_fetches_plotly_s_chunk_early_without_compiling_it() -> None:
    head = server.head_tags().decode()
    path = server.plotly_chunk()
    assert path is not None and (server.STATIC_ROOT / path.lstrip("/")).is_file()
    assert f'<link rel="prefetch" href="{path}">' in head and "modulepreload" not in head
