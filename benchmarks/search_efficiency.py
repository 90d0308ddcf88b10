"""Search efficiency: how many executed trials each sampler needs to come within 2% of the optimum.

Ground truth is the simulator: every valid candidate of a preset is evaluated once (the exhaustive
optimum of max throughput/GPU under the preset's SLOs). Then, per seed:

- ``grid``: a shuffled grid of the valid candidates; trials = position of the first one within 2%.
- ``random``: Optuna's RandomSampler over the same conditional space.
- ``tpe``: the tuner's default sampler (``advisor.study.make_sampler``).

Samplers run the tune loop's own steps (suggest → rules → evaluate → score → tell, invalid candidates
and repeats told but not counted as executed), on an in-memory study so thousands of trials stay cheap.
Usage: ``python benchmarks/search_efficiency.py [--presets a,b] [--seeds 5] [--max-trials 600]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import optuna

from advisor.job import SamplerKind, SamplerSpec, job_from_dict
from advisor.objectives import score, worst
from advisor.study import make_sampler
from executors import place
from executors.simulated import SimulatedExecutor, default_params
from search_spaces import check, preset_names

optuna.logging.set_verbosity(optuna.logging.ERROR)
RESULTS = Path(__file__).parent / "results"


def ground_truth(job):
    ex = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu))
    model, wl = job.model_profile(), job.workload
    table: dict[str, float] = {}
    feasible: dict[str, bool] = {}
    for _, cfg in job.space.enumerate():
        if check(cfg, model, job.cluster, wl.max_model_len):
            continue
        out = score(job, ex.evaluate(place(cfg, job.cluster), wl).measurements)
        table[cfg.key()] = out.values[0]
        feasible[cfg.key()] = out.feasible
    opt = max(v for k, v in table.items() if feasible[k])
    return table, feasible, opt


def run_sampler(job, kind: SamplerKind, seed: int, table, feasible, opt: float, max_trials: int) -> int | None:
    j = job.model_copy(update={"sampler": SamplerSpec(kind=kind, seed=seed)})
    study = optuna.create_study(directions=["maximize"], sampler=make_sampler(j))
    model, wl = job.model_profile(), job.workload
    executed: set[str] = set()
    for _ in range(max_trials * 50):
        trial = study.ask()
        cfg = job.space.suggest(trial)
        key = cfg.key()
        if check(cfg, model, job.cluster, wl.max_model_len):
            out = worst(job)
            trial.set_constraint("slo", out.violation)
            study.tell(trial, out.values)
            continue
        executed.add(key)
        ok = feasible[key]
        trial.set_constraint("slo", 0.0 if ok else 0.5)
        study.tell(trial, [table[key]])
        if ok and table[key] >= 0.98 * opt:
            return len(executed)
        if len(executed) >= max_trials:
            return None
    return None


def run_grid(table, feasible, opt: float, seed: int) -> int:
    keys = sorted(table)
    random.Random(seed).shuffle(keys)
    for i, k in enumerate(keys, 1):
        if feasible[k] and table[k] >= 0.98 * opt:
            return i
    return len(keys)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--presets", default=",".join(n for n in preset_names() if n != "cpu-tiny-moe"))
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--max-trials", type=int, default=600)
    a = ap.parse_args()
    rows = []
    for name in a.presets.split(","):
        job = job_from_dict({"name": f"bench-{name}", "preset": name, "objective": {"mode": "max_under_slo"}})
        t0 = time.time()
        table, feasible, opt = ground_truth(job)
        within = sum(1 for k, v in table.items() if feasible[k] and v >= 0.98 * opt)
        res: dict[str, list] = {"grid": [], "random": [], "tpe": []}
        for seed in range(a.seeds):
            res["grid"].append(run_grid(table, feasible, opt, seed))
            res["random"].append(run_sampler(job, SamplerKind.RANDOM, seed, table, feasible, opt, a.max_trials))
            res["tpe"].append(run_sampler(job, SamplerKind.TPE, seed, table, feasible, opt, a.max_trials))
        med = {k: statistics.median([x if x is not None else float("inf") for x in v]) for k, v in res.items()}
        rows.append({
            "preset": name, "valid_candidates": len(table), "within_2pct": within, "optimum": opt,
            "median_trials": med, "runs": res, "tpe_vs_grid": med["tpe"] / med["grid"],
            "seconds": round(time.time() - t0, 1),
        })
        r = rows[-1]
        print(f"{name:18} valid {len(table):>7}  within2% {within:>5}  grid {med['grid']:>8}  "
              f"random {med['random']:>8}  tpe {med['tpe']:>8}  tpe/grid {r['tpe_vs_grid']:.3f}  ({r['seconds']} s)",
              flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "search_efficiency.json"
    out.write_text(json.dumps({"seeds": a.seeds, "max_trials": a.max_trials, "presets": rows}, indent=2,
                              default=lambda x: None if x == float("inf") else x))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
