"""The load generator: ``vllm bench serve`` per load level — its arguments, its dataset, the run itself.

One run of ``vllm bench serve --save-result --save-detailed`` per concurrency of the ``Workload``, all
against the same deployment's entry URL (the router). Its JSON holds the aggregate numbers (throughput,
``p{50,90,99}_{ttft,tpot,itl,e2el}_ms``) and, with ``--save-detailed``, one record per request; reading it
into a ``Measurement`` is ``executors.measuring.bench_result`` (re-exported here: ``bench.parse_result``,
``bench.percentile``, ``bench.pool_results``).

Datasets: ``random`` and ``prefix`` (``--random-prefix-len``: one shared prefix of ``prefix_reuse × ISL``
tokens) are vLLM's own; ``agentic`` and ``trace`` are JSONL files from ``executors.measuring.datasets`` sent through
vLLM's ``custom`` dataset.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from executors.measuring.bench_result import (
    BOOTSTRAP_SAMPLES,
    BOOTSTRAP_SEED,
    COALESCED_WARN,
    DETAILED_KEYS,
    SATURATION,
    coalesced_share,
    concurrency_profile,
    first_wave,
    intervals,
    latency_summary,
    load_result,
    parse_result,
    per_request_tpot_ms,
    percentile,
    pool_results,
    request_latencies,
    summarize_raw,
    without_first_wave,
)
from executors.measuring.bench_zygote import Zygote, ZygoteGone
from executors.measuring.datasets import custom_dataset
from executors.processes import broken_env, procs
from executors.vllm.platform import Platform
from search_spaces import LATENCIES, PERCENTILES, Dataset, Workload


class BenchFailed(RuntimeError):
    """The load generator gave no result: ``reason`` is one line (its error line, else how it ended and its last
    lines), ``tail`` its log. ``environment``: it failed for its environment — its module does not import, the
    bench zygote died, this tuner's code folder is gone (``executors.processes.broken_env``) —, which says nothing about
    the deployment it measured."""

    def __init__(self, reason: str, tail: str = "", environment: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.tail = tail
        self.environment = environment


def _environment_failed(reason: str, tail: str) -> BenchFailed:
    """A failure of the client's environment, with the code folder's absence said when that is the cause."""
    gone = broken_env.code_gone()
    return BenchFailed(f"{reason} ({gone})" if gone else reason, tail, environment=True)


# ---------------------------------------------------------------------------------------------- arguments
#: A steady level sends at this many times the rate its estimated request lifetime sustains at c: its first c
#: requests go out over 1 / 1.25 of a lifetime, and every later one is ready before a slot frees, so it waits for
#: the slot (``--max-concurrency``) and the level stays a closed loop at c even where the estimate is 25% long.
STEADY_HEADROOM = 1.25
#: ``--burstiness`` of a steady level: gaps between sends drawn from a gamma of this shape (1 is Poisson; 100 puts
#: them within about ±10% of even), so that the first c requests do not bunch by chance.
STEADY_BURSTINESS = 100


def steady_rate(concurrency: int, lifetimes: Sequence[tuple[float, float]]) -> float | None:
    """The sending rate (req/s) of a steady level at ``concurrency``: ``STEADY_HEADROOM × c / L``, where L
    estimates a request's lifetime at c from ``lifetimes``, the (concurrency, mean E2E latency in s) of runs on
    the deployment before it (its warm-up, its levels). L is a lower bound, so that the rate is rather high than
    low (a rate below what c sustains would leave the level open-loop, under c): the nearest run at or below c
    bounds it by its own lifetime (latency does not fall as load grows), the nearest run above c by its lifetime
    × c / its concurrency (Little's law, throughput not falling as load grows); the larger of the two. None —
    the level starts in a burst — below c = 2 or with no run to estimate from."""
    runs = [(c, life) for c, life in lifetimes if c >= 1 and life > 0 and math.isfinite(life)]
    if concurrency < 2 or not runs:
        return None
    below = max((r for r in runs if r[0] <= concurrency), default=None, key=lambda r: r[0])
    above = min((r for r in runs if r[0] > concurrency), default=None, key=lambda r: r[0])
    bounds = [below[1]] if below else []
    if above:
        bounds.append(above[1] * concurrency / above[0])
    return STEADY_HEADROOM * concurrency / max(bounds)


def mean_lifetime_s(result: Mapping[str, Any]) -> float | None:
    """A run's mean request lifetime in seconds (its JSON's ``mean_e2el_ms``), None when it has none."""
    ms = result.get("mean_e2el_ms")
    return ms / 1000.0 if isinstance(ms, (int, float)) and ms > 0 and math.isfinite(ms) else None


@dataclass(frozen=True)
class LevelSpec:
    """One ``vllm bench serve`` run: its load, how many requests, the dataset seed, and its files' stem.
    ``pace_rps``: a steady concurrency level's sending rate (``steady_rate``); None: its first c start at once."""

    concurrency: int
    num_prompts: int
    seed: int
    name: str
    request_rate: float | None = None
    pace_rps: float | None = None

    @classmethod
    def for_load(cls, workload: Workload, load: float, *, attempt: int = 0, warmup: bool = False,
                 requests_per_s: float | None = None, short: bool = False,
                 lifetimes: Sequence[tuple[float, float]] = ()) -> LevelSpec:
        """The run for ``load`` (a concurrency, or req/s with ``load_by: rate``): attempt 1 is a close call's
        second measurement, ``warmup`` the discarded run before a deployment's first level, ``short`` a level
        that only brackets the knee (``Workload.bracket_prompts_per_concurrency``). ``lifetimes``: the runs
        before it, which pace a steady level (``Workload.level_start``, ``steady_rate``)."""
        rate = float(load) if workload.load_by == "rate" else None
        conc = workload.max_load_concurrency if rate is not None else int(load)
        n = workload.num_warmups(load) if warmup else workload.num_prompts(load, requests_per_s, short)
        stem = f"r{load:g}" if rate is not None else f"c{int(load)}"
        name = (f"warmup-{stem}" if warmup
                else stem + ("-short" if short else "") + (f"-{attempt + 1}" if attempt else ""))
        pace = steady_rate(conc, lifetimes) if rate is None and workload.level_start == "steady" else None
        return cls(conc, n, workload.level_seed(load, attempt, warmup, short), name, rate, pace)


def bench_args(
    workload: Workload,
    spec: LevelSpec,
    *,
    base_url: str,
    model: str,
    tokenizer: str,
    result_dir: str,
    result_filename: str,
    dataset_path: str | None = None,
) -> list[str]:
    """Arguments after ``bench serve`` for one run (flags checked against vLLM 0.32's own help).

    No ``--num-warmups``: vLLM's warm-up requests repeat the first prompt, which the prefix cache then
    serves (and the level's ``/metrics`` delta counts); the measure loop runs its own warm-up instead."""
    args = [
        "--backend", "vllm",
        "--base-url", base_url,
        "--model", model,
        "--tokenizer", tokenizer,
        "--num-prompts", str(spec.num_prompts),
        "--max-concurrency", str(spec.concurrency),
        "--ignore-eos",
        "--percentile-metrics", ",".join(LATENCIES),
        "--metric-percentiles", ",".join(map(str, PERCENTILES)),
        "--save-result", "--save-detailed",
        "--result-dir", result_dir,
        "--result-filename", result_filename,
        "--seed", str(spec.seed),
        "--disable-tqdm",
    ]
    if spec.request_rate is not None:
        args += ["--request-rate", f"{spec.request_rate:g}"]
    elif spec.pace_rps is not None:  # a steady level: paced sends, still at most c in flight
        args += ["--request-rate", f"{spec.pace_rps:.4g}", "--burstiness", str(STEADY_BURSTINESS)]
    if workload.dataset in (Dataset.RANDOM, Dataset.PREFIX):
        isl = workload.isl.mean
        prefix = int(round(workload.prefix_reuse * isl)) if workload.dataset is Dataset.PREFIX else 0
        ri, ro = workload.isl.range_ratio, workload.osl.range_ratio
        ratio = f"{ri:g}" if ri == ro else json.dumps({"input": ri, "output": ro})
        args += ["--dataset-name", "random",
                 "--random-input-len", str(max(1, isl - prefix)),
                 "--random-output-len", str(workload.osl.mean),
                 "--random-range-ratio", ratio]
        if prefix:
            args += ["--random-prefix-len", str(prefix)]
    else:
        if not dataset_path:
            raise ValueError(f"the {workload.dataset.value} workload needs a dataset file")
        args += ["--dataset-name", "custom", "--dataset-path", dataset_path,
                 "--custom-output-len", "-1", "--skip-chat-template", "--disable-shuffle"]
    return args


def prepare_dataset(workload: Workload, spec: LevelSpec, tokenizer: str, out_dir: str | Path) -> str | None:
    """The JSONL a custom-dataset workload needs for this run (None for vLLM's own generators)."""
    if workload.dataset in (Dataset.RANDOM, Dataset.PREFIX):
        return None
    return str(custom_dataset(workload, spec.concurrency, tokenizer, out_dir))


# ---------------------------------------------------------------------------------------------- running
@dataclass
class BenchRun:
    """One ``vllm bench serve`` process's outcome."""

    result: dict[str, Any]
    wall_s: float
    log_path: str
    argv: list[str]


def run_bench(
    platform: Platform,
    args: Sequence[str],
    *,
    result_path: str | Path,
    log_path: str | Path,
    timeout_s: float,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    term_timeout_s: float = 10.0,
    on_start: Any = None,
    zygote: Zygote | None = None,
) -> BenchRun:
    """Run ``vllm bench serve ARGS`` as its own process group; the saved JSON, loaded.

    Raises ``BenchFailed`` (with vLLM's error line) when it exits non-zero, writes no result, or runs past
    ``timeout_s`` (then its group is stopped). ``on_start(pgid)`` is told the group id at once. With a
    ``zygote`` (``executors.measuring.bench_zygote``) the level is forked from an already imported vLLM instead — only
    where ``bench_zygote.usable`` says the client does not distort the measurement (GPU platforms): on the CPU
    build, levels forked from one imported vLLM read a c=1 median TTFT of 47-80 ms where a fresh command read
    8.8-12.9 ms, in deployments of one hour taking turns (``benchmarks/bench_client_bursts.py``).
    """
    argv = [*platform.engine_cmd, "bench", "serve", *args]
    full_env = {**platform.env, **(env or {})}
    t0 = time.monotonic()
    if zygote is not None:
        try:
            rc = zygote.run(args, log_path=log_path, env=full_env, cwd=cwd, timeout_s=timeout_s,
                            term_timeout_s=term_timeout_s, on_start=on_start)
        except TimeoutError:
            raise BenchFailed(f"vllm bench serve ran past {timeout_s:.0f} s", procs.read_tail(log_path, 60)) from None
        except ZygoteGone as e:
            raise _environment_failed(e.reason, e.tail) from None
    else:
        rc = _run_command(argv, log_path=log_path, env=full_env, cwd=cwd, timeout_s=timeout_s,
                          term_timeout_s=term_timeout_s, on_start=on_start)
    wall = time.monotonic() - t0
    rp = Path(result_path)
    if rc != 0 or not rp.is_file():
        text, tail = procs.read_tail(log_path, 400), procs.read_tail(log_path, 60)
        reason = procs.error_line(text) or procs.exit_reason("vllm bench serve", rc, text, " and wrote no result")
        if broken_env.code_gone() or broken_env.import_failure(text):
            raise _environment_failed(reason, tail)
        raise BenchFailed(reason, tail)
    try:
        result = json.loads(rp.read_text())
    except ValueError as e:
        raise BenchFailed(f"unreadable bench result {rp}: {e}", procs.read_tail(log_path, 60)) from None
    return BenchRun(result, wall, str(log_path), argv)


def _run_command(argv: list[str], *, log_path: str | Path, env: Mapping[str, str], cwd: str | Path | None,
                 timeout_s: float, term_timeout_s: float, on_start: Any) -> int:
    try:
        proc = procs.start(argv, name="bench", log_path=log_path, env=env, cwd=cwd)
    except OSError as e:  # the client's command or the level's folder is gone
        raise _environment_failed(f"vllm bench serve could not start: {e}", "") from None
    if on_start is not None:
        on_start(proc.pgid)
    try:
        return proc.popen.wait(timeout=timeout_s)
    except Exception as e:  # TimeoutExpired, or KeyboardInterrupt: never leave the client running
        procs.stop(proc, term_timeout_s)
        if isinstance(e, KeyboardInterrupt):
            raise
        raise BenchFailed(f"vllm bench serve ran past {timeout_s:.0f} s", proc.tail(60)) from None
    finally:
        if proc.alive:
            procs.stop(proc, term_timeout_s)


def run_level(platform: Platform, workload: Workload, spec: LevelSpec, *, url: str, model: str, tokenizer: str,
              out_dir: Path, timeout_s: float, on_start: Callable[[int], None] | None = None,
              zygote: Zygote | None = None) -> BenchRun:
    """One load level against ``url``: its dataset (if any), its arguments and its run, files in ``out_dir``
    (``SPEC.json``, ``SPEC.log``). The local executor and the Ray executor's agent both run levels here."""
    ds = prepare_dataset(workload, spec, tokenizer, out_dir)
    stem = free_stem(out_dir, spec.name)
    args = bench_args(workload, spec, base_url=url, model=model, tokenizer=tokenizer, result_dir=str(out_dir),
                      result_filename=f"{stem}.json", dataset_path=ds)
    return run_bench(platform, args, result_path=out_dir / f"{stem}.json", log_path=out_dir / f"{stem}.log",
                     timeout_s=timeout_s, cwd=out_dir, on_start=on_start, zygote=zygote)


def free_stem(out_dir: Path, name: str) -> str:
    """``name``, or ``name.2``, ``name.3`` … when a run of one deployment already wrote that file: a profile
    measures several probe families at the same concurrency on one deployment (its three prefill probes are all
    c = 1), and each run's JSON and log are the raw evidence of a stored level (with one name per
    concurrency a profile keeps only the last of its four c1.json)."""
    stem, n = name, 1
    while (out_dir / f"{stem}.json").exists():
        n += 1
        stem = f"{name}.{n}"
    return stem


#: What callers reach as ``MODULE.NAME``, the re-exported parts included.
__all__ = [
    "BOOTSTRAP_SAMPLES", "BOOTSTRAP_SEED", "COALESCED_WARN", "DETAILED_KEYS", "SATURATION", "STEADY_BURSTINESS",
    "STEADY_HEADROOM", "BenchFailed", "BenchRun", "LevelSpec", "bench_args", "coalesced_share", "concurrency_profile",
    "free_stem", "first_wave", "intervals", "latency_summary", "load_result", "mean_lifetime_s", "parse_result",
    "per_request_tpot_ms", "percentile", "pool_results", "prepare_dataset", "request_latencies", "run_bench",
    "run_level", "steady_rate", "summarize_raw", "without_first_wave",
]
