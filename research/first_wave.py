"""What a level's first wave did to the SLOs of recorded real studies: every level judged twice, on vLLM's
whole-run numbers (the rule before) and on the requests after the first wave (``bench_result.first_wave``, now).

For every deployment folder under FOLDER (``*/bench/c*.json``, per-request timings from ``--save-detailed``) it
re-parses each level — a close call's two runs (``cN.json`` and ``cN-2.json``) pooled as the tuner pools them —
and prints per level P90 TTFT and P90 tokens/s per user both ways, the first wave's own P90 TTFT, and whether
the level met the job's SLOs both ways; per deployment, the knee (the highest measured level meeting every SLO)
both ways, "≥" where the highest measured level met them. Rows and summary go to ``--out`` as JSON.

The default is the H200 study r4 of 4 Dec (the ~30B MoE on one H200, 2 × c prompts per level; its raw.tar.xz
unpacked into /tmp/r4), judged with that job's SLOs (P90 TTFT ≤ 2 s, P90 ≥ 30 tokens/s per user):

    python research/first_wave.py [FOLDER] [--out research/results/h200-study-30b-r4/first_wave.json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from executors.measuring.bench_result import (  # noqa: E402
    latency_summary, parse_result, per_request_tpot_ms, percentile, pool_results)

DEFAULT_FOLDER = Path("/tmp/r4/da-runs/h200-study-30b")
DEFAULT_OUT = ROOT / "research" / "results" / "h200-study-30b-r4" / "first_wave.json"
TTFT_MS, SPEED = 2000.0, 30.0  # the study's SLOs: P90 TTFT ≤ 2 s, P90 tokens/s per user ≥ 30
CONFIG = re.compile(r"'(max_num_seqs|max_num_batched_tokens|performance_mode)': '?(\w+)")


def _config(folder: Path) -> str:
    """max-num-seqs / max-num-batched-tokens (and the performance mode when set) from vLLM's own log."""
    log = next(folder.glob("mixed-0.log"), None)
    found = dict(CONFIG.findall(log.read_text(errors="replace"))) if log else {}
    text = f"{found.get('max_num_seqs', 'default')} / {found.get('max_num_batched_tokens', 'default')}"
    return text + (f" {found['performance_mode']}" if "performance_mode" in found else "")


def _speed(tpots: list[float]) -> float | None:
    t = percentile(tpots, 90)
    return 1000.0 / t if t else None


def level(folder: Path, c: int) -> dict[str, Any]:
    data = json.loads((folder / "bench" / f"c{c}.json").read_text())
    again = folder / "bench" / f"c{c}-2.json"
    if again.exists():
        data = pool_results(data, json.loads(again.read_text()))
    m = parse_result(data, concurrency=c, gpus=1)
    before = {"p90_ttft_ms": latency_summary(data)["p90_ttft_ms"], "p90_speed": _speed(per_request_tpot_ms(data))}
    after = {"p90_ttft_ms": m.p90_ttft_ms, "p90_speed": m.p90_tokens_per_s_per_user}
    met = {k: v["p90_ttft_ms"] is not None and v["p90_ttft_ms"] <= TTFT_MS and v["p90_speed"] is not None
           and v["p90_speed"] >= SPEED for k, v in (("before", before), ("after", after))}
    return {"concurrency": c, "runs": 2 if again.exists() else 1, "before": before, "after": after,
            "first_wave_p90_ttft_ms": (m.raw.get("first_wave") or {}).get("p90_ttft_ms"), "met": met}


def deployment(folder: Path) -> dict[str, Any]:
    loads = sorted({int(p.stem[1:]) for p in (folder / "bench").glob("c*.json") if re.fullmatch(r"c\d+", p.stem)})
    rows = [level(folder, c) for c in loads]
    knees = {}
    for rule in ("before", "after"):
        met = [r["concurrency"] for r in rows if r["met"][rule]]
        top = max(met) if met else None
        knees[rule] = None if top is None else (f"≥ {top}" if top == max(loads) else str(top))
    return {"deployment": folder.name, "config": _config(folder), "levels": rows, "knee": knees}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", type=Path, default=DEFAULT_FOLDER)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    deps = [deployment(d) for d in sorted(p for p in args.folder.iterdir() if (p / "bench").is_dir())]
    print("| deployment | config | c | P90 TTFT ms: whole run | first wave | after it | P90 tok/s/user: whole | "
          "after | met: before | after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for d in deps:
        for r in d["levels"]:
            b, a = r["before"], r["after"]
            print(f"| {d['deployment']} | {d['config']} | {r['concurrency']}{' R' if r['runs'] == 2 else ''} | "
                  f"{b['p90_ttft_ms']:.0f} | {r['first_wave_p90_ttft_ms'] or 0:.0f} | {a['p90_ttft_ms']:.0f} | "
                  f"{b['p90_speed']:.1f} | {a['p90_speed']:.1f} | {'+' if r['met']['before'] else '−'} | "
                  f"{'+' if r['met']['after'] else '−'} |")
    print("\n| deployment | config | knee before | knee after |\n|---|---|---|---|")
    for d in deps:
        print(f"| {d['deployment']} | {d['config']} | {d['knee']['before']} | {d['knee']['after']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"folder": str(args.folder), "slos": {"p90_ttft_ms": TTFT_MS,
                                    "p90_tokens_per_s_per_user": SPEED}, "deployments": deps}, indent=1) + "\n")
    print(f"\n{args.out}")


if __name__ == "__main__":
    main()
