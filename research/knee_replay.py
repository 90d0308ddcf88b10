"""Replay a real study's knee searches: the search as it is now, against truths made of what each trial measured.

For each trial of a study (in its SQLite database) the replay builds:

- **Truth**: the trial's measured levels, one per load (a close call's two runs are already pooled in the
  database). Each SLO metric and the throughput are interpolated linearly in log metric over log load between
  measured loads, and extrapolated past the lowest and highest measured load along the slope of the end segment
  (log-log, the slope held); one measured load only: the value held flat. At a measured load the truth is what
  was measured, so the verdicts the real search saw are the replay's verdicts there. Noise-free: close calls are
  not re-measured (the real search's re-measured levels are one level here, as they are in the database).
- **Plan**: what the trial had — ``simulated.predicted_plan`` with the model's parameters of that moment, the
  trial's config placed on the job's cluster: the model's knee where the search starts and its curve the search
  aims by. The parameters start from the stored hardware profile (``advisor.profile.resolve_params``, as
  ``research/gpu/profile_check.py`` loads them) and, in a guided study, are the guide's re-fit on the trials
  before (``make_guide``, then ``observe`` after each trial, as ``advisor.tune`` does): on r4 that gives each
  trial's real start (``--profile-only``: the profile's parameters for every trial, whose starts differ).

It runs ``search_levels`` with the truth as the probe and reports, per trial, the real levels (in the order run,
by vLLM's result date), the replayed levels, full-length levels per knee and levels to the bracket (the first
level after which one met every SLO and one did not). Differences from the real run come from the truth between
measured loads (interpolated) and from noise (the real search's close calls).

``--reparse FOLDER`` (the study's run folders) judges every level as the parser does now (a change of what a
level's numbers are, e.g. the first wave left out); a truth past the highest measured load is then an extrapolation.

    python research/knee_replay.py [--job research/gpu/h200-study-30b.yaml] [--db /tmp/x/da-gpu/results.db]
        [--study h200-study-30b-r4] [--reparse /tmp/x/da-runs] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from advisor.job import load_job  # noqa: E402
from advisor.profile import resolve_params  # noqa: E402
from executors import place  # noqa: E402
from executors.measuring.loop import feasible, knee_of, search_levels  # noqa: E402
from executors.simulated.executor import predicted_plan  # noqa: E402
from search_spaces import Measurement  # noqa: E402

METRICS = ("p90_ttft_ms", "p90_tokens_per_s_per_user", "throughput_per_gpu")


def loglog(points: list[tuple[float, float]], x: float) -> float:
    """y at x on the log-log polyline through ``points`` (sorted by x, all positive), the end segments' slopes
    held beyond the ends (one point: flat)."""
    if len(points) == 1:
        return points[0][1]
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + t * (math.log(y1) - math.log(y0)))


def truth_of(measured: list[Measurement], gpus: int):
    """A probe(load) -> Measurement through the trial's measured levels (``loglog`` per metric)."""
    pts = {k: sorted((float(m.concurrency), float(getattr(m, k))) for m in measured
                     if m.completed and getattr(m, k)) for k in METRICS}

    def probe(load: float) -> Measurement:
        c = int(load)
        return Measurement(concurrency=c, source="simulated", gpus=gpus, num_requests=2 * c, completed=2 * c,
                           error_rate=0.0, **{k: loglog(p, float(c)) for k, p in pts.items()})
    return probe


def to_bracket(levels: list[Measurement], slos: list[Any]) -> int | None:
    """Levels, in the order measured, until one met every SLO and one did not (None: never)."""
    ok = bad = False
    for i, m in enumerate(levels, 1):
        ok, bad = ok or feasible(slos, m), bad or not feasible(slos, m)
        if ok and bad:
            return i
    return None


def replay(job_path: str, db_path: str, study: str, profile_only: bool = False,
           reparse: str | None = None) -> list[dict[str, Any]]:
    from advisor.proposers.guide_turns import make_guide

    sys.path.insert(0, str(ROOT / "research" / "gpu"))
    from profile_check import reparsed

    again = reparsed(reparse)

    job = load_job(job_path)
    database = db.connect(f"sqlite:///{Path(db_path).resolve()}", read_only=True)
    params = resolve_params(job, database)
    if params.profile_id is None:
        raise SystemExit(f"no stored profile in {db_path}")
    slos, wl, model = list(job.slos), job.workload, job.model_profile()
    guide = None if profile_only else make_guide(job, params.params)
    out = []
    for t in db.queries.list_trials(database, study):
        trial = db.queries.get_trial(database, study, t.number)
        if trial is None or trial.config is None or not trial.measurements:
            continue
        measured = [again(m) for m in trial.measurements]
        real = sorted(measured, key=lambda m: str(m.raw.get("date")))
        topo = place(trial.config, job.cluster)
        plan = predicted_plan(topo, model, wl, slos, guide.params if guide is not None else params.params)
        if trial.repeat_of is not None:  # a repeat starts where the first run found its knee (advisor.tune)
            first = db.queries.get_trial(database, study, trial.repeat_of)
            knee0 = knee_of(list(first.measurements)) if first is not None else None
            plan = replace(plan, start=knee0.load if knee0 is not None else plan.start)
        levels = search_levels(truth_of(real, trial.config.total_gpus), wl, plan)
        knee = knee_of(levels)
        if guide is not None:
            guide.observe(trial.config, measured)
        out.append({
            "trial": t.number, "config": trial.config_text, "start": plan.start,
            "real": [[m.concurrency, feasible(slos, m)] for m in real],
            "real_knee": max((m.concurrency for m in real if m.purpose == "knee"), default=None),
            "real_knee_judged": max((m.concurrency for m in real if feasible(slos, m)), default=None),
            "real_levels": len(real), "real_to_bracket": to_bracket(real, slos),
            "replay": [[m.concurrency, feasible(slos, m)] for m in levels],
            "replay_knee": knee.concurrency if knee is not None else None,
            "replay_levels": len(levels), "replay_to_bracket": to_bracket(levels, slos),
            "replay_flags": sorted({f for m in levels for f in m.flags}),
        })
    database.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", default="research/gpu/h200-study-30b.yaml")
    ap.add_argument("--db", default="/tmp/x/da-gpu/results.db",
                    help="the study's SQLite database (tar -xJf research/results/h200-study-30b-r4/raw.tar.xz)")
    ap.add_argument("--study", default="h200-study-30b-r4")
    ap.add_argument("--profile-only", action="store_true",
                    help="every trial's plan from the profile's parameters (not the guide's re-fit of the moment)")
    ap.add_argument("--reparse", metavar="FOLDER", help="the study's run folders: each level parsed again from its "
                    "bench JSON with the parser as it is now (``profile_check.py heldout --reparse``)")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    rows = replay(a.job, a.db, a.study, a.profile_only, a.reparse)
    fmt = lambda seq: " ".join(f"{c}{'+' if ok else '-'}" for c, ok in seq)  # noqa: E731
    print("trial | start | real levels (+ met, - failed) | knee | n | to bracket || replay | knee | n | to bracket")
    for r in rows:
        print(f"{r['trial']} | {r['start']:g} | {fmt(r['real'])} | {r['real_knee']} | {r['real_levels']} | "
              f"{r['real_to_bracket']} || {fmt(r['replay'])} | {r['replay_knee']} | {r['replay_levels']} | "
              f"{r['replay_to_bracket']} {' '.join(r['replay_flags'])}")
    if a.out:
        a.out.write_text(json.dumps({"command": " ".join(["knee_replay.py", *(sys.argv[1:] if argv is None else argv)]),
                                     "trials": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
