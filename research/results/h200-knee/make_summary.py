"""Re-derives this folder's tables from the committed raw results (``raw.tar.xz``): ``trials.csv`` and
``measurements.csv`` (the ``trials`` and ``measurements`` queries of ``advisor query``, on the columns committed
then), and the derived parts of ``summary.json`` — per trial its levels, knee, SLO-meeting levels, prediction,
warm-up level and measurement order (from the ``date`` of each saved ``vllm bench serve`` JSON), the deploy times
and the gain figures. The rest of ``summary.json`` is a record, not a derivation: the device calls (from the
``run`` tool's replies, ``CALLS`` below), the notes, and the calibration block (``calibrate.txt``); see NOTES.md.

    .venv/bin/python research/results/h200-knee/make_summary.py           # rewrite the tables from raw.tar.xz
    .venv/bin/python research/results/h200-knee/make_summary.py --check   # exit 1 where a table differs

``research/tests/test_gpu_results_rederive.py`` runs the check.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import sqlite3
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STUDY = "h200-knee-30b"
#: The columns of trials.csv / measurements.csv as committed (``advisor query`` has gained columns since).
TABLES = ("trials.csv", "measurements.csv")

CALLS = [  # from the run tool's replies, with the paths of the day (wall_s: the command itself; held_s: lease after)
    *[{"call": n, "command": f"bash .gpu/s/run.sh stage {n}", "carry": [f".gpu/c{n}", ".gpu/s"], "timeout_s": 120,
       "rc": 0, "wall_s": w, "warm_at_start": n > 1, "lease_held_s_after": h, "budget_left_s_after": b}
      for n, w, h, b in [(1, 0.8, 32.0, 1768), (2, 0.4, 40.5, 1759), (3, 0.3, 48.4, 1751), (4, 0.3, 56.8, 1743),
                         (5, 0.3, 64.9, 1735), (6, 0.4, 73.6, 1726)]],
    {"call": 7, "command": "export DA_T0=$(date +%s); bash .gpu/s/run.sh stage 7 install >/dev/null 2>&1; "
     "bash benchmarks/gpu/run_h200.sh 150 benchmarks/gpu/h200-knee-30b.yaml; bash benchmarks/gpu/run_h200.sh pack",
     "carry": [".gpu/c7", ".gpu/s", ".whl", ".whl2"], "timeout_s": 600, "rc": 0, "wall_s": 461.6, "warm_at_start": True,
     "lease_held_s_after": 546.9, "budget_left_s_after": 1253, "trials_run": [0],
     "note": "tuner started 16:01:04 UTC with 119 s left to start a trial (install took ~31 s); baseline only"},
    *[{"call": n, "command": "bash benchmarks/gpu/run_h200.sh 200 benchmarks/gpu/h200-knee-30b.yaml; "
       "bash benchmarks/gpu/run_h200.sh pack", "carry": [".gpu/s", ".whl"], "timeout_s": 600, "rc": 0, "wall_s": w,
       "limit_s": lim, "warm_at_start": True, "lease_held_s_after": h, "budget_left_s_after": b, "trials_run": t}
      for n, w, lim, h, b, t in [(8, 374.2, 600, 931.8, 868, [1]), (9, 304.2, 600, 1255.3, 544, [2]),
                                 (10, 293.1, 536, 1561.0, 239, [3])]],
]
DEVICE_S = 1800 - 237  # status after give_back: budget_left_s 237 of 1800


def unpack(dest: Path) -> Path:
    """``raw.tar.xz`` unpacked under ``dest``; returns the ``raw/`` folder."""
    sys.path.insert(0, str(HERE.parents[2]))
    from research.raw import raw_file

    with tarfile.open(raw_file(HERE / "raw.tar.xz")) as tar:
        tar.extractall(dest, filter="data")
    return dest / "raw"


def trial_rows(db_path: Path) -> list[dict[str, Any]]:
    """Per trial: levels with intervals and flags, the knee, the SLO-meeting levels, the model's prediction."""
    c = sqlite3.connect(db_path)
    c.row_factory = sqlite3.Row
    trials = []
    for t in c.execute("select * from advisor_trials order by number"):
        levels = []
        for m in c.execute("select * from advisor_measurements where trial_id=? order by id", (t["id"],)):
            iv = json.loads(m["intervals"] or "{}")
            levels.append({
                "concurrency": m["concurrency"], "purpose": m["purpose"], "num_requests": m["num_requests"],
                "completed": m["completed"], "failed": m["failed"],
                "p90_ttft_ms": m["p90_ttft_ms"], "p90_ttft_ms_interval": iv.get("p90_ttft_ms"),
                "p90_tokens_per_s_per_user": m["p90_tokens_per_s_per_user"],
                "p90_tokens_per_s_per_user_interval": iv.get("p90_tokens_per_s_per_user"),
                "throughput_per_gpu": m["throughput_per_gpu"], "throughput_per_gpu_interval": iv.get("throughput_per_gpu"),
                "prefix_cache_hit_rate": m["prefix_cache_hit_rate"], "achieved_concurrency": m["achieved_concurrency"],
                "preemptions": m["preemptions"], "error_rate": m["error_rate"],
                "meets_slos": (m["p90_ttft_ms"] <= 2000 and m["p90_tokens_per_s_per_user"] >= 30
                               and (m["error_rate"] or 0) <= 0.01),
                "flags": json.loads(m["flags"] or "[]"),
            })
        obj = json.loads(t["objectives"] or "{}")
        knee = [lv for lv in levels if lv["purpose"] == "knee"]
        feas = [lv for lv in levels if lv["meets_slos"]]
        op = knee[0] if knee else None
        trials.append({
            "number": t["number"], "by": t["proposer"], "repeat_of": t["repeat_of"], "state": t["state"],
            "config": t["config_text"], "params": json.loads(t["params"] or "{}"),
            "deploy_s": t["deploy_s"], "warmup_s": t["warmup_s"], "measure_s": t["measure_s"], "teardown_s": t["teardown_s"],
            "started_at": t["started_at"], "finished_at": t["finished_at"],
            "levels_measured": len(levels),
            "measurement_order": None,  # filled below from the bench file times
            "levels": levels,
            "objective_throughput_per_gpu": obj.get("throughput_per_gpu"), "violation": t["violation"],
            "knee": ({"concurrency": op["concurrency"], "throughput_per_gpu": op["throughput_per_gpu"],
                      "p90_ttft_ms": op["p90_ttft_ms"], "p90_tokens_per_s_per_user": op["p90_tokens_per_s_per_user"],
                      "flags": op["flags"]} if op else None),
            "knee_note": (None if op else "no measured level meets the SLOs (no-level-meets-slo): the stored objective is "
                          "the level with the smallest violation, c=%d" % min(levels, key=lambda x: abs(
                              x["throughput_per_gpu"] - obj.get("throughput_per_gpu", 0)))["concurrency"]),
            "slo_meeting_levels": [lv["concurrency"] for lv in feas],
            "predicted": json.loads(t["predicted"] or "null"),
        })
    c.close()
    return trials


def bench_order(raw: Path, db_path: Path) -> dict[int, tuple[int, list[Any]]]:
    """Per trial: (warm-up concurrency, measured levels in the order they ran), from the ``date`` vllm bench
    writes into each saved JSON (a level measured twice: ``cN-2.json``, shown as "N (remeasured)")."""
    c = sqlite3.connect(db_path)
    out = {}
    for number, resources in c.execute("select number, resources from advisor_trials order by number"):
        run = Path(next(iter(json.loads(resources)["log_paths"].values()))).parent.name
        bench = raw / "da-runs" / STUDY / run / "bench"
        runs = [(json.loads(f.read_text())["date"], f.stem) for f in bench.glob("*.json")]
        warm = next(int(s.split("-c")[1]) for _, s in runs if s.startswith("warmup-"))
        order = [int(s[1:]) if "-" not in s else f"{s[1:].split('-')[0]} (remeasured)"
                 for _, s in sorted(runs) if not s.startswith("warmup-")]
        out[number] = (warm, order)
    c.close()
    return out


def derived(raw: Path) -> dict[str, Any]:
    """The parts of summary.json that follow from the raw results."""
    db_path = raw / "da-gpu" / "results.db"
    trials = trial_rows(db_path)
    for tr, (warm, order) in zip(trials, bench_order(raw, db_path).values(), strict=True):
        tr["measurement_order"] = order
        tr["warmup_concurrency"] = warm
    by = {t["number"]: t for t in trials}
    search = [by[1]["objective_throughput_per_gpu"], by[2]["objective_throughput_per_gpu"]]
    base = [by[0]["objective_throughput_per_gpu"], by[3]["objective_throughput_per_gpu"]]
    c99s = [lv["throughput_per_gpu"] for n in (1, 2) for lv in by[n]["levels"] if lv["concurrency"] == 99]
    c99b = [lv["throughput_per_gpu"] for n in (0, 3) for lv in by[n]["levels"] if lv["concurrency"] == 99]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "calls": CALLS, "device_seconds_used": DEVICE_S, "trials": trials,
        "deploy_times": {"cold_first_deploy_s": by[0]["deploy_s"],
                         "later_deploys_s": {str(n): by[n]["deploy_s"] for n in (1, 2, 3)}},
        "gain": {
            "stored_objective_ratio_mean": mean(search) / mean(base),
            "stored_objective_ratio_range": [min(search) / max(base), max(search) / min(base)],
            "same_concurrency_c99_ratio_mean": mean(c99s) / mean(c99b),
            "same_concurrency_c99_ratio_range": [min(c99s) / max(c99b), max(c99s) / min(c99b)],
            "search_runs": search, "baseline_runs": base,
        },
    }


def tables(raw: Path) -> dict[str, str]:
    """trials.csv and measurements.csv as ``advisor query trials|measurements --format csv`` writes them, on the
    committed columns (the query runs on a copy: opening a database may migrate it)."""
    sys.path.insert(0, str(HERE.parents[2]))
    from advisor import api

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        db_copy = Path(tmp) / "results.db"
        shutil.copy(raw / "da-gpu" / "results.db", db_copy)
        for name in TABLES:
            committed = next(csv.reader(io.StringIO((HERE / name).read_text())))
            cols, rows = api.query(f"sqlite:///{db_copy}", name.removesuffix(".csv"), [STUDY])
            buf = io.StringIO()
            w = csv.writer(buf, lineterminator="\n")
            w.writerow(committed)
            w.writerows([[dict(zip(cols, r, strict=True))[c] for c in committed] for r in rows])
            out[name] = buf.getvalue()
    return out


def _merge(summary: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    for k, v in part.items():
        summary[k] = _merge(dict(summary.get(k) or {}), v) if isinstance(v, dict) and k != "later_deploys_s" else v
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 where a table differs")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        raw = unpack(Path(tmp))
        part, csvs = derived(raw), tables(raw)
    summary = json.loads((HERE / "summary.json").read_text())
    new = _merge(json.loads(json.dumps(summary)), json.loads(json.dumps(part)))
    files = {**csvs, "summary.json": json.dumps(new, indent=1)}  # as committed: no final newline
    differ = [n for n, text in files.items() if (HERE / n).read_text() != text]
    if a.check:
        print("\n".join(f"{n}: differs from what raw.tar.xz gives" for n in differ) or "all tables re-derived equal")
        sys.exit(1 if differ else 0)
    for n, text in files.items():
        (HERE / n).write_text(text)
    print(f"rewrote {', '.join(files)} ({len(differ)} changed)")


if __name__ == "__main__":
    main()
