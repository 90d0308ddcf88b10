"""Workaround calibration for this knee-search study (not the project's CLI; nothing in the project is changed).

`advisor calibrate` (advisor/calibrate.py, _Problem.log_ratios) calls `predict(topo, model, s.job.workload, params)`
without `levels`, so a study whose workload has `load_levels: []` (knee search only) gets no prediction at any
measured concurrency: every level counts as a 10x miss (900%), no parameter is "sensitive", nothing is fitted.
This script runs the same `advisor.calibrate.calibrate` but gives each sample a copy of its job whose
workload.load_levels are that trial's measured concurrencies, so the model predicts exactly the measured levels.

  .venv/bin/python benchmarks/results/h200-knee/calibrate_measured_levels.py
"""
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

import db  # noqa: E402
from advisor.calibrate import METRICS, Sample, calibrate, measured_samples  # noqa: E402
from advisor.job import job_from_dict  # noqa: E402
from db import queries  # noqa: E402

HERE = Path(__file__).resolve().parent
URL = f"sqlite:///{HERE}/raw/da-gpu/results.db"
STUDY = "h200-knee-30b"

database = db.connect(URL)
try:
    row = queries.get_study(database, STUDY)
    doc = dict(row.job)
    doc["model"] = {**doc["model"], "path": str(ROOT / "benchmarks/gpu/models/qwen3-moe-30b")}
    job = job_from_dict(doc, source=f"study {STUDY!r}")
    base = measured_samples(database, STUDY, job)
finally:
    database.close()

samples = []
for s in base:
    wl = s.job.workload.model_copy(update={"load_levels": sorted(s.measured)})
    samples.append(Sample(s.study, s.number, s.config, s.job.model_copy(update={"workload": wl}), s.measured))

cal = calibrate(samples)
out = HERE / "perf-params-h200-knee-measured-levels.json"
cal.params.save(out)
out.with_suffix(".report.json").write_text(json.dumps(cal.to_dict(), indent=2) + "\n")
print(f"{len(cal.trials)} measured trials on {cal.gpu}; median |predicted / measured - 1| "
      f"(held out: {cal.folds}-fold cross-validation by trial); levels per trial: "
      + ", ".join(f"#{s.number}: {sorted(s.measured)}" for s in samples))
print(f"{'levels':24s} {'n':>3s} {'all':>8s} " + " ".join(f"{m:>18s}" for m in METRICS))
for part in ("in_sample", "held_out"):
    for when, errs in (("default", cal.before), ("calibrated", cal.after)):
        e = errs[part]
        print(f"{part.replace('_', ' ') + ', ' + when:24s} {e.levels:3d} " + " ".join(
            f"{x:>8.1%}" if x is not None else f"{'-':>8s}" for x in [e.overall]) + " " + " ".join(
            f"{x:>18.1%}" if x is not None else f"{'-':>18s}" for x in (e.per_metric[m] for m in METRICS)))
print("fitted:", ", ".join(cal.fitted) or "none")
for n, (a, b) in cal.changes.items():
    print(f"  {n:24s} {a:.4g} -> {b:.4g}")
print(f"wrote {out}")
