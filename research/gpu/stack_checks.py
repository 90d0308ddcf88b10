"""Issue 29's held-out stack checks of one GPU session, read again here: each check's measured levels predicted by
the stored profile, the GPU kind's defaults and any refit, in both level views; the spread of checks run twice;
and how each parameter set orders the batch sizes measured at one depth and load.

A stack check (``profile_check.py stack``) deploys the profiled shape at a depth the profile did not measure and
writes its predictions before it deploys; this script predicts the same levels again with
``profile_check.py stack --measured-from`` (nothing deployed), so a refit made afterwards — the profile's probes
fitted without some levels — is held to the same levels, and a fix of how the check predicts (6 Dec: the first
wave left out of the as-sent prediction, as the bench parser leaves it out of the measurement) is applied to
checks already run. The parameters come from files (the profile's parameter file, refits), never from the levels.

    python research/gpu/stack_checks.py research/results/h100-qwen3-profile \\
        --job research/gpu/h200-profile-qwen3-235b.yaml --gpu H100 \\
        --params profile=profile-qwen3-235b.json --params single-prompt=refit-as-sent-single-prompt-prefill.json

writes FOLDER/stack_checks.{json,csv} and prints the tables. Checks named ``…-repeat.json`` are the same
deployment and levels as the check without the suffix, deployed again.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import subprocess
import sys
import tempfile
from itertools import combinations
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
METRICS = ("throughput_per_gpu", "p50_ttft_ms", "p50_tpot_ms", "p90_ttft_ms", "p90_tokens_per_s_per_user")
VIEWS = ("as-sent", "steady")


def config_of(check: dict[str, Any], name: str) -> str | None:
    """The check's batch sizes: recorded in the check since 6 Dec; before, only in the file's name (``-128x2048``),
    and a name without them is the profile's own (None)."""
    if check.get("config"):
        return check["config"]
    m = re.search(r"-(\d+x\d+)", name)
    return m.group(1) if m else None


def repredict(job: Path, check: Path, cfg: str | None, params: list[str], as_sent: bool, out: Path) -> dict[str, Any]:
    """``profile_check.py stack --measured-from``: the check's levels predicted by each parameter set."""
    args = [sys.executable, str(ROOT / "research/gpu/profile_check.py"), "stack", str(job), "--measured-from",
            str(check), "--out", str(out), *(["--config", cfg] if cfg else []), *(["--as-sent"] if as_sent else []),
            *[a for p in params for a in ("--params", p)]]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL, cwd=out.parent)
    if r.returncode != 0:
        raise SystemExit(f"profile_check.py stack failed on {check.name}:\n{r.stderr[-3000:]}")
    return json.loads(out.read_text())


def spread(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> dict[str, float]:
    """Largest |a / b - 1| per metric over the loads both measured: how far one deployment's second run read."""
    return {k: max(abs(a[c][k] / b[c][k] - 1) for c in a if c in b and a[c].get(k) and b[c].get(k)) for k in METRICS}


def orders(groups: dict[str, dict[str, dict[str, float]]], metric: str, load: str) -> str:
    """The configurations from the highest to the lowest value of ``metric`` at ``load``."""
    return " > ".join(sorted(groups, key=lambda cfg: -groups[cfg][load][metric]))


def mean_levels(runs: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    return {c: {k: statistics.fmean(r[c][k] for r in runs) for k in METRICS} for c in runs[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path)
    ap.add_argument("--job", type=Path, required=True, help="the profile's job (its model shape and workload)")
    ap.add_argument("--gpu", required=True, help="the GPU kind the checks ran on (the job's is rewritten to it)")
    ap.add_argument("--params", action="append", default=[], metavar="NAME=FILE",
                    help="a parameter file in FOLDER (or a path): the profile's, a refit")
    a = ap.parse_args()
    folder = a.folder.resolve()
    params = [f"{n}={(folder / f) if (folder / f).exists() else Path(f).resolve()}"
              for n, _, f in (p.partition("=") for p in a.params)]
    checks = sorted(p for p in folder.glob("check-*.json"))
    if not checks:
        raise SystemExit(f"no check-*.json in {folder}")
    rows: list[dict[str, Any]] = []
    measured: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        doc = yaml.safe_load(a.job.read_text())
        doc["cluster"]["gpu"] = a.gpu
        doc["storage"] = f"sqlite:///{Path(tmp) / 'none.db'}"  # no stored profile: every set comes as a file
        doc["executor"]["run_dir"] = str(Path(tmp) / "runs")
        job = Path(tmp) / "job.yaml"
        job.write_text(yaml.safe_dump(doc))
        for path in checks:
            check = json.loads(path.read_text())
            cfg = config_of(check, path.name)
            measured[path.stem] = {"depth": check["depth"], "config": cfg or "profile's", "levels": check["measured"]}
            # what was predicted on the device before the deploy (its errors are the check's own)
            for name, e in check["errors"].items():
                rows.append({"check": path.stem, "set": name, "view": f"{check['level_model']}, on the device",
                             **{k: e.get(k) for k in ("median", "n", *METRICS)}})
            for view in VIEWS:
                res = repredict(job, path, cfg, params, view == "as-sent", Path(tmp) / f"{path.stem}-{view}.json")
                for name, e in res["errors"].items():
                    rows.append({"check": path.stem, "set": name, "view": view,
                                 **{k: e.get(k) for k in ("median", "n", *METRICS)}})
                measured[path.stem].setdefault("predicted", {})[view] = res["predicted"]
    sets = sorted({r["set"] for r in rows}, key=lambda s: (s != "profile", s))
    views = list(dict.fromkeys(r["view"] for r in rows))
    summary = {v: {s: statistics.median(r["median"] for r in rows if r["view"] == v and r["set"] == s)
                   for s in sets if any(r["view"] == v and r["set"] == s for r in rows)} for v in views}
    per_metric = {v: {s: {k: statistics.median(r[k] for r in rows if r["view"] == v and r["set"] == s
                                               and r[k] is not None) for k in METRICS}
                      for s in summary[v]} for v in views}
    repeats = {stem: spread(measured[stem]["levels"], measured[stem.removesuffix("-repeat")]["levels"])
               for stem in measured if stem.endswith("-repeat") and stem.removesuffix("-repeat") in measured}
    # configurations measured at one depth and the same loads: their order, measured (repeats averaged) and predicted
    ranking: list[dict[str, Any]] = []
    by_place: dict[tuple[int, str], dict[str, list[str]]] = {}
    for stem, m in measured.items():
        key = (m["depth"], ",".join(sorted(m["levels"], key=int)))
        by_place.setdefault(key, {}).setdefault(m["config"], []).append(stem)
    for (depth, _), cfgs in sorted(by_place.items()):
        if len(cfgs) < 2:
            continue
        meas = {cfg: mean_levels([measured[s]["levels"] for s in stems]) for cfg, stems in cfgs.items()}
        for load in sorted(next(iter(meas.values())), key=int):
            for metric in ("throughput_per_gpu", "p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms"):
                row = {"depth": depth, "load": int(load), "metric": metric, "measured": orders(meas, metric, load),
                       "measured values": {cfg: round(v[load][metric], 2) for cfg, v in meas.items()},
                       "closest pair": min(abs(meas[x][load][metric] / meas[y][load][metric] - 1)
                                           for x, y in combinations(meas, 2))}
                for view in VIEWS:
                    for s in sets:
                        pred = {cfg: {load: measured[stems[0]]["predicted"][view][s][load]} for cfg, stems in
                                cfgs.items()}
                        row[f"{s}, {view}"] = orders(pred, metric, load)
                ranking.append(row)
    result = {"folder": str(a.folder), "gpu": a.gpu, "params": a.params, "checks": measured, "errors": rows,
              "summary": summary, "per_metric": per_metric, "repeats": repeats, "ranking": ranking}
    (folder / "stack_checks.json").write_text(json.dumps(result, indent=2) + "\n")
    with (folder / "stack_checks.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["check", "set", "view", "median", "n", *METRICS])
        w.writeheader()
        w.writerows(rows)
    print("median |predicted / measured - 1| over each check's values (5 metrics x its loads)\n")
    print("| check | depth | batch sizes | " + " | ".join(f"{s}, {v}" for v in views for s in sets
                                                          if s in summary[v]) + " |")
    for stem, m in measured.items():
        cells = []
        for v in views:
            for s in sets:
                if s in summary[v]:
                    e = next((r["median"] for r in rows if r["check"] == stem and r["set"] == s and r["view"] == v),
                             None)
                    cells.append("–" if e is None else f"{e:.1%}")
        print(f"| {stem} | {m['depth']} | {m['config']} | " + " | ".join(cells) + " |")
    print("| **median of the checks** | | | " + " | ".join(f"**{summary[v][s]:.1%}**" for v in views for s in sets
                                                         if s in summary[v]) + " |")
    print("\nper metric, the median over the checks")
    for v in views:
        for s_ in per_metric[v]:
            print(f"  {s_}, {v}: " + ", ".join(f"{k} {e:.1%}" for k, e in per_metric[v][s_].items()))
    print("\nrepeats: largest |second run / first - 1| over the loads")
    for stem, sp in repeats.items():
        print(f"  {stem}: " + ", ".join(f"{k} {v:.2%}" for k, v in sp.items()))
    print("\norder of the batch sizes (highest first)")
    for r in ranking:
        print(f"  L{r['depth']} c={r['load']} {r['metric']}: measured {r['measured']} (closest pair "
              f"{r['closest pair']:.1%}); " + "; ".join(f"{k}: {v}" for k, v in r.items() if ", " in k))
    print(f"\nwrote {folder / 'stack_checks.json'} and {folder / 'stack_checks.csv'}")


if __name__ == "__main__":
    main()
