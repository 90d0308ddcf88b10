"""Search efficiency: how many executed trials each sampler needs to come within 2% of the optimum.

Ground truth is the simulator: every valid candidate of a preset is evaluated once (the exhaustive
optimum of max throughput/GPU under the preset's SLOs). Then, per seed:

- ``grid``: a shuffled grid of the valid candidates; trials = position of the first one within 2%.
- ``random``: Optuna's RandomSampler over the same conditional space.
- ``tpe``: multivariate grouped TPE alone (``sampler.guide: false``).
- ``guided``: the tuner's default — TPE with every other trial proposed by the performance model, re-fitted
  to the trials measured so far (``advisor.proposers.guide``).

``--truth exact``: the ground truth is the model the guide starts from (the default parameters), so the
guide knows the answer before it measures anything — what a study of the simulated executor sees, and no
test of the guide. ``--truth perturbed``: per seed, the ground truth is the same model with every non-zero
efficiency parameter multiplied by a seeded log-uniform factor in [1/S, S] (``--spread S``, default 2, kept
in the parameter's range) while the guide still starts from the defaults — a machine the model does not
know, as the uncalibrated model did not know the H200 (its median error there was 89%). A perturbation
moves parameters only: a real machine can also differ in the model's structure, which no perturbation
here reproduces.

Samplers run the tune loop's own steps (suggest → rules → evaluate → score → tell, invalid candidates
and repeats told but not counted as executed), on an in-memory study so thousands of trials stay cheap.
Usage: ``python benchmarks/search_efficiency.py [--presets a,b] [--seeds 5] [--max-trials 600]
[--truth exact|perturbed] [--spread 2] [--samplers grid,random,tpe,guided] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import optuna

from advisor.proposers.guide_turns import enqueue_turn, make_guide
from advisor.proposers.model_rank import exhaustive
from advisor.job import SamplerKind, SamplerSpec, job_from_dict
from advisor.objectives import worst
from advisor.study import make_sampler
from executors import place
from executors.perf import PerfParams
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import check, preset_names
from truths import perturbed  # benchmarks/truths.py (this folder is on the path)

optuna.logging.set_verbosity(optuna.logging.ERROR)
RESULTS = Path(__file__).parent / "results"


def ground_truth(job, params: PerfParams):
    outcomes = exhaustive(job, params)
    table = {k: o.values[0] for k, o in outcomes.items()}
    feasible = {k: o.feasible for k, o in outcomes.items()}
    ok = [v for k, v in table.items() if feasible[k]]
    return table, feasible, (max(ok) if ok else None), SimulatedExecutor(job.model_profile(), params)


def run_sampler(job, kind: SamplerKind, seed: int, table, feasible, opt: float, max_trials: int,
                truth: SimulatedExecutor, guide: bool = False) -> int | None:
    j = job.model_copy(update={"sampler": SamplerSpec(kind=kind, seed=seed, guide=guide)})
    study = optuna.create_study(directions=["maximize"], sampler=make_sampler(j))
    g = make_guide(j, default_params(job.cluster.gpu))  # the guide starts from the defaults, whatever the truth
    model, wl = job.model_profile(), job.workload
    executed: set[str] = set()
    for _ in range(max_trials * 50):
        enqueue_turn(g, study, len(executed), lambda: executed)
        trial = study.ask()
        cfg = job.space.suggest(trial)
        key = cfg.key()
        if check(cfg, model, job.cluster, wl.max_model_len):
            out = worst(job)
            trial.set_constraint("slo", out.violation)
            study.tell(trial, out.values)
            continue
        if g is not None and key not in executed:
            g.observe(cfg, truth.evaluate(place(cfg, job.cluster), wl).measurements)
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
    ap.add_argument("--truth", choices=["exact", "perturbed"], default="perturbed")
    ap.add_argument("--spread", type=float, default=2.0)
    ap.add_argument("--samplers", default="grid,random,tpe,guided")
    ap.add_argument("--scope", choices=["deployment", "cluster"], default="deployment",
                    help="objective.scope: throughput per GPU the deployment uses, or per GPU of the whole cluster "
                         "(copies that tile it; idle GPUs count as zero)")
    ap.add_argument("--out", type=Path, default=None, help="default: results/search_efficiency_<truth>.json")
    a = ap.parse_args()
    samplers = a.samplers.split(",")
    rows = []
    for name in a.presets.split(","):
        job = job_from_dict({"name": f"bench-{name}", "preset": name,
                             "objective": {"mode": "max_under_slo", "scope": a.scope}})
        base = default_params(job.cluster.gpu)
        t0 = time.time()
        res: dict[str, list] = {k: [] for k in samplers}
        sizes = []
        for seed in range(a.seeds):
            params = base if a.truth == "exact" else perturbed(base, seed, a.spread)
            table, feasible, opt, truth = ground_truth(job, params)
            if opt is None:  # this machine meets no SLO anywhere: nothing to find
                sizes.append({"seed": seed, "valid": len(table), "within_2pct": 0})
                continue
            within = sum(1 for k, v in table.items() if feasible[k] and v >= 0.98 * opt)
            sizes.append({"seed": seed, "valid": len(table), "within_2pct": within, "optimum": opt})
            for kind in samplers:
                if kind == "grid":
                    res[kind].append(run_grid(table, feasible, opt, seed))
                    continue
                sk = SamplerKind.RANDOM if kind == "random" else SamplerKind.TPE
                res[kind].append(run_sampler(job, sk, seed, table, feasible, opt, a.max_trials, truth,
                                             guide=kind == "guided"))
        med = {k: statistics.median([x if x is not None else float("inf") for x in v]) if v else None
               for k, v in res.items()}
        vs_grid = {k: med[k] / med["grid"] for k in samplers if k != "grid" and med.get("grid") and med[k] is not None}
        rows.append({
            "preset": name, "valid_candidates": sizes[0]["valid"],
            "within_2pct": statistics.median(s["within_2pct"] for s in sizes), "truths": sizes,
            "median_trials": med, "runs": res, "vs_grid": vs_grid, "seconds": round(time.time() - t0, 1),
        })
        r = rows[-1]
        print(f"{name:18} valid {r['valid_candidates']:>7}  within2% {r['within_2pct']:>5}  " +
              "  ".join(f"{k} {med[k]}" for k in samplers) + "  " +
              "  ".join(f"{k}/grid {v:.3f}" for k, v in vs_grid.items()) + f"  ({r['seconds']} s)", flush=True)
    out = a.out or RESULTS / f"search_efficiency_{a.truth}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"seeds": a.seeds, "max_trials": a.max_trials, "truth": a.truth, "scope": a.scope,
                               "spread": a.spread if a.truth == "perturbed" else None, "presets": rows}, indent=2,
                              default=lambda x: None if x == float("inf") else x))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
