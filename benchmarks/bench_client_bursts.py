"""Does a level measure the server, or how its tokens reached the client? Levels on a real CPU-vLLM deployment
of the tiny MoE, measured the way the local executor measures them.

A request's tokens "arrive in a burst" when its first token reaches the client with its last (TTFT within 2 ms
of E2E): nobody read the stream while the server produced it, so the TTFT measured is the delivery's, not the
server's. Each repeat deploys the knee test's deployment (max-num-seqs 4) and measures concurrency 1, 4 and 8
(16, 16 and 24 requests) after one warm-up request. Prints a table and writes
``benchmarks/results/bench_client_bursts.json``.

At ea6f3bb this script also ran each level's client forked from a process that had imported vLLM once (the
CPU build's ``bench_zygote``, then the default), taking turns with a fresh ``vllm bench serve``:
``results/bench_client_bursts_zygote_vs_command.json``. The forked client read c=1 median TTFTs of 47-80 ms in
4 of 4 deployments, the command 8.8-12.9 ms; so the zygote was removed and every level is a command again.

    python benchmarks/bench_client_bursts.py [--repeats 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from advisor.executor_factory import make_executor
from advisor.job import job_from_dict
from executors import place
from search_spaces import DeploymentConfig

RESULTS = Path(__file__).parent / "results" / "bench_client_bursts.json"
JOB = {
    "name": "bursts", "preset": "cpu-tiny-moe",
    "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1},
    "workload": {"dataset": "random", "isl": {"mean": 256, "range_ratio": 0.2}, "osl": {"mean": 32, "range_ratio": 0.2},
                 "load_levels": [1, 4, 8], "prompts_per_concurrency": 3, "min_prompts": 16,
                 "warmups_per_concurrency": 1, "max_load": 8, "knee_search": False},
}
CONFIG = {"mode": "aggregated", "decode": {"role": "mixed", "max_num_seqs": 4, "max_num_batched_tokens": 2048}}


def level_rows(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for f in sorted(run_dir.glob("*/*/bench/c*.json")):
        d = json.loads(f.read_text())
        ttft, e2e = d["ttfts"], d["latencies"]
        rows.append({"concurrency": d["max_concurrency"], "requests": len(ttft),
                     "median_ttft_ms": round(1000 * statistics.median(ttft), 1),
                     "median_e2el_ms": round(1000 * statistics.median(e2e), 1),
                     "burst_share": round(sum(b - a < 0.002 for a, b in zip(ttft, e2e)) / len(ttft), 3)})
    return sorted(rows, key=lambda r: r["concurrency"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill` tears the deployment down like Ctrl-C
    cfg = DeploymentConfig.model_validate(CONFIG)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bursts-") as tmp:
        for rep in range(args.repeats):
            run_dir = Path(tmp) / f"repeat-{rep}"
            job = job_from_dict({**JOB, "executor": {"kind": "local", "run_dir": str(run_dir)}})
            ex = make_executor(job)
            try:
                result = ex.evaluate(place(cfg, job.cluster), job.workload)
            finally:
                ex.close()
            if not result.ok:
                print(f"repeat {rep}: {result.failure}: {result.reason}", file=sys.stderr)
                return 1
            for row in level_rows(run_dir):
                runs.append({"repeat": rep, **row})
                print(f"repeat {rep}  c={row['concurrency']}  median TTFT {row['median_ttft_ms']:6.1f} ms"
                      f"  E2E {row['median_e2el_ms']:6.1f} ms  bursts {row['burst_share']:.0%}", flush=True)
    print(f"\n{'c':>2} {'median TTFT ms per repeat':<34} {'median E2E ms per repeat':<34} "
          "bursts (share of requests) per repeat")
    summary = []
    for c in sorted({r["concurrency"] for r in runs}):
        rs = [r for r in runs if r["concurrency"] == c]
        summary.append({"concurrency": c, "median_ttft_ms": [r["median_ttft_ms"] for r in rs],
                        "median_e2el_ms": [r["median_e2el_ms"] for r in rs],
                        "burst_share": [r["burst_share"] for r in rs]})
        ttfts = " ".join(f"{r['median_ttft_ms']:6.1f}" for r in rs)
        e2es = " ".join(f"{r['median_e2el_ms']:6.1f}" for r in rs)
        bursts = " ".join(f"{r['burst_share']:4.0%}" for r in rs)
        print(f"{c:>2} {ttfts:<34} {e2es:<34} {bursts}")
    out = {"command": " ".join(["python", *sys.argv]), "repeats": args.repeats,
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_average_1_5_15_at_end": os.getloadavg()}, "summary": summary, "levels": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
