"""How many candidates the simulated executor scores per second on one CPU core.

For every preset: enumerate its SearchSpace, keep random candidates that pass ``search_spaces.check``, then
time ``place`` + ``predict`` (every load level of the preset's workload) over them. Prints a table and
writes ``benchmarks/results/sim_speed.json``. Goal: ≥ 2,000 evaluations per second.

    python benchmarks/sim_speed.py [--n 2000] [--seed 0] [--presets gb300-rack-dsv3 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

from executors import place
from executors.perf import MODEL_VERSION, default_params, predict
from search_spaces import ClusterSpec, SearchSpace, Workload, check, load_preset, model_preset, preset_names

GOAL_PER_S = 2000.0
RESULTS = Path(__file__).parent / "results" / "sim_speed.json"


def pin_one_core() -> str:
    """Run on one core (the first this process may use), so the number is a per-core figure."""
    if hasattr(os, "sched_setaffinity"):
        core = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {core})
        return f"pinned to CPU {core}"
    return "not pinned (no sched_setaffinity here)"


def bench_preset(name: str, n: int, seed: int) -> dict[str, Any]:
    d = load_preset(name)
    overrides = {k: v for k, v in d["model"].items() if k != "preset"}
    model = model_preset(d["model"]["preset"]).model_copy(update=overrides)
    cluster = ClusterSpec(**d["cluster"])
    workload = Workload(**d["workload"])
    space = SearchSpace.model_validate(d["space"])
    params = default_params(cluster.gpu)
    rng = random.Random(seed)
    all_cfgs = [cfg for _, cfg in space.enumerate()]
    rng.shuffle(all_cfgs)
    valid, checked = [], 0
    t0 = time.perf_counter()
    for cfg in all_cfgs:
        checked += 1
        if not check(cfg, model, cluster, workload.max_model_len):
            valid.append(cfg)
            if len(valid) >= n:
                break
    check_s = time.perf_counter() - t0
    if not valid:
        raise SystemExit(f"{name}: no valid candidate in the space")
    cands = [valid[i % len(valid)] for i in range(n)]  # small spaces: cycle over what there is
    predict(place(cands[0], cluster), model, workload, params)  # warm the per-model caches
    t0 = time.perf_counter()
    for cfg in cands:
        predict(place(cfg, cluster), model, workload, params)
    elapsed = time.perf_counter() - t0
    return {
        "preset": name,
        "space_size": len(all_cfgs),
        "valid_share": len(valid) / checked,
        "distinct_candidates": len(valid),
        "evaluations": n,
        "load_levels": len(workload.load_levels),
        "seconds": elapsed,
        "evals_per_s": n / elapsed,
        "us_per_eval": 1e6 * elapsed / n,
        "check_us_per_candidate": 1e6 * check_s / checked,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=2000, help="evaluations per preset")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--presets", nargs="*", default=None)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    pinned = pin_one_core()
    rows = [bench_preset(p, args.n, args.seed) for p in (args.presets or preset_names())]
    total_n = sum(r["evaluations"] for r in rows)
    overall = total_n / sum(r["seconds"] for r in rows)
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"simulated executor speed ({MODEL_VERSION}, one core, place + predict)")
        for col in ("preset", "space", "valid", "levels", "evals/s", "µs/eval", "check µs"):
            table.add_column(col, justify="left" if col == "preset" else "right")
        for r in rows:
            table.add_row(r["preset"], f"{r['space_size']:,}", f"{r['valid_share']:.0%}", str(r["load_levels"]),
                          f"{r['evals_per_s']:,.0f}", f"{r['us_per_eval']:.0f}", f"{r['check_us_per_candidate']:.0f}")
        table.add_row("all", "", "", "", f"{overall:,.0f}", f"{1e6 / overall:.0f}", "", style="bold")
        Console().print(table)
    except ImportError:  # plain fallback
        for r in rows:
            print(f"{r['preset']:24} {r['evals_per_s']:10,.0f} evals/s {r['us_per_eval']:8.0f} µs/eval")
        print(f"{'all':24} {overall:10,.0f} evals/s")
    ok = min(r["evals_per_s"] for r in rows) >= GOAL_PER_S
    print(f"goal ≥ {GOAL_PER_S:,.0f}/s per preset: {'met' if ok else 'NOT met'} ({pinned})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "model_version": MODEL_VERSION,
        "goal_evals_per_s": GOAL_PER_S,
        "goal_met": ok,
        "overall_evals_per_s": overall,
        "presets": rows,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "processor": platform.processor() or platform.platform(),
        "cpu_pinning": pinned,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
