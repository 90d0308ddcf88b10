"""Both fits' as-sent errors on the probe levels, including the c = 256 decode probes (b) never saw."""
import json
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import level_views as lv
from level_views import pc, db, Problem
from executors.perf import PerfParams, default_params
OUT = Path(__file__).resolve().parent
job = lv.load_job(str(OUT / "work/r7/job.yaml"))
levels = pc.ProbeLevels(job, db.connect(job.storage))
sets = {"defaults": default_params(job.cluster.gpu),
        "fit as sent": PerfParams.load(str(OUT / "fit-as-sent.json")),
        "fit as sent no c256": PerfParams.load(str(OUT / "fit-as-sent-no-c256.json"))}
res = {}
for lvl in ("L12/decode/2048/c256", "L3/decode/2048/c256"):
    lvobj = [x for x in levels.levels if pc.level_name(x) == lvl]
    only = pc.ProbeLevels(job, None, lvobj)
    prob = Problem(only.samples(), as_sent=True)
    for n, p in sets.items():
        e = prob.errors(p)
        res[f"{lvl} | {n}"] = {"median": e.overall, **e.per_metric}
        print(lvl, n, {k: (round(v, 3) if v is not None else None) for k, v in res[f"{lvl} | {n}"].items()})
    print("  measured", lvobj[0]["values"])
allp = Problem(levels.samples(frozenset(lv.STALLED_30B)), as_sent=True)
for n, p in sets.items():
    e = allp.errors(p)
    res[f"13 probes (stalled out) | {n}"] = {"median": e.overall, **e.per_metric}
    print("13 probes", n, round(e.overall, 3))
(OUT / "probe_check.json").write_text(json.dumps(res, indent=2) + "\n")
