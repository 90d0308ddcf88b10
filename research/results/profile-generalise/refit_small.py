"""The small stored cases of research/level_views.py (cpu-pt6, cpu-ci, h200-dsv3) with the profile fit's ridge set.

    python research/results/profile-generalise/refit_small.py 0.05,0.5,1.0 cpu-pt6,cpu-ci,h200-dsv3
"""
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]; sys.path.insert(0, str(ROOT)); sys.path.insert(0, str(ROOT/'research')); sys.path.insert(0, str(ROOT/'research/gpu'))
import level_views as lvw

import advisor.profile as P

out = {}
for ridge in [float(x) for x in sys.argv[1].split(',')]:
    P.PROFILE_RIDGE = ridge
    for case in sys.argv[2].split(','):
        work = Path(tempfile.mkdtemp(prefix=f'p6s-{case}-'))
        r = lvw.CASES[case](work)
        h = r['held_out']['fit as sent | as sent'][r['pooled']]
        f = r['fits']['fit as sent']
        row = {'held': h.get('median'), 'rms_log': h.get('rms_log'), 'probes_held': (f['probes_held_out'] or {}).get('overall'),
               'defaults': r['held_out']['defaults | as sent'][r['pooled']].get('median'),
               'params': {k: round(v, 6) for k, v in f['params'].items() if k in ('mfu_prefill','mfu_decode','attn_eff_prefill','attn_eff_decode','hbm_eff','step_latency_s','eager_layer_latency_s','cpu_step_s')}}
        out[f'{case} ridge {ridge}'] = row
        print(case, ridge, json.dumps(row), flush=True)
Path(__file__).with_name('small-ridges.json').write_text(json.dumps(out, indent=1))
