"""Which levels of a folder of ``vllm bench serve`` results stalled: the stall detector over recorded runs.

For every saved bench JSON under FOLDER (``**/bench/*.json``, with per-request ``start_times``/``ttfts``/``itls``:
``--save-detailed``) it prints the level's longest pause with no token delivered while requests were in flight,
its reference gap (the median of its N longest gaps, N its requests), its 99th-percentile gap, the pause over the
reference, and whether ``executors.measuring.bench_result.stall_of`` calls it stalled (pause ≥ max(``STALL_FLOOR_S``,
``STALL_FACTOR`` × reference)); the rows and the constants go to ``--out`` as JSON.

The default folder holds the H200 hardware profiles of 4 Dec (vLLM 0.26.0, one H200: the DeepSeek-V3-width FP8
stack, whose levels paused for just-in-time kernel compiles, and the Qwen3-235B-width one):

    python research/stall_check.py [FOLDER] [--out research/results/h200-profile-dsv3/stalls-r5.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executors.measuring.bench_result import STALL_FACTOR, STALL_FLOOR_S, stall_of  # noqa: E402

DEFAULT_FOLDER = Path("/tmp/r5/da-runs")
DEFAULT_OUT = ROOT / "research" / "results" / "h200-profile-dsv3" / "stalls-r5.json"


def levels(folder: Path) -> list[dict[str, Any]]:
    """One row per bench JSON with per-request timings under ``folder`` (sorted by path)."""
    rows = []
    for path in sorted(folder.glob("**/bench/*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or "itls" not in data:
            continue
        stall = stall_of(data)
        if stall is None:
            continue
        rows.append({"file": str(path.relative_to(folder)), "warmup": path.stem.startswith("warmup-"),
                     "concurrency": data.get("max_concurrency"), "requests": data.get("completed"),
                     "p50_ttft_ms": data.get("median_ttft_ms"), **stall,
                     "ratio": stall["longest_pause_s"] / max(stall["pause_reference_s"], 1e-12)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    rows = levels(args.folder)
    if not rows:
        raise SystemExit(f"no bench JSON with per-request timings under {args.folder}")
    print(f"stalled: longest pause >= max({STALL_FLOOR_S:g} s, {STALL_FACTOR:g} x reference gap)\n")
    print(f"{'file':<66} {'p50 TTFT ms':>11} {'pause s':>8} {'ref ms':>7} {'p99 ms':>7} {'ratio':>6}  stalled")
    for r in rows:
        print(f"{r['file']:<66} {r['p50_ttft_ms']:>11.0f} {r['longest_pause_s']:>8.3f} "
              f"{1000 * r['pause_reference_s']:>7.2f} {1000 * r['p99_gap_s']:>7.2f} {r['ratio']:>6.0f}  "
              f"{'yes' if r['stalled'] else 'no'}")
    def r3(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    summary = {}
    for kind, warm in (("levels", False), ("warm-ups", True)):
        st = [r for r in rows if r["warmup"] == warm and r["stalled"]]
        ok = [r for r in rows if r["warmup"] == warm and not r["stalled"]]
        summary[kind] = {"stalled": len(st), "clean": len(ok),
                         "stalled_pause_s": [r3(min((r["longest_pause_s"] for r in st), default=None)),
                                             r3(max((r["longest_pause_s"] for r in st), default=None))],
                         "clean_pause_s_max": r3(max((r["longest_pause_s"] for r in ok), default=None)),
                         "clean_ratio_max": r3(max((r["ratio"] for r in ok), default=None)),
                         "stalled_ratio_min": r3(min((r["ratio"] for r in st), default=None))}
        s = summary[kind]
        ratio = lambda x: "-" if x is None else f"{x:.0f}"  # noqa: E731 — a kind with no stalled (or clean) run
        print(f"\n{kind}: {s['stalled']} stalled (pause {s['stalled_pause_s'][0]} - {s['stalled_pause_s'][1]} s, "
              f"ratio >= {ratio(s['stalled_ratio_min'])}), {s['clean']} clean (pause <= {s['clean_pause_s_max']} s, "
              f"ratio <= {ratio(s['clean_ratio_max'])})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"folder": str(args.folder), "floor_s": STALL_FLOOR_S, "factor": STALL_FACTOR,
                                    "summary": summary, "levels": rows}, indent=2) + "\n")
    print(f"\nwrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")


if __name__ == "__main__":
    main()
