"""Two views of a measured level, held to the stored runs: the steady closed loop (``executors.perf.levels``) and the
level as the benchmark sent it (``executors.perf.burst``), each used both to fit a profile's probes and to predict
levels the fit never saw.

For each stored profile (its raw database, committed under ``research/results/``), the probes are fitted twice
from the GPU kind's defaults, as ``advisor profile`` fits them (``advisor.profile.fit_probes``): levels predicted
steady, and levels predicted as sent. Then the levels of another deployment measured after the profile — never
part of any fit — are predicted by the defaults, the stored profile, and both fits, in both views:

* ``h200-dsv3``: the DeepSeek-V3-width FP8 profile at depths 1 and 5 (4 Dec, three levels paused by just-in-time
  kernel compiles left out of the fits), held to the stack check at depth 3 (c = 8; c = 64 paused 6.8 s and is
  reported beside, not pooled);
* ``h200-30b``: the ~30B profile #1 (3 and 12 layers, 4 Dec; its one stalled probe left out, as today's profile
  would), held to studies r4, r6 and r7 on the full 48-layer model (r4 parsed again as the bench parser does now:
  the first wave left out), pooled at or under each trial's measured knee and over all; and each trial's knee (r6
  and r7: judged by today's rule) beside where each parameter set puts it, in each view — where a real knee search
  starts;
* ``cpu-pt6``, ``cpu-ci``: the tiny MoE on vLLM's CPU build (this project's ``tests/test_profile_real``), held to
  the study level that test compares (5 Dec on a 2-core machine; the 4 Dec CI run that failed that test).

Errors: median |predicted / measured − 1| over the levels' values (throughput, P50 TTFT, P50 TPOT, and P90 TTFT
and P90 tok/s/user where the level has them); for the probes, cross-validated by probe family as ``advisor
profile`` reports them, and RMS log. What it does not show: any run made after the view was written — every
number here is a re-fit of stored runs; a GPU session must hold the views to new levels.

    python research/level_views.py [--cases h200-dsv3,h200-30b,cpu-pt6,cpu-ci] [--out research/results/level_views]

About 15 minutes on a 2-core machine (the 30B as-sent fit is 6 of them).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "research" / "gpu"))

import profile_check as pc  # noqa: E402

import db  # noqa: E402
from advisor.calibrate import Problem, Sample, fitted_values  # noqa: E402
from advisor.job import TuningJob, load_job  # noqa: E402
from advisor.profile import fit_probes, plan_profile  # noqa: E402
from executors import place  # noqa: E402
from executors.measuring.bench_result import first_wave_left_out  # noqa: E402
from executors.perf import PerfParams, default_params  # noqa: E402
from research.raw import raw_file  # noqa: E402

RESULTS = ROOT / "research" / "results"
VIEWS = (False, True)  # as sent? (``profile_check.view`` names each)
PAUSED_DSV3 = ("L1/decode/2048/c16", "L1/decode/2048/c256", "L5/decode/2048/c256")


def unpack(tarball: Path, into: Path) -> Path:
    with tarfile.open(raw_file(tarball)) as tar:
        tar.extractall(into, filter="data")
    return into


def job_at(path: Path, storage: Path, run_dir: Path, out: Path) -> TuningJob:
    """``path``'s job with its database and run folder moved to the unpacked copies."""
    doc = yaml.safe_load(path.read_text())
    doc["storage"] = f"sqlite:///{storage}"
    doc.setdefault("executor", {})["run_dir"] = str(run_dir)
    if "model" in doc and "path" in doc["model"]:
        doc["model"]["path"] = str((path.parent / doc["model"]["path"]).resolve())
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_job(out)


def fits(levels: pc.ProbeLevels, gpu: str, drop: frozenset[str] = frozenset()) -> tuple[dict[str, Any], dict[str, Any]]:
    """Both fits of the stored probes: their parameters and their reports (probe errors, cross-validated)."""
    params: dict[str, Any] = {}
    report: dict[str, Any] = {}
    for as_sent in VIEWS:
        t0 = time.monotonic()
        cal = fit_probes(levels.samples(drop), gpu, as_sent=as_sent)
        name = f"fit {pc.view(as_sent)}"
        params[name] = cal.params
        d = cal.to_dict()
        report[name] = {"fit_s": round(time.monotonic() - t0, 1), "dropped": sorted(drop),
                        "probes_before": d["error_before"]["in_sample"],
                        "probes_in_sample": d["error_after"]["in_sample"],
                        "probes_held_out": d["error_after"].get("held_out"),
                        "changes": d["changes"], "params": d["params"]}
    return params, report


def sets_of(job: TuningJob, database: db.Database, fitted: dict[str, PerfParams]) -> dict[str, tuple[PerfParams, str]]:
    sets = pc.param_sets(job, database)
    sets = {"defaults": sets["defaults"], "stored profile": sets["profile"]}
    return sets | {name: (p, name) for name, p in fitted.items()}


def case_dsv3(work: Path) -> dict[str, Any]:
    base = RESULTS / "h200-profile-dsv3" / "call6-8-4dec"
    unpack(base / "raw.tar.xz", work)
    job = job_at(ROOT / "research/gpu/h200-profile-dsv3.yaml", work / "da-gpu/results.db", work / "runs",
                 work / "job.yaml")
    database = db.connect(job.storage)
    params, report = fits(pc.ProbeLevels(job, database), job.cluster.gpu, frozenset(PAUSED_DSV3))
    sets = sets_of(job, database, params)
    check = json.loads((base / "check-dsv3-L3.json").read_text())
    loads = sorted(int(c) for c in check["measured"])
    sjob = pc.stack_job(job, check["depth"], loads)
    topo = place(plan_profile(job).config, sjob.cluster)
    held: dict[str, Any] = {}
    for as_sent in VIEWS:
        for name, (p, _) in sets.items():
            got = pc.levels_of(topo, sjob.model_profile(), sjob.workload, p, loads, as_sent,
                               [sjob.workload.num_prompts(c) for c in loads])
            pred = {str(m.concurrency): pc.values(m) for m in got}
            held[f"{name} | {pc.view(as_sent)}"] = {
                "clean (c = 8)": pc.errors(pred, {"8": check["measured"]["8"]}),
                "paused (c = 64)": pc.errors(pred, {"64": check["measured"]["64"]}),
                "predicted": pred}
    return {"what": "DeepSeek-V3-width FP8 stack, 1 x H200: probes at depths 1 and 5, held to depth 3",
            "fits": report, "held_out": held, "pooled": "clean (c = 8)", "measured": check["measured"]}


#: The studies profile #1 is held to, and the probe level the stall detector flags in it (docs/benchmarks.md,
#: "Profile #1 under today's stall rule": depth 3, decode, c = 256, a 1.46-s pause), which today's profile leaves out.
STUDIES_30B = ("r4", "r6", "r7")
STALLED_30B = ("L3/decode/2048/c256",)


def case_30b(work: Path) -> dict[str, Any]:
    dbs = {}
    for r in STUDIES_30B:
        unpack(RESULTS / f"h200-study-30b-{r}" / "raw.tar.xz", work / r)
        dbs[r] = job_at(ROOT / "research/gpu/h200-study-30b.yaml", work / r / "da-gpu/results.db", work / r / "runs",
                        work / r / "job.yaml")
    job = dbs[STUDIES_30B[-1]]
    database = db.connect(job.storage)
    params, report = fits(pc.ProbeLevels(job, database), job.cluster.gpu, frozenset(STALLED_30B))
    sets = sets_of(job, database, params)
    held: dict[str, Any] = {}
    knees: dict[str, Any] = {}
    ranks: dict[str, Any] = {}
    for r, rjob in dbs.items():
        rdb = db.connect(rjob.storage)
        again = pc.reparsed(str(work / r / "da-runs")) if r == "r4" else (lambda m: m)  # r4 predates the wave rule
        for as_sent in VIEWS:
            out = pc.heldout(rjob, sets, rdb, f"h200-study-30b-{r}", again, as_sent)
            for name in sets:
                got = held.setdefault(f"{name} | {pc.view(as_sent)}", {})
                got[f"{r} under the knees"] = out["pooled_under_knee"][name]
                got[f"{r} all levels"] = out["pooled"][name]
        if r != "r4":  # r4's knees were judged with the first wave in (the parser's rule came after it)
            knees[r] = knee_starts(rjob, rdb, f"h200-study-30b-{r}", sets)
            ranks[r] = ranking(rjob, rdb, f"h200-study-30b-{r}", sets)
    for key, got in held.items():  # pooled over the studies: the median of their medians, and the worst
        meds = [got[f"{r} under the knees"]["median"] for r in STUDIES_30B]
        got["under the knees"] = {"median": sorted(meds)[len(meds) // 2], "worst": max(meds),
                                  "n": sum(got[f"{r} under the knees"]["n"] for r in STUDIES_30B)}
    return {"what": "~30B MoE, 1 x H200: profile #1 (3 and 12 layers; its stalled probe left out of both fits) held "
                    "to studies r4, r6 and r7 (48 layers)",
            "fits": report, "held_out": held, "pooled": "under the knees", "knee_starts": knees,
            "knee_errors": knee_errors(knees), "ranking": ranks}


def knee_starts(job: TuningJob, database: db.Database, study: str,
                sets: dict[str, tuple[PerfParams, str]]) -> list[dict[str, Any]]:
    """Each trial's measured knee beside where each parameter set, in each view, puts it (``predicted_knee``:
    where a real knee search starts)."""
    from executors.measuring.loop import MeasurePlan
    from executors.simulated.executor import predicted_knee

    plan, model, rows = MeasurePlan(tuple(job.slos)), job.model_profile(), []
    for t in db.queries.list_trials(database, study):
        trial = db.queries.get_trial(database, study, t.number)
        knee = max((m.concurrency for m in trial.measurements if m.purpose == "knee"), default=None) if trial else None
        if trial is None or trial.config is None or knee is None:
            continue
        topo = place(trial.config, job.cluster)
        rows.append({"trial": t.number, "knee": knee, **{
            f"{name} | {pc.view(as_sent)}": predicted_knee(topo, model, job.workload, plan, p, as_sent=as_sent)
            for name, (p, _) in sets.items() for as_sent in VIEWS}})
    return rows


def ranking(job: TuningJob, database: db.Database, study: str,
            sets: dict[str, tuple[PerfParams, str]]) -> dict[str, Any]:
    """How each parameter set ranks the study's measured deployments as the guide ranks candidates (the steady
    view, ``advisor.proposers.model_rank.predicted_outcomes``): Spearman's rho between predicted and measured
    objective (an infeasible prediction or measurement counts as 0), and the measured objective of the deployment
    each set puts first, as a share of the best measured. One trial per configuration: repeats and reused
    measurements are left out. A set that predicts every deployment alike (within 0.5%) ranks nothing: it is
    reported as tied, with no pick."""
    from advisor.objectives import objective_names
    from advisor.proposers.model_rank import predicted_outcomes

    name = objective_names(job)[0]
    trials = [t for t in db.queries.list_trials(database, study, states=["complete"])
              if t.config is not None and t.executed and t.repeat_of is None and t.reused_from is None]
    measured = [float((t.objectives or {}).get(name) or 0.0) if (t.violation or 0.0) <= 0 else 0.0 for t in trials]
    out: dict[str, Any] = {"trials": [t.number for t in trials], "measured": measured, "objective": name}
    for set_name, (p, _) in sets.items():
        got = predicted_outcomes(job, [t.config for t in trials], p, points=False)
        pred = [o.values[0] if o.feasible else 0.0 for o in got]
        if max(pred) <= 1.005 * min(pred):  # every deployment predicted alike: no ranking, no pick
            out[set_name] = {"predicted": pred, "tied": True, "spearman": None, "pick": None,
                             "pick_share_of_best": None}
            continue
        top = max(range(len(pred)), key=lambda i: pred[i])
        out[set_name] = {"predicted": pred, "tied": False, "spearman": spearman(pred, measured),
                         "pick": trials[top].number, "pick_share_of_best": measured[top] / max(measured)}
    return out


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (``scipy.stats.spearmanr``: ties share their mean rank); 0 where either side
    is constant and there is no ranking to correlate."""
    import warnings

    from scipy.stats import spearmanr

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant input: scipy warns and answers nan
        rho = float(spearmanr(x, y).statistic)
    return 0.0 if rho != rho else rho


def knee_errors(knees: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Median and mean |log(predicted knee / measured knee)| per parameter set and view, over every trial."""
    import math

    rows = [row for got in knees.values() for row in got]
    out = {}
    for key in (k for k in rows[0] if " | " in k) if rows else ():
        e = sorted(abs(math.log(row[key] / row["knee"])) for row in rows if row[key])
        out[key] = {"median_abs_log": e[len(e) // 2] if e else None, "mean_abs_log": sum(e) / len(e) if e else None,
                    "n": len(e), "none": sum(1 for row in rows if not row[key])}
    return out


def case_cpu(work: Path, run: str) -> dict[str, Any]:
    unpack(RESULTS / "cpu-profile" / "raw.tar.xz", work)
    folder = work / run
    pjob = job_at(folder / "profile.yaml", folder / "results.db", work / "runs", work / "profile.yaml")
    sjob = job_at(folder / "study.yaml", folder / "results.db", work / "runs", work / "study.yaml")
    database = db.connect(pjob.storage)
    params, report = fits(pc.ProbeLevels(pjob, database), "CPU")
    stored = PerfParams.model_validate(database.profiles(gpu="CPU")[0].params)
    sets = {"defaults": default_params("CPU"), "stored profile": stored} | params
    trial = db.queries.get_trial(database, "study", 0)
    level = next(m for m in trial.measurements if "knee_start" in m.raw)
    sample = Sample("study", 0, trial.config, sjob, {level.concurrency: fitted_values(level)},
                    {level.concurrency: level.completed or 0},
                    frozenset({level.concurrency} if first_wave_left_out(level) else ()))
    held: dict[str, Any] = {}
    for as_sent in VIEWS:
        problem = Problem([sample], as_sent=as_sent)
        for name, p in sets.items():
            e = problem.errors(p)
            held[f"{name} | {pc.view(as_sent)}"] = {"study level": {"median": e.overall, "rms_log": e.rms_log,
                                                                     **e.per_metric}}
    return {"what": f"tiny MoE, vLLM's CPU build ({run}): probes at 1 and 2 layers held to the study's level at "
                    f"c = {level.concurrency} ({level.completed} requests)",
            "fits": report, "held_out": held, "pooled": "study level", "measured": fitted_values(level)}


CASES = {"h200-dsv3": case_dsv3, "h200-30b": case_30b,
         "cpu-pt6": lambda w: case_cpu(w, "raw-pt6"), "cpu-ci": lambda w: case_cpu(w, "raw-ci")}


def rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for case, r in results.items():
        for key, v in r["held_out"].items():
            name, view = key.split(" | ")
            e = v[r["pooled"]]
            fit = r["fits"].get(name, {})
            held_probes = fit.get("probes_held_out") or {}
            out.append({"case": case, "params": name, "view": view, "held_out_median": e.get("median"),
                        "held_out_n": e.get("n"), "probes_held_out_median": held_probes.get("overall"),
                        "probes_held_out_rms_log": held_probes.get("rms_log")})
    return out


def pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}%"


def write_results(out: Path, doc: Any, table: list[dict[str, Any]]) -> None:
    """``doc`` as ``out``.json and ``table``'s rows as ``out``.csv."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    with out.with_suffix(".csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--out", type=Path, default=RESULTS / "level_views")
    a = ap.parse_args(argv)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="level-views-") as tmp:
        for case in a.cases.split(","):
            t0 = time.monotonic()
            work = Path(tmp) / case
            work.mkdir()
            results[case] = CASES[case](work)
            results[case]["wall_s"] = round(time.monotonic() - t0, 1)
            print(f"{case}: {results[case]['what']} ({results[case]['wall_s']} s)", file=sys.stderr)
    table = rows(results)
    write_results(a.out, results, table)
    print("| case | parameters | probes held out (fit's own view) | held-out levels: steady view | as sent |")
    print("|---|---|---|---|---|")
    for case in results:
        for name in dict.fromkeys(r["params"] for r in table if r["case"] == case):
            by = {r["view"]: r for r in table if r["case"] == case and r["params"] == name}
            probes = by["steady"]["probes_held_out_median"]
            print(f"| {case} | {name} | {pct(probes)} | {pct(by['steady']['held_out_median'])} "
                  f"| {pct(by['as sent']['held_out_median'])} |")
    print("(median |predicted / measured - 1|; pooled: "
          + "; ".join(f"{c}: {r['pooled']}" for c, r in results.items()) + ")")
    for case, r in results.items():
        for study, rk in (r.get("ranking") or {}).items():
            print(f"\n{case} {study}: the guide's ranking (steady view) of the study's {len(rk['trials'])} measured "
                  f"deployments by {rk['objective']}")
            print("| parameters | Spearman rho | first pick (trial) | its measured share of the best |")
            print("|---|---|---|---|")
            for name, v in rk.items():
                if isinstance(v, dict) and v["tied"]:
                    print(f"| {name} | — (every deployment predicted {v['predicted'][0]:,.0f}) | — | — |")
                elif isinstance(v, dict):
                    print(f"| {name} | {v['spearman']:.2f} | {v['pick']} | {v['pick_share_of_best']:.2f} |")
        if r.get("knee_errors"):
            print(f"\n{case}: where each parameter set puts each trial's knee (a knee search's start), "
                  f"median / mean |log(predicted / measured)| over {', '.join(r['knee_starts'])}'s trials")
            print("| parameters | view | median | mean | trials (no knee predicted) |")
            print("|---|---|---|---|---|")
            for key, e in r["knee_errors"].items():
                name, view = key.split(" | ")
                print(f"| {name} | {view} | {e['median_abs_log']:.3f} | {e['mean_abs_log']:.3f} "
                      f"| {e['n']} ({e['none']}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
