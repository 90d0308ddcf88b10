"""Prefill probes that fill a step (``advisor.profile.prefill_loads``), measured on vLLM's CPU build: does a profile
that measured them predict levels it never saw better than one that measured single prompts only?

Issue 29's fourth open item. Until 5 Dec a profile's prefill probes sent one prompt at a time, so its fit never saw
a step of several prompts, nor the API server handing a wave of them over one by one; the as-sent fit of the ~30B
H200 profile bent its prefill terms to the decode probes' waves instead (``mfu_prefill`` 0.29, ``attn_eff_prefill``
0.20). The plan now adds, per prompt length whose prompts fit the token budget twice or more, a level of as many
prompts at once as fill one step — on GPUs; on the CPU build they gained nothing measurable here.

Each run (real vLLM CPU build, the project's tiny dummy-weight MoE, nothing mocked):

1. ``advisor.profile.run_profile`` at depths 1 and 2 with the step-filling levels (which the CPU plan now leaves out:
   this benchmark is why);
2. held-out levels on the full model (2 layers), measured after the profile: two deployments (vLLM's CPU default,
   128 sequences / 2,048 tokens; and 8 / 512, a budget that splits prompts across steps), each at a prefill-heavy
   workload (ISL 256 +-20%, OSL 8) and a mixed one (ISL 192 +-20%, OSL 24) at two concurrencies;
3. the probes fitted as ``advisor profile`` fits them (as sent): with every level; without the step-filling
   prefill levels (the plan before); without each step-filling family alone. Each fit, the stored profile and the
   CPU kind's defaults held to every held-out level as it was sent. Errors: median |predicted / measured - 1| over
   the values a fit compares (``advisor.calibrate.fitted_values``) and RMS log(predicted / measured), per level
   and pooled.

``--from FILE`` analyses an earlier output's runs again (step 3 only: its probe levels and held-out levels are
in the file).

What it does not show: a GPU. The CPU build has no CUDA graphs and its steps are mostly overhead; on 2 cores the
machine's speed drifts by tens of percent between minutes (tests/test_profile_real.py), so ``--runs`` repeats the
whole thing (a new profile each time) to show the spread.

    python research/prefill_probes.py [--runs 2 | --from FILE] [--out research/results/prefill_probes]

About 9 minutes a run on a 2-core machine (2 x 4 minutes of deploying and measuring, then the fits).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "research"))
sys.path.insert(0, str(ROOT / "research" / "gpu"))

import profile_check as pc  # noqa: E402
from level_views import write_results  # noqa: E402

import db  # noqa: E402
from advisor.calibrate import Errors, Problem, Sample, fitted_values  # noqa: E402
from advisor.executor_factory import make_executor  # noqa: E402
from advisor.job import TuningJob, load_job  # noqa: E402
from advisor.profile import fit_probes, run_profile  # noqa: E402
from executors import place  # noqa: E402
from executors.measuring.bench_result import first_wave_left_out  # noqa: E402
from executors.measuring.loop import MeasurePlan  # noqa: E402
from executors.perf import PerfParams, default_params  # noqa: E402
from search_spaces import ClusterSpec, DeploymentConfig, LengthDist, Mode, Role, RoleConfig, Workload  # noqa: E402

RESULTS = ROOT / "research" / "results"
#: One CPU slot: the profile's probes and the held-out deployments alike.
ONE_SLOT = ClusterSpec(gpu="CPU", nodes=1, gpus_per_node=1)
#: The held-out deployments: (max-num-seqs, max-num-batched-tokens).
DEPLOYMENTS = ((128, 2048), (8, 512))
#: The held-out workloads: name -> (ISL, OSL, concurrencies).
WORKLOADS = {"prefill-heavy": (256, 8, (4, 16)), "mixed": (192, 24, (3, 8))}
#: The prefill terms the step-filling levels should move (reported per fit).
PREFILL_TERMS = ("mfu_prefill", "attn_eff_prefill", "frontend_per_prompt_token_s", "request_latency_s",
                 "step_latency_s", "cpu_step_s")


def profile_job(work: Path) -> TuningJob:
    doc = {"name": "prefill-probes", "preset": "cpu-tiny-moe",
           "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1},
           "executor": {"kind": "local", "run_dir": str(work / "runs")}, "storage": f"sqlite:///{work / 'results.db'}"}
    (work / "profile.yaml").write_text(yaml.safe_dump(doc))
    return load_job(work / "profile.yaml")


def held_config(seqs: int, tokens: int) -> DeploymentConfig:
    role = RoleConfig(role=Role.MIXED, data_parallel_size=1, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    return DeploymentConfig(mode=Mode.AGGREGATED, decode=role)


def held_workload(name: str, c: int) -> Workload:
    isl, osl, _ = WORKLOADS[name]
    return Workload(isl=LengthDist(mean=isl, range_ratio=0.2), osl=LengthDist(mean=osl, range_ratio=0.2),
                    load_levels=[c], knee_search=False, prompts_per_concurrency=4.0, min_prompts=32,
                    warmups_per_concurrency=1.0, seed=1000 * c + isl)


def held_out(job: TuningJob) -> list[dict[str, Any]]:
    """Measure every held-out level (``DEPLOYMENTS`` x ``WORKLOADS``) on the full model; one deployment at a time."""
    out: list[dict[str, Any]] = []
    for seqs, tokens in DEPLOYMENTS:
        config = held_config(seqs, tokens)
        executor = make_executor(job.model_copy(update={"cluster": ONE_SLOT}))
        try:
            t0 = time.monotonic()
            dep = executor.deploy(place(config, ONE_SLOT))
            print(f"  deployed {seqs}/{tokens} in {time.monotonic() - t0:.0f} s", file=sys.stderr)
            try:
                for name, (_, _, loads) in WORKLOADS.items():
                    for c in loads:
                        for m in executor.measure(dep, held_workload(name, c), MeasurePlan()):
                            out.append({"deployment": f"{seqs}/{tokens}", "seqs": seqs, "tokens": tokens,
                                        "workload": name, "concurrency": c, "values": fitted_values(m),
                                        "completed": m.completed, "first_wave_out": first_wave_left_out(m),
                                        "flags": list(m.flags), "prefix_cache_hit_rate": m.prefix_cache_hit_rate})
                            print(f"  {seqs}/{tokens} {name} c={c}: {out[-1]['values']}", file=sys.stderr)
            finally:
                executor.teardown(dep)
        finally:
            executor.close()
    return out


def errors_of(job: TuningJob, levels: list[dict[str, Any]], params: PerfParams) -> dict[str, Any]:
    """Each held-out level's errors, as sent, and pooled (median over levels of the per-level median; RMS log over
    every value)."""
    per: list[dict[str, Any]] = []
    logs: list[float] = []
    for lv in levels:
        if not lv["values"]:
            continue
        c = lv["concurrency"]
        ljob = job.model_copy(update={"cluster": ONE_SLOT, "workload": held_workload(lv["workload"], c)})
        sample = Sample("held", 0, held_config(lv["seqs"], lv["tokens"]), ljob, {c: lv["values"]},
                        {c: lv["completed"]}, frozenset({c} if lv["first_wave_out"] else ()))
        ratios = Problem([sample], as_sent=True).log_ratios(params)  # one simulation of the level
        e = Errors.of(ratios, 1)
        logs.extend(r for _, r in ratios)
        per.append({"level": f"{lv['deployment']} {lv['workload']} c={c}", "median": e.overall, "rms_log": e.rms_log,
                    **{f"median_{k}": v for k, v in e.per_metric.items()}})
    meds = [p["median"] for p in per if p["median"] is not None]
    rms = (sum(x * x for x in logs) / len(logs)) ** 0.5 if logs else None
    return {"levels": per, "median_of_medians": statistics.median(meds) if meds else None, "rms_log": rms}


def measure(work: Path) -> dict[str, Any]:
    """One run's measurements: the profile (its probe levels and fitted parameters) and the held-out levels."""
    job = profile_job(work)
    database = db.connect(job.storage)
    try:
        t0 = time.monotonic()
        result = run_profile(job, database, depths=(1, 2), step_filling=True,  # the CPU plan leaves them out
                             on_level=lambda text: print(f"  profile: {text}", file=sys.stderr))
        profile_s = time.monotonic() - t0
        t0 = time.monotonic()
        levels = held_out(job)
        return {"profile_s": round(profile_s, 1), "held_out_s": round(time.monotonic() - t0, 1),
                "stored_params": result.profile.params, "probe_levels": result.profile.probes, "held_out": levels}
    finally:
        database.close()


def analyse(run: dict[str, Any], work: Path) -> dict[str, Any]:
    """The fits of one run's probes — every level; without the step-filling prefill levels (the plan before); without
    each step-filling family alone — and every parameter set held to the run's held-out levels."""
    job = profile_job(work)
    probes = pc.ProbeLevels(job, None, levels=run["probe_levels"])
    filling = [lv for lv in run["probe_levels"] if lv["kind"] == "prefill" and lv["concurrency"] > 1]
    drops = {"fit, every probe": frozenset(),
             "fit, single-prompt prefill only": frozenset(pc.level_name(lv) for lv in filling)}
    for isl, c in sorted({(lv["isl"], lv["concurrency"]) for lv in filling}):
        drops[f"fit, without prefill {isl} c={c}"] = frozenset(
            pc.level_name(lv) for lv in filling if (lv["isl"], lv["concurrency"]) == (isl, c))
    sets = {"defaults": default_params("CPU"), "stored profile": PerfParams.model_validate(run["stored_params"])}
    fits: dict[str, Any] = {"defaults": {"prefill_terms": {k: getattr(sets["defaults"], k) for k in PREFILL_TERMS}}}
    for name, drop in drops.items():
        cal = fit_probes(probes.samples(drop), "CPU", as_sent=True)
        sets[name] = cal.params
        fits[name] = {"dropped": sorted(drop), "probes_held_out": cal.to_dict()["error_after"].get("held_out"),
                      "prefill_terms": {k: getattr(cal.params, k) for k in PREFILL_TERMS}}
    return {"fits": fits, "errors": {name: errors_of(job, run["held_out"], p) for name, p in sets.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--from", dest="source", type=Path, help="analyse the runs of an earlier output (no measuring)")
    ap.add_argument("--out", type=Path, default=RESULTS / "prefill_probes")
    a = ap.parse_args(argv)
    measured = json.loads(a.source.read_text())["runs"] if a.source else []
    runs: list[dict[str, Any]] = []
    for i in range(len(measured) or a.runs):
        with tempfile.TemporaryDirectory(prefix="prefill-probes-") as tmp:
            t0 = time.monotonic()
            print(f"run {i + 1}", file=sys.stderr)
            run = measured[i] if measured else measure(Path(tmp))
            wall = run.get("wall_s") or round(time.monotonic() - t0, 1)  # measuring's, not a re-analysis's
            runs.append({**{k: run[k] for k in ("profile_s", "held_out_s", "stored_params", "probe_levels",
                                                "held_out")}, **analyse(run, Path(tmp)), "wall_s": wall})
    table = [{"run": i + 1, "parameters": name, "held_out_median": e["median_of_medians"],
              "held_out_rms_log": e["rms_log"],
              "probes_held_out_median": (r["fits"].get(name, {}).get("probes_held_out") or {}).get("overall")}
             for i, r in enumerate(runs) for name, e in r["errors"].items()]
    command = f"python research/prefill_probes.py {f'--from {a.source}' if a.source else f'--runs {a.runs}'}"
    write_results(a.out, {"command": command, "runs": runs}, table)
    print("| run | parameters | held-out levels: median of medians | RMS log |")
    print("|---|---|---|---|")
    for row in table:
        med, rms = row["held_out_median"], row["held_out_rms_log"]
        print(f"| {row['run']} | {row['parameters']} | {'-' if med is None else f'{100 * med:.1f}%'} "
              f"| {'-' if rms is None else f'{rms:.3f}'} |")
    print("\nprefill terms per fit (run by run):")
    for i, r in enumerate(runs):
        for name, f in r["fits"].items():
            print(f"  run {i + 1} {name}: " + ", ".join(f"{k}={v:.3g}" for k, v in f["prefill_terms"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
