"""How much does a knee move when the same deployment is searched again with fresh prompts, and what does a knee cost?
Levels that start in a burst (``workload.level_start: burst``) against steady levels (``steady``), on a real CPU-vLLM
deployment of the tiny dummy-weight MoE, measured the way the local executor measures a trial.

One deployment (aggregated, ``--max-seqs`` sequences a step) stays up for the whole run. A probe measures it at
c = 1 and c = ``--max-load`` first, and the SLO bound is the geometric mean of the two P90s of ``--metric`` (E2E
latency by default: on this 2-core machine some deployments deliver a response's tokens in one lump, and TTFT then
reads the delivery — docs/measurement.md, "Bursty delivery"), so the knee lies inside the grid on any machine. Then
each setting searches the knee ``--repeats`` times, the settings taking turns (a drift of the machine's speed hits
each alike), every search with its own workload seed (fresh prompts), its own warm-up, no model curve, the same start.
Per setting: the knees, their spread (max / min − 1) and the throughput at each, and the cost per knee (wall seconds
of the whole search with its warm-up, prompts sent). Prints a table and writes
``benchmarks/results/knee_noise.json``.

    python benchmarks/knee_noise.py [--repeats 3] [--settings burst-2c,steady-4c]
    python benchmarks/knee_noise.py --model DIR --gpu H100 --metric p90_ttft_ms ...   (one GPU, dummy weights)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from advisor.executor_factory import make_executor
from advisor.job import job_from_dict
from executors import place
from executors.measuring.loop import MeasurePlan, knee_of
from search_spaces import SLO, DeploymentConfig, Workload

RESULTS = Path(__file__).parent / "results" / "knee_noise.json"
BASE_WORKLOAD: dict[str, Any] = {
    "dataset": "random", "isl": {"mean": 256, "range_ratio": 0.2}, "osl": {"mean": 32, "range_ratio": 0.2},
    "load_levels": [], "knee_search": True, "max_levels": 6, "knee_tolerance": 0.15, "min_prompts": 8,
    "warmups_per_concurrency": 1, "bracket_prompts_per_concurrency": 0,
}
#: name → what it sets on the base workload
SETTINGS: dict[str, dict[str, Any]] = {
    "burst-2c": {"level_start": "burst", "prompts_per_concurrency": 2},
    "steady-2c": {"level_start": "steady", "prompts_per_concurrency": 2},
    "steady-4c": {"level_start": "steady", "prompts_per_concurrency": 4},
    "burst-10c": {"level_start": "burst", "prompts_per_concurrency": 10},
}


def job(run_dir: Path, max_load: int, model: str | None = None, gpu: str = "H100") -> Any:
    """The CPU build's tiny MoE; or, with ``model`` (a folder of config and tokenizer), that model with dummy
    weights on one GPU of kind ``gpu``, vLLM launched as ``$ENGINE_CMD`` and the router as ``$ROUTER_CMD``
    where they are set (``.gpu/s/run.sh env`` on the lent machine)."""
    if model is None:
        return job_from_dict({
            "name": "knee-noise", "preset": "cpu-tiny-moe",
            "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1},
            "workload": {**BASE_WORKLOAD, "max_load": max_load},
            "executor": {"kind": "local", "run_dir": str(run_dir), "timeouts": {"health_s": 240}},
        })
    cmds = {k: os.environ[v].split() for k, v in (("engine_cmd", "ENGINE_CMD"), ("router_cmd", "ROUTER_CMD"))
            if os.environ.get(v)}
    return job_from_dict({
        "name": "knee-noise", "model": {"path": str(Path(model).resolve())},
        "cluster": {"gpu": gpu, "nodes": 1, "gpus_per_node": 1},
        "workload": {**BASE_WORKLOAD, "max_load": max_load},
        "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 60000}],  # the job's; each search gets its own
        "executor": {"kind": "local", "platform": "gpu", "profile": "off", "run_dir": str(run_dir), **cmds,
                     "extra_serve_args": ["--load-format", "dummy"], "env": {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                     "timeouts": {"health_s": 600, "benchmark_s": 300}},
    })


def sent(bench_dir: Path, seen: set[Path]) -> tuple[int, int]:
    """Runs and prompts of the bench JSONs written since ``seen`` (added to it): warm-ups and second runs too."""
    runs = prompts = 0
    for f in sorted(bench_dir.glob("*.json")):
        if f in seen:
            continue
        seen.add(f)
        d = json.loads(f.read_text())
        runs += 1
        prompts += int(d.get("num_prompts") or (d.get("completed", 0) + d.get("failed", 0)))
    return runs, prompts


def spread(values: list[float]) -> float | None:
    vals = [v for v in values if v]
    return max(vals) / min(vals) - 1.0 if len(vals) >= 2 else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settings", default="burst-2c,steady-4c", help=f"comma-separated, of {', '.join(SETTINGS)}")
    ap.add_argument("--max-seqs", type=int, default=8, help="the deployment's max-num-seqs")
    ap.add_argument("--max-load", type=int, default=16, help="the probe's high level and the search's ceiling")
    ap.add_argument("--start", type=float, default=4, help="where every search starts")
    ap.add_argument("--metric", default="p90_e2el_ms", help="the SLO's metric (a latency, bound ≤)")
    ap.add_argument("--bound", type=float, default=None, help="the SLO's bound (default: from the probe)")
    ap.add_argument("--isl", type=int, default=256, help="mean prompt tokens (±20%%)")
    ap.add_argument("--osl", type=int, default=32, help="mean output tokens (±20%%)")
    ap.add_argument("--batched-tokens", type=int, default=4096, help="the deployment's max-num-batched-tokens")
    ap.add_argument("--model", default=None, help="a model folder (config + tokenizer) to serve on one GPU with "
                    "dummy weights; default: the CPU build's tiny MoE")
    ap.add_argument("--gpu", default="H100", help="with --model: the GPU kind")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    BASE_WORKLOAD["isl"] = {"mean": args.isl, "range_ratio": 0.2}
    BASE_WORKLOAD["osl"] = {"mean": args.osl, "range_ratio": 0.2}
    names = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown or args.repeats < 1 or args.max_load < 2:
        print(f"knee_noise: bad arguments (settings {unknown or names}, repeats {args.repeats}, max-load "
              f"{args.max_load}); settings are {', '.join(SETTINGS)}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` tears the deployment down like Ctrl-C
    cfg = DeploymentConfig.model_validate({"mode": "aggregated", "decode": {
        "role": "mixed", "max_num_seqs": args.max_seqs, "max_num_batched_tokens": args.batched_tokens}})
    t_all = time.monotonic()
    knees: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="knee-noise-") as tmp:
        j = job(Path(tmp) / "runs", args.max_load, args.model, args.gpu)
        ex = make_executor(j)
        dep = None
        try:
            t0 = time.monotonic()
            dep = ex.deploy(place(cfg, j.cluster))
            deploy_s = time.monotonic() - t0
            bench_dir = dep.handle.dir / "bench"
            seen: set[Path] = set()
            probe_wl = Workload.model_validate({**BASE_WORKLOAD, "knee_search": False, "prompts_per_concurrency": 4,
                                                "load_levels": [1, args.max_load], "max_load": args.max_load})
            probe = {m.concurrency: getattr(m, args.metric) for m in ex.measure(dep, probe_wl)}
            sent(bench_dir, seen)
            bound = args.bound or round(math.sqrt(probe[1] * probe[args.max_load]), 1)
            slos = (SLO(metric=args.metric, op="<=", value=bound), SLO(metric="error_rate", op="<=", value=0.01))
            print(f"deployed in {deploy_s:.0f} s; probe {args.metric}: c=1 {probe[1]:.1f}, c={args.max_load} "
                  f"{probe[args.max_load]:.1f}; SLO {slos[0]}", flush=True)
            plan = MeasurePlan(slos=slos, start=args.start)
            meta = {"command": " ".join(["python", *sys.argv]), "max_num_seqs": args.max_seqs,
                    "max_load": args.max_load, "start": args.start, "slo": str(slos[0]), "probe": probe,
                    "base_workload": BASE_WORKLOAD, "deploy_s": round(deploy_s, 1), "t0": t_all,
                    "model": args.model or "tiny-moe (CPU build)", "gpu": args.gpu if args.model else "CPU"}
            for rep in range(args.repeats):
                for name in names:
                    wl = Workload.model_validate({**BASE_WORKLOAD, **SETTINGS[name], "max_load": args.max_load,
                                                  "seed": 1000 * (rep + 1) + names.index(name)})
                    t0 = time.monotonic()
                    levels = ex.measure(dep, wl, plan)
                    wall = time.monotonic() - t0
                    runs, prompts = sent(bench_dir, seen)
                    k = knee_of(levels)
                    row = {"setting": name, "repeat": rep, "seed": wl.seed, "knee": k.concurrency if k else None,
                           "knee_throughput_per_gpu": round(k.throughput_per_gpu, 1) if k and k.throughput_per_gpu
                           else None, "wall_s": round(wall, 1), "runs": runs, "prompts": prompts,
                           "levels": [{"c": m.concurrency, "n": m.num_requests, args.metric: round(getattr(
                               m, args.metric) or 0, 1), "met": m.completed > 0 and all(s.met(m) for s in slos),
                               "pace_rps": m.raw.get("pace_rps"), "flags": m.flags} for m in levels]}
                    knees.append(row)
                    path = " ".join(f"{lv['c']}{'+' if lv['met'] else '-'}" for lv in row["levels"])
                    print(f"{name:<10} repeat {rep}: knee {row['knee']}  {row['knee_throughput_per_gpu']} tok/s  "
                          f"{wall:5.0f} s  {prompts:4d} prompts  levels {path}", flush=True)
                    summarize(names, knees, meta, args.out)
        finally:
            if dep is not None:
                ex.teardown(dep)
            ex.close()
    out = summarize(names, knees, meta, args.out, show=True)
    print(f"wrote {args.out} ({out['total_s']:.0f} s in all)")
    return 0


def summarize(names: list[str], knees: list[dict[str, Any]], meta: dict[str, Any], path: Path,
              show: bool = False) -> dict[str, Any]:
    """The per-setting summary of the knees so far, written to ``path`` (after every knee: a run cut short keeps
    what it measured); ``show`` prints it as a table."""
    summary = []
    if show:
        print(f"\n{'setting':<10} {'knees':<12} {'spread':>7} {'tok/s at each knee':<24} {'spread':>7} "
              f"{'s/knee':>7} {'prompts/knee':>13}")
    for name in names:
        rs = [r for r in knees if r["setting"] == name]
        if not rs:
            continue
        ks, tps = [r["knee"] for r in rs], [r["knee_throughput_per_gpu"] for r in rs]
        s = {"setting": name, **SETTINGS[name], "knees": ks, "knee_spread": spread([float(k or 0) for k in ks]),
             "knee_throughput_per_gpu": tps, "throughput_spread": spread([float(t or 0) for t in tps]),
             "wall_s_per_knee": round(statistics.mean(r["wall_s"] for r in rs), 1),
             "prompts_per_knee": round(statistics.mean(r["prompts"] for r in rs), 1)}
        summary.append(s)
        if show:
            pct = lambda v: f"{v:.0%}" if v is not None else "-"  # noqa: E731
            print(f"{name:<10} {' '.join(str(k) for k in ks):<12} {pct(s['knee_spread']):>7} "
                  f"{' '.join(str(t) for t in tps):<24} {pct(s['throughput_spread']):>7} "
                  f"{s['wall_s_per_knee']:>7} {s['prompts_per_knee']:>13}")
    out = {**meta, "total_s": round(time.monotonic() - meta["t0"], 1),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_average_1_5_15_at_end": os.getloadavg()}, "summary": summary, "knees": knees}
    out.pop("t0")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    raise SystemExit(main())
