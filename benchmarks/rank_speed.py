"""What the guide's first ranking costs: the model's knee of every candidate it ranks, one by one (the scalar model,
``advisor.proposers.model_rank.predicted_outcome``) against all at once (the batch model, ``predicted_outcomes``).

For every preset the candidates are those the guide's first model turn ranks (every valid candidate, or on
GB300 its shape-stratified sample of 2,000), the parameters the preset's defaults. Each way is timed
``--repeats`` times, alternating, in CPU seconds of this process; the outcomes are checked equal (values and
violation of every candidate). Prints a table and writes ``benchmarks/results/rank_speed.json``.

    python benchmarks/rank_speed.py [--repeats 3] [--presets h200-dsv3 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from advisor.executor_factory import model_params
from advisor.proposers.guide import ModelGuide
from advisor.proposers.model_rank import predicted_outcome, predicted_outcomes
from advisor.job import job_from_dict
from executors.measuring.loop import MeasurePlan
from search_spaces import preset_names

RESULTS = Path(__file__).parent / "results" / "rank_speed.json"


def bench_preset(name: str, repeats: int) -> dict[str, Any]:
    job = job_from_dict({"name": name, "preset": name}, source=name)
    params = model_params(job)
    cfgs = [c for _, c in ModelGuide(job, params)._candidates()]
    plan = MeasurePlan(tuple(job.slos))
    one_s, many_s = [], []
    for _ in range(repeats):
        t = time.process_time()
        one = [predicted_outcome(job, c, params, plan) for c in cfgs]
        one_s.append(time.process_time() - t)
        t = time.process_time()
        many = predicted_outcomes(job, cfgs, params, plan)
        many_s.append(time.process_time() - t)
    same = all((a.values, a.violation) == (b.values, b.violation) for a, b in zip(one, many, strict=True))
    one_med, many_med = statistics.median(one_s), statistics.median(many_s)
    return {
        "preset": name, "candidates": len(cfgs), "same_outcomes": same,
        "one_by_one_cpu_s": [round(x, 3) for x in one_s], "batch_cpu_s": [round(x, 3) for x in many_s],
        "one_by_one_median_s": round(one_med, 3), "batch_median_s": round(many_med, 3),
        "speedup_median": round(one_med / many_med, 2),
        "batch_us_per_candidate": round(1e6 * many_med / max(1, len(cfgs)), 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--presets", nargs="*", default=[p for p in preset_names() if p != "cpu-tiny-moe"])
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows = []
    print(f"{'preset':<18} {'candidates':>10} {'one by one (CPU s)':>24} {'batch (CPU s)':>22} {'speed-up':>9} same")
    for name in args.presets:
        r = bench_preset(name, args.repeats)
        rows.append(r)
        print(f"{r['preset']:<18} {r['candidates']:>10,} {r['one_by_one_median_s']:>8.3f} "
              f"[{min(r['one_by_one_cpu_s']):.3f}–{max(r['one_by_one_cpu_s']):.3f}] {r['batch_median_s']:>8.3f} "
              f"[{min(r['batch_cpu_s']):.3f}–{max(r['batch_cpu_s']):.3f}] {r['speedup_median']:>8.2f}× "
              f"{'yes' if r['same_outcomes'] else 'NO'}", flush=True)
    out = {"command": " ".join(["python", *sys.argv]), "repeats": args.repeats,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_average_1_5_15_at_end": os.getloadavg()}, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(r["same_outcomes"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
