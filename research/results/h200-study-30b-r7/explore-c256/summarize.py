import json
import statistics
import sys
from pathlib import Path
OUT = Path(__file__).resolve().parent
sys.path.insert(0, str(OUT.parents[3]))
from research.raw import raw_file  # noqa: E402  (heldout_raw.json is kept in git history, not the tree)
d = json.loads((OUT / "results.json").read_text())
raw = json.loads(raw_file(OUT / "heldout_raw.json").read_text())
com = json.loads((Path(__file__).resolve().parents[2] / "level_views.json").read_text())["h200-30b"]
S = ("r4", "r6", "r7")
def pct(x): return "—" if x is None else f"{100*x:.1f}%"
# true pooled median over every level value of the three studies (not median of medians)
METRICS = None
def pooled(view, name, under):
    es = []
    per = {}
    for r in S:
        out = raw[f"{r} | {view}"]
        for t, tr in out["trials"].items():
            meas, pred = tr["measured"], tr["predicted"][name]
            # knee: as heldout(): max knee-purpose concurrency; not stored, so use levels_to... -> recompute below
            for c, mv in meas.items():
                if under and c not in KNEE_KEYS[(r, t)]:
                    continue
                for k, m in mv.items():
                    p = (pred.get(c) or {}).get(k)
                    if p and m and k in per_keys:
                        e = abs(p / m - 1); es.append(e); per.setdefault(k, []).append(e)
    return statistics.median(es), len(es), {k: statistics.median(v) for k, v in per.items()}
# knee keys: rebuild from the database as heldout does
import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import level_views as lv
from level_views import pc, db
KNEE_KEYS = {}
for r in S:
    job = lv.load_job(str(OUT / "work" / r / "job.yaml"))
    rdb = db.connect(job.storage)
    again = pc.reparsed(str(OUT / "work" / r / "da-runs")) if r == "r4" else (lambda m: m)
    for t in db.queries.list_trials(rdb, f"h200-study-30b-{r}"):
        trial = db.queries.get_trial(rdb, f"h200-study-30b-{r}", t.number)
        if trial is None or trial.config is None or not trial.measurements:
            continue
        ms = [again(m) for m in trial.measurements if m.completed]
        knee = max((m.concurrency for m in ms if m.purpose == "knee"), default=None)
        KNEE_KEYS[(r, str(t.number))] = {f"{m.concurrency:g}{'s' if 'short' in m.flags else ''}" for m in ms
                                         if knee is not None and m.concurrency <= knee}
per_keys = set(pc.METRICS)
names = ["defaults", "stored profile", "fit as sent", "fit as sent no c256"]
lines = []
for view in ("as sent", "steady"):
    lines.append(f"\n### predicted {view}\n")
    lines.append("| parameters | r4 ≤knee | r6 ≤knee | r7 ≤knee | median of studies ≤knee | pooled ≤knee (n) | r4 all | r6 all | r7 all | median of studies all | pooled all (n) |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in names:
        h = d["held_out"][f"{n} | {view}"]
        pu, nu, _ = pooled(view, n, True); pa, na, _ = pooled(view, n, False)
        lines.append(f"| {n} | " + " | ".join(pct(h[f"{r} under the knees"]["median"]) for r in S)
                     + f" | {pct(h['median of studies, under the knees']['median'])} | {pct(pu)} ({nu}) | "
                     + " | ".join(pct(h[f"{r} all levels"]["median"]) for r in S)
                     + f" | {pct(h['median of studies, all levels']['median'])} | {pct(pa)} ({na}) |")
    lines.append("\nper metric, pooled ≤knee (all three studies):\n")
    lines.append("| parameters | " + " | ".join(sorted(per_keys)) + " |")
    lines.append("|---|" + "---|" * len(per_keys))
    for n in names:
        _, _, per = pooled(view, n, True)
        lines.append(f"| {n} | " + " | ".join(pct(per.get(k)) for k in sorted(per_keys)) + " |")
lines.append("\n### check (a) against committed level_views.json (as sent ≤knee r4/r6/r7; fit params)\n")
for view in ("as sent", "steady"):
    c = com["held_out"][f"fit as sent | {view}"]; h = d["held_out"][f"fit as sent | {view}"]
    lines.append(f"{view}: committed " + " / ".join(pct(c[f'{r} under the knees']['median']) for r in S)
                 + " ; here " + " / ".join(pct(h[f'{r} under the knees']['median']) for r in S))
lines.append("\n### fitted parameters (defaults → (a) all probes → (b) no decode c=256)\n")
lines.append("| parameter | default | committed fit as sent | (a) | (b) | (b)/(a) |")
lines.append("|---|---|---|---|---|---|")
fa, fb = d["fits"]["fit as sent"], d["fits"]["fit as sent no c256"]
for k in sorted(set(fa["changes"]) | set(fb["changes"])):
    ca, cb = fa["changes"].get(k, {}), fb["changes"].get(k, {})
    dflt = ca.get("default", cb.get("default"))
    a, b = fa["params"][k], fb["params"][k]
    lines.append(f"| {k} | {dflt:.3g} | {com['fits']['fit as sent']['params'][k]:.4g} | {a:.4g} | {b:.4g} | {b/a:.2f} |")
lines.append("\n### probes' own errors (as sent, median |pred/meas-1|)\n")
lines.append("| fit | probes fitted | dropped | before (defaults) | in sample | held out by family (CV) | CV rms_log |")
lines.append("|---|---|---|---|---|---|---|")
for n, f in d["fits"].items():
    lines.append(f"| {n} | {f['probes_in_sample']['levels']} | {', '.join(f['dropped'])} | {pct(f['probes_before']['overall'])} | "
                 f"{pct(f['probes_in_sample']['overall'])} | {pct((f['probes_held_out'] or {}).get('overall'))} | "
                 f"{(f['probes_held_out'] or {}).get('rms_log', float('nan')):.3f} |")
lines.append("\n### knee starts (r6+r7 trials), median |log(pred knee / measured)|\n")
lines.append("| parameters | steady | as sent |")
lines.append("|---|---|---|")
for n in names:
    ke = d["knee_errors"]
    lines.append(f"| {n} | {ke[f'{n} | steady']['median_abs_log']:.3f} | {ke[f'{n} | as sent']['median_abs_log']:.3f} |")
text = "\n".join(lines)
(OUT / "summary.md").write_text(text + "\n")
print(text)
