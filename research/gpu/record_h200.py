"""Record the real-GPU studies brought back from the lent H200: re-read, tabulate, compare, calibrate.

The device run (``research/gpu/run_h200.sh``) brings back its results database and every level's saved
``vllm bench serve`` JSON. This script

1. re-reads each level from its saved JSON with today's ``executors.measuring.bench.parse_result`` into a fresh results
   database (the device run's parser predated the fix for vLLM 0.26's JSON, which saves no ``latencies`` list,
   and stored no TPOT or tokens/s/user; the /metrics fields — imbalance, prefix hits, preemptions — are kept
   from the device database, and the trial's timings, deployment and number are copied as they were);
2. writes ``research/results/h200/levels.csv`` (one row per trial × load level) and ``summary.json`` (engine,
   GPU, date, device time, the best deployment under the SLOs against vLLM's defaults);
3. calibrates the performance model on every measured trial (``advisor.calibrate``, cross-validated by trial)
   and writes ``perf-params-h200.json`` and its report.

    python research/gpu/record_h200.py RESULTS_DIR [--device-seconds S]   (RESULTS_DIR: the unpacked tarball)

The 2 x H200 run (``research/gpu/h200x2-*.yaml``, one deployment per study) is recorded with

    python research/gpu/record_h200.py RESULTS_DIR --out research/results/h200x2 --details --tuned all \
        --gpu-label "2 x NVIDIA H200 (device kind nvidia-h200-x2)" --device-seconds S

``--details`` adds the /metrics fields (DP imbalance, EPLB balancedness, KV-transfer tokens, tokens per DP
rank) to ``levels.csv`` and writes ``trials.json`` (per trial: timings, per level the per-instance counters).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from advisor.calibrate import calibrate, measured_samples  # noqa: E402
from advisor.job import TuningJob, job_from_dict  # noqa: E402
from advisor.objectives import score  # noqa: E402
from db import queries  # noqa: E402
from executors.measuring.bench import parse_result  # noqa: E402
from search_spaces import Measurement, TrialState, slo_violation  # noqa: E402

OUT = ROOT / "research" / "results" / "h200"  # the default --out (the 1 x H200 run)
#: Read from /metrics scrapes, not from the bench JSON: kept as the device run stored them.
SCRAPED = ("dp_imbalance", "prefix_cache_hit_rate", "kv_transfer_tokens", "preemptions", "eplb_balancedness")
COLUMNS = ("study", "trial", "deployment", "max_num_seqs", "max_num_batched_tokens", "concurrency", "completed",
           "throughput_per_gpu", "output_throughput_per_gpu", "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms",
           "p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms", "p50_tokens_per_s_per_user", "p90_tokens_per_s_per_user",
           "p99_tokens_per_s_per_user", "achieved_concurrency", "prefix_cache_hit_rate", "preemptions",
           "meets_slos", "deploy_s", "measure_s", "teardown_s")
#: Added by --details: what the executor scraped from /metrics and the EPLB log, per level.
DETAIL_COLUMNS = ("dp_imbalance", "eplb_balancedness", "kv_transfer_tokens", "tokens_per_rank")


def local_job(doc: dict[str, Any], study: str) -> TuningJob:
    """The study's job with its model folder found on this machine (the device's path does not exist here)."""
    name = Path(doc["model"]["path"]).name
    for cand in (ROOT / ".gpu" / "s" / "models" / name, ROOT.parent / "shared" / "gpu" / "models" / name):
        if (cand / "config.json").is_file():
            return job_from_dict({**doc, "model": {**doc["model"], "path": str(cand)}}, source=f"study {study!r}")
    raise SystemExit(f"model folder {name} not found under .gpu/s/models or ../shared/gpu/models")


def reread(device: db.Database, out: db.Database, runs: Path) -> dict[str, TuningJob]:
    jobs: dict[str, TuningJob] = {}
    for st in queries.list_studies(device):
        job = jobs[st.name] = local_job(st.job, st.name)
        out.upsert_study(st.name, st.job, description=st.description, executor=st.executor,
                         engine_version=st.engine_version, hardware=st.hardware, optuna_study_name=st.name)
        for t in queries.list_trials(device, st.name, states=[TrialState.COMPLETE]):
            full = queries.get_trial(device, st.name, t.number)
            assert full is not None and full.config is not None
            run_dir = Path(next(iter((full.resources or {})["log_paths"].values()))).parent
            local = runs / run_dir.relative_to("/tmp/da-runs")
            old = {m.concurrency: m for m in full.measurements}
            levels: list[Measurement] = []
            for c in sorted(old):
                m = parse_result(json.loads((local / "bench" / f"c{c}.json").read_text()), concurrency=c,
                                 gpus=full.gpus or 1)
                raw = {**(m.raw or {}), **{k: v for k, v in (old[c].raw or {}).items() if k == "metrics"}}
                levels.append(m.model_copy(update={**{k: getattr(old[c], k) for k in SCRAPED}, "raw": raw}))
            outcome = score(job, levels)
            tid = out.start_trial(st.name, t.number, params=full.params, config=full.config,
                                  topology=full.topology, worker=full.worker)
            out.record_resources(tid, full.resources or {})
            out.finish_trial(tid, TrialState.COMPLETE, measurements=levels, timings=full.timings,
                             objectives=outcome.as_dict(job), violation=outcome.violation)
    return jobs


def rows(database: db.Database, jobs: dict[str, TuningJob]) -> list[dict[str, Any]]:
    out = []
    for name, job in jobs.items():
        for t in queries.list_trials(database, name):
            full = queries.get_trial(database, name, t.number)
            assert full is not None and full.config is not None
            role = full.config.roles[0]
            for m in full.measurements:
                row = {"study": name, "trial": t.number, "deployment": full.config_text,
                       "max_num_seqs": role.max_num_seqs, "max_num_batched_tokens": role.max_num_batched_tokens,
                       "meets_slos": slo_violation(job.slos, m) <= 0, **full.timings}
                row.update({k: getattr(m, k) for k in COLUMNS if k in Measurement.model_fields})
                row.update({k: getattr(m, k) for k in ("dp_imbalance", "eplb_balancedness", "kv_transfer_tokens")})
                per_inst = (m.raw or {}).get("metrics") or {}
                row["tokens_per_rank"] = json.dumps({i: v.get("tokens_per_rank") for i, v in per_inst.items()},
                                                    separators=(",", ":")) if per_inst else None
                row["instances"] = per_inst
                out.append(row)
    return out


def best_under_slos(levels: list[dict[str, Any]], studies: set[str]) -> dict[str, Any] | None:
    ok = [r for r in levels if r["study"] in studies and r["meets_slos"]]
    return max(ok, key=lambda r: r["throughput_per_gpu"]) if ok else None


def trial_details(database: db.Database, jobs: dict[str, TuningJob], levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Per study and trial: deployment, timings, GPUs, and per level the scraped counters of every instance."""
    out: dict[str, Any] = {}
    for name in jobs:
        for t in queries.list_trials(database, name):
            full = queries.get_trial(database, name, t.number)
            assert full is not None
            rs = [r for r in levels if r["study"] == name and r["trial"] == t.number]
            out[f"{name}/{t.number}"] = {
                "deployment": full.config_text, "state": str(full.state), "gpus": full.gpus, "timings": full.timings,
                "levels": {r["concurrency"]: {k: r.get(k) for k in ("throughput_per_gpu", "p90_ttft_ms", "p90_tpot_ms",
                                                                      "meets_slos", "dp_imbalance",
                                                                      "eplb_balancedness", "kv_transfer_tokens",
                                                                      "instances")} for r in rs},
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="the unpacked h200-results.tgz (holds da-gpu/ and da-runs/)")
    ap.add_argument("--device-seconds", type=float, default=None, help="device time the runs used (for the record)")
    ap.add_argument("--out", type=Path, default=OUT, help="where levels.csv, summary.json and perf-params-NAME.json "
                    "go (NAME: the folder's name; default: research/results/h200)")
    ap.add_argument("--gpu-label", default="1 x NVIDIA H200 (device kind nvidia-h200)", help="summary.json's gpu")
    ap.add_argument("--tuned", default="h200-qwen3-small",
                    help="comma-separated studies the tuned best is taken from (with the -defaults ones), or 'all'")
    ap.add_argument("--details", action="store_true",
                    help="add the scraped per-level fields to levels.csv and write trials.json")
    args = ap.parse_args()
    out_dir: Path = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    columns = COLUMNS + (DETAIL_COLUMNS if args.details else ())
    recorded = args.results / "recorded.db"
    recorded.unlink(missing_ok=True)
    device, out = db.connect(f"sqlite:///{args.results / 'da-gpu' / 'results.db'}"), db.connect(f"sqlite:///{recorded}")
    try:
        jobs = reread(device, out, args.results / "da-runs")
        levels = rows(out, jobs)
        with (out_dir / "levels.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=columns)
            w.writeheader()
            w.writerows({k: r.get(k) for k in columns} for r in levels)
        default = best_under_slos(levels, {n for n in jobs if n.endswith("-defaults")})
        tuned_set = set(jobs) if args.tuned == "all" else set(args.tuned.split(","))
        tuned = best_under_slos(levels, tuned_set | {n for n in jobs if n.endswith("-defaults")})
        samples = [s for n, j in jobs.items() for s in measured_samples(out, n, j)]
        cal = calibrate(samples)
        cal.params.save(out_dir / f"perf-params-{out_dir.name}.json")
        (out_dir / f"perf-params-{out_dir.name}.report.json").write_text(json.dumps(cal.to_dict(), indent=2) + "\n")
        studies = queries.list_studies(out)
        if args.details:
            (out_dir / "trials.json").write_text(json.dumps(trial_details(out, jobs, levels), indent=2) + "\n")
    finally:
        device.close()
        out.close()
    first = min(r for r in (s.created_at for s in studies))
    summary = {
        "engine": studies[0].engine_version, "gpu": args.gpu_label,
        "hardware": studies[0].hardware, "date": first.date().isoformat(), "device_seconds": args.device_seconds,
        "slos": [s.model_dump() for s in next(iter(jobs.values())).slos],
        "studies": {s.name: {"description": s.description, "trials": s.done} for s in studies},
        "distinct_deployments": len({(r["study"].removesuffix("-defaults"), r["deployment"]) for r in levels}),
        "vllm_defaults_best_under_slos": default, "tuned_best_under_slos": tuned,
        "tuned_over_default": (tuned["throughput_per_gpu"] / default["throughput_per_gpu"]
                               if tuned and default else None),
        "calibration": {k: v for k, v in cal.to_dict().items() if k != "params"},
    }
    if args.details:
        summary["best_under_slos_per_study"] = {n: best_under_slos(levels, {n}) for n in sorted(jobs)}
        for b in summary["best_under_slos_per_study"].values():
            if b:
                b.pop("instances", None)
    for k in ("vllm_defaults_best_under_slos", "tuned_best_under_slos"):
        if summary[k]:
            summary[k] = {c: v for c, v in summary[k].items() if c != "instances"}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"{'study':<26} {'trial':>5} {'deployment':<62} {'c':>4} {'tok/s/GPU':>10} {'p90 TTFT':>9} "
          f"{'p90 TPOT':>9} {'SLOs':>5}")
    for r in levels:
        print(f"{r['study']:<26} {r['trial']:>5} {r['deployment']:<62} {r['concurrency']:>4} "
              f"{r['throughput_per_gpu']:>10,.0f} {r['p90_ttft_ms']:>9.0f} {r['p90_tpot_ms'] or 0:>9.2f} "
              f"{'yes' if r['meets_slos'] else 'no':>5}")
    print(f"tuned / vLLM defaults under the SLOs: {summary['tuned_over_default']}")
    e = cal.to_dict()
    print(f"calibration ({len(cal.trials)} trials, {cal.folds}-fold by trial), median error "
          f"default → calibrated: in-sample {e['error_before']['in_sample']['overall']:.1%} → "
          f"{e['error_after']['in_sample']['overall']:.1%}; held out "
          f"{e['error_before'].get('held_out', {}).get('overall', float('nan')):.1%} → "
          f"{e['error_after'].get('held_out', {}).get('overall', float('nan')):.1%}")
    print(f"wrote {out_dir}")


if __name__ == "__main__":
    main()
