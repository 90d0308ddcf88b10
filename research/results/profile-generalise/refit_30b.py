"""Re-fits of the stored ~30B H200 profile (3 and 12 layers, as sent) held to the 48-layer studies r4, r6, r7.

    python research/results/profile-generalise/refit_30b.py base,nod1,noeager,ridge0.2,ridge0.5,ridge1.0

Variants (joined by +): base (the probe fit as it was: ridge 0.05), nod1 (the c = 1 decode levels left out),
noeager (eager_layer_latency_s held), ridgeX (the fit's ridge X), only3 / only12 (one depth's probes alone), layer (layer_latency_s fitted too). Writes out-VARIANTS.json beside this file."""
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT/'research')); sys.path.insert(0, str(ROOT/'research/gpu'))
import level_views as lvw
import profile_check as pc

import db
from advisor.calibrate import calibrate
from advisor.profile import STEP_PARAMS
from executors.perf import default_params

VARIANTS = sys.argv[1].split(',')
work = Path(tempfile.mkdtemp(prefix='p6-'))
dbs = {}
for r in lvw.STUDIES_30B:
    lvw.unpack(lvw.RESULTS / f"h200-study-30b-{r}" / "raw.tar.xz", work / r)
    dbs[r] = lvw.job_at(ROOT / "research/gpu/h200-study-30b.yaml", work / r / "da-gpu/results.db", work / r / "runs", work / r / "job.yaml")
job = dbs['r7']; database = db.connect(job.storage)
levels = pc.ProbeLevels(job, database)
names_all = sorted(pc.level_name(lv) for lv in levels.levels)
print(names_all, flush=True)
def drop_for(v):
    d = set(lvw.STALLED_30B)
    if 'nod1' in v: d |= {n for n in names_all if '/decode/' in n and n.endswith('/c1')}
    if 'nop1' in v:
        fams = {}
        for n in names_all:
            L, k, isl, c = n.split('/'); fams.setdefault((L, k, isl), []).append(c)
        d |= {n for n in names_all if '/prefill/' in n and n.endswith('/c1') and len(fams[tuple(n.split('/')[:3])]) > 1}
    for keep in ('only3', 'only12'):
        if keep in v:
            d |= {n for n in names_all if not n.startswith(f'L{keep[4:]}/')}
    return frozenset(d)
out = {}
for v in VARIANTS:
    t0 = time.monotonic()
    names = list(STEP_PARAMS)
    if 'noeager' in v: names.remove('eager_layer_latency_s')
    if 'layer' in v.split('+'): names.append('layer_latency_s')
    ridge = [float(x[5:]) for x in v.split('+') if x.startswith('ridge')] or [0.05]
    cal = calibrate(levels.samples(drop_for(v)), start=default_params(job.cluster.gpu), names=names, as_sent=True,
                    ridge=ridge[0])
    sets = {'profile': (cal.params, v)}
    res = {'fit_s': round(time.monotonic() - t0), 'params': {n: getattr(cal.params, n) for n in names},
           'probes_in': cal.to_dict()['error_after']['in_sample']['overall'],
           'probes_held': (cal.to_dict()['error_after'].get('held_out') or {}).get('overall')}
    for r, rjob in dbs.items():
        rdb = db.connect(rjob.storage)
        again = pc.reparsed(str(work / r / "da-runs")) if r == "r4" else (lambda m: m)
        h = pc.heldout(rjob, sets, rdb, f"h200-study-30b-{r}", again, True)
        res[f'{r} under knee'] = h['pooled_under_knee']['profile']['median']
        if r != 'r4':
            ks = lvw.knee_starts(rjob, rdb, f"h200-study-30b-{r}", {'p': (cal.params, v)})
            res[f'{r} knees'] = [(k['knee'], k['p | as sent']) for k in ks]
    e = [abs(math.log(p / k)) for r in ('r6', 'r7') for k, p in res[f'{r} knees'] if p]
    res['knee_median_abs_log'] = sorted(e)[len(e)//2]
    out[v] = res
    print(v, json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in res.items() if 'knees' not in k}), flush=True)
Path(__file__).with_name(f'out-{"_".join(VARIANTS)}.json').write_text(json.dumps(out, indent=1, default=str))
