"""As-sent fits of the ~30B profile #1 (H200) with and without its c = 256 decode probes, held to r4/r6/r7 as
research/level_views.py's h200-30b case does (same unpacking, jobs, sets, heldout, knee starts)."""
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import level_views as lv  # noqa: E402  (adds ROOT and research/gpu to sys.path)
from level_views import pc, db  # noqa: E402

OUT = Path(__file__).resolve().parent
work = OUT / "work"
work.mkdir(exist_ok=True)
dbs = {}
for r in lv.STUDIES_30B:
    if not (work / r / "da-gpu/results.db").exists():
        lv.unpack(lv.RESULTS / f"h200-study-30b-{r}" / "raw.tar.xz", work / r)
    dbs[r] = lv.job_at(lv.ROOT / "research/gpu/h200-study-30b.yaml", work / r / "da-gpu/results.db",
                       work / r / "runs", work / r / "job.yaml")
job = dbs[lv.STUDIES_30B[-1]]
database = db.connect(job.storage)
levels = pc.ProbeLevels(job, database)
names = [(pc.level_name(x), x.get("fitted"), bool(x["values"]), x.get("gpus", 1)) for x in levels.levels]
print("probe levels:", json.dumps(names), file=sys.stderr)
c256 = sorted(n for n, *_ in names if "/decode/" in n and n.endswith("/c256"))
DROPS = {"fit as sent": frozenset(lv.STALLED_30B),                      # (a) = level_views' fit as sent
         "fit as sent no c256": frozenset(lv.STALLED_30B) | frozenset(c256)}  # (b) every decode c=256 out
params, report = {}, {}
for name, drop in DROPS.items():  # level_views' fits (steady and as sent) of the probes less ``drop``; the as-sent one
    p, rep = lv.fits(levels, job.cluster.gpu, drop)
    params[name], report[name] = p["fit as sent"], rep["fit as sent"]
    params[name].save(str(OUT / f"{name.replace(' ', '-')}.json"))
    print(f"{name}: fit {report[name]['fit_s']} s", file=sys.stderr)
    (OUT / "fits.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
sets = lv.sets_of(job, database, params)
held, raw, knees = {}, {}, {}
for r, rjob in dbs.items():
    rdb = db.connect(rjob.storage)
    again = pc.reparsed(str(work / r / "da-runs")) if r == "r4" else (lambda m: m)
    for as_sent in lv.VIEWS:
        t0 = time.monotonic()
        out = pc.heldout(rjob, sets, rdb, f"h200-study-30b-{r}", again, as_sent)
        raw[f"{r} | {pc.view(as_sent)}"] = out
        for name in sets:
            got = held.setdefault(f"{name} | {pc.view(as_sent)}", {})
            got[f"{r} under the knees"] = out["pooled_under_knee"][name]
            got[f"{r} all levels"] = out["pooled"][name]
        print(f"{r} {pc.view(as_sent)}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    if r != "r4":
        knees[r] = lv.knee_starts(rjob, rdb, f"h200-study-30b-{r}", sets)
for key, got in held.items():
    for part in ("under the knees", "all levels"):
        meds = [got[f"{r} {part}"]["median"] for r in lv.STUDIES_30B]
        got[f"median of studies, {part}"] = {"median": sorted(meds)[len(meds) // 2], "worst": max(meds),
                                            "n": sum(got[f"{r} {part}"]["n"] for r in lv.STUDIES_30B)}
doc = {"fits": report, "held_out": held, "knee_errors": lv.knee_errors(knees), "knee_starts": knees}
(OUT / "results.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
(OUT / "heldout_raw.json").write_text(json.dumps(raw, indent=2, default=str) + "\n")
print("done", file=sys.stderr)
