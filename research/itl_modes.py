"""Where a level's TTFT goes, read from the requests' own token timings: decode steps and prefill-carrying steps.

On one GPU a request's inter-token gaps are the engine's step times as the client saw them. They are bimodal on the
H200 30B levels: short gaps are steps of decode only, long ones are steps that also carried prompts. From a
``vllm bench serve --save-detailed`` JSON (the second half of its requests, past the first wave) this prints the share
and median of each mode, the steps a second, and — from the request rate — how many prompts a prefill step carried
on average. It is the measurement issue 29's steady model is held to (one prompt's chunk per prefill step there).

    python research/itl_modes.py JSON [JSON ...] [--split-ms 40] [--out OUT.json]

Reads only the bench JSONs (no GPU); a gap is "long" at or above ``--split-ms``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any


def modes(result: dict[str, Any], split_ms: float = 40.0) -> dict[str, float]:
    """The level's gap modes over the second half of its requests (in the order they were sent)."""
    order = sorted(range(len(result["start_times"])), key=lambda i: result["start_times"][i])
    late = order[len(order) // 2:]
    gaps = [g * 1e3 for i in late for g in result["itls"][i]]
    short = [g for g in gaps if g < split_ms]
    long = [g for g in gaps if g >= split_ms]
    mean_step_s = statistics.fmean(gaps) / 1e3
    steps_per_s = 1.0 / mean_step_s
    prefill_steps_per_s = steps_per_s * len(long) / len(gaps)
    rate = float(result["request_throughput"])
    return {
        "concurrency": float(result["max_concurrency"]), "gaps": float(len(gaps)),
        "short_share": len(short) / len(gaps), "short_median_ms": statistics.median(short),
        "long_share": len(long) / len(gaps), "long_median_ms": statistics.median(long),
        "steps_per_s": steps_per_s, "prefill_steps_per_s": prefill_steps_per_s, "requests_per_s": rate,
        "prompts_per_prefill_step": rate / prefill_steps_per_s,
        "p50_ttft_ms": statistics.median(result["ttfts"][i] for i in late) * 1e3,  # past the first wave too
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--split-ms", type=float, default=40.0)
    ap.add_argument("--out")
    a = ap.parse_args()
    rows = {f: modes(json.loads(Path(f).read_text()), a.split_ms) for f in a.files}
    print(f"{'file':<40} {'c':>4} {'short':>6} {'med ms':>7} {'long':>6} {'med ms':>7} {'steps/s':>8} "
          f"{'pf steps/s':>10} {'req/s':>6} {'prompts/pf step':>15} {'P50 TTFT':>9}")
    for f, r in rows.items():
        print(f"{Path(f).name:<40} {r['concurrency']:>4.0f} {r['short_share']:>6.1%} {r['short_median_ms']:>7.1f} "
              f"{r['long_share']:>6.1%} {r['long_median_ms']:>7.1f} {r['steps_per_s']:>8.1f} "
              f"{r['prefill_steps_per_s']:>10.2f} {r['requests_per_s']:>6.2f} {r['prompts_per_prefill_step']:>15.2f} "
              f"{r['p50_ttft_ms']:>9.1f}")
    if a.out:
        Path(a.out).write_text(json.dumps({"split_ms": a.split_ms, "levels": rows}, indent=1) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
