"""Builds summary.json from raw/da-gpu/results.db (the device's results database, latest pack: call 10)
plus the device calls as recorded by hand from the `run` tool's replies. Run: .venv/bin/python make_summary.py"""
import json
import sqlite3
from pathlib import Path

HERE = Path(__file__).resolve().parent
c = sqlite3.connect(HERE / "raw/da-gpu/results.db")
c.row_factory = sqlite3.Row

CALLS = [  # from the run tool's replies (wall_s: the command itself; held_s: lease after the call)
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

ORDER = {0: [263, 229, 173, "173 (remeasured)", 99], 1: [99, 86, 65, "65 (remeasured)", 37],
         2: [99, 86, 65, 37], 3: [263, 229, 173, 99]}  # from the mtimes of raw/da-runs/*/bench/c*.json
WARMUP = {0: 263, 1: 99, 2: 99, 3: 263}
for tr in trials:
    tr["measurement_order"] = ORDER[tr["number"]]
    tr["warmup_concurrency"] = WARMUP[tr["number"]]

by = {t["number"]: t for t in trials}
search = [by[1]["objective_throughput_per_gpu"], by[2]["objective_throughput_per_gpu"]]
base = [by[0]["objective_throughput_per_gpu"], by[3]["objective_throughput_per_gpu"]]
c99s = [lv["throughput_per_gpu"] for n in (1, 2) for lv in by[n]["levels"] if lv["concurrency"] == 99]
c99b = [lv["throughput_per_gpu"] for n in (0, 3) for lv in by[n]["levels"] if lv["concurrency"] == 99]
mean = lambda xs: sum(xs) / len(xs)

summary = {
    "study": "h200-knee-30b", "job": "benchmarks/gpu/h200-knee-30b.yaml",
    "model": "benchmarks/gpu/models/qwen3-moe-30b (dummy weights; 55.77 GiB loaded per vLLM)",
    "gpu": "1 x NVIDIA H200 (device kind nvidia-h200)", "engine": "vLLM 0.26.0, Ray executor, vllm bench serve",
    "date": "2026-12-01",
    "slos": ["p90_ttft_ms <= 2000", "p90_tokens_per_s_per_user >= 30", "error_rate <= 0.01"],
    "device_seconds_used": DEVICE_S, "device_budget_s": 1800,
    "calls": CALLS,
    "trials": trials,
    "deploy_times": {
        "cold_first_deploy_s": by[0]["deploy_s"],
        "later_deploys_s": {n: by[n]["deploy_s"] for n in (1, 2, 3)},
        "note": ("trial 0: fresh machine, torch.compile of range (1, 8192) 18.6 s + Dynamo 11.7 s, graph capture 29 s, "
                 "engine init 84.6 s; trial 1: new config (range (1, 2048)) compiled again (15.2 s + Dynamo 15.2 s), engine "
                 "init 68.7 s; trials 2 and 3: compiled graphs loaded from /tmp/da-runs/.../vllm-cache (engine init "
                 "32.7 s / 23.7 s). Warm-cache deploys (same config seen before): 95.0 s and 81.8 s vs 171.0 s cold."),
    },
    "gain": {
        "advisor_definition": ("advisor best prints no 'vs vLLM's defaults' line: verdict.runs_by_deployment drops trials "
                               "with violation > 0, and both baseline runs (0, 3) violate the SLOs at every measured "
                               "level, so the gain under the SLOs is undefined for this study."),
        "stored_objective_ratio_mean": mean(search) / mean(base),
        "stored_objective_ratio_range": [min(search) / max(base), max(search) / min(base)],
        "stored_objective_note": ("search best (trials 1, 2: s64/b2k, knee c=37, meets SLOs) over the baseline's stored "
                                  "value (trials 0, 3: s1024/b8k at c=99, p90 tok/s/user 28.6/28.7 < 30, i.e. NOT at "
                                  "the SLOs); < 1 means the search deployment delivers less tok/s/GPU."),
        "same_concurrency_c99_ratio_mean": mean(c99s) / mean(c99b),
        "same_concurrency_c99_ratio_range": [min(c99s) / max(c99b), max(c99s) / min(c99b)],
        "search_runs": search, "baseline_runs": base,
    },
    "model_error_advisor": "performance model: 138% mean error on the last 2 trial(s) (predicted 26,918.6 vs 11,331.3 / 11,267.8)",
    "calibration": {
        "advisor_calibrate": json.loads((HERE / "perf-params-h200-knee.report.json").read_text())["error_before"] | {
            "after": json.loads((HERE / "perf-params-h200-knee.report.json").read_text())["error_after"],
            "note": "every level unpredicted (load_levels: [] -> predict() returns no level) -> counted as 10x miss "
                    "(900%); nothing fitted; see calibrate.txt"},
        "measured_levels_workaround": json.loads(
            (HERE / "perf-params-h200-knee-measured-levels.report.json").read_text()) | {"params": "see perf-params-h200-knee-measured-levels.json"},
    },
}
(HERE / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(json.dumps(summary["gain"], indent=1))
for tr in trials:
    print(tr["number"], tr["by"], tr["repeat_of"], tr["knee"], tr["slo_meeting_levels"], tr["predicted"])
