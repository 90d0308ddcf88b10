"""The real-GPU study (1 × H200): run where GPUs are, and the recorded results the docs cite.

The study itself needs an NVIDIA GPU and vLLM's GPU build; it is marked ``gpu`` and skipped elsewhere (CI).
What it recorded on the lent H200 lives in ``research/results/h200/``; the second test checks that those
files say what docs/benchmarks.md says they say (3 levels per trial, the best-under-SLO ratio recomputed).
"""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import db
from db import queries

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "research" / "results" / "h200"


def _has_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and subprocess.run(
        ["nvidia-smi", "-L"], capture_output=True).returncode == 0


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU and the GPU build of vLLM")
def test_h200_defaults_deployment_is_measured_at_three_levels(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'gpu.db'}"
    job = ROOT / "research/gpu/h200-qwen3-small-defaults.yaml"
    r = subprocess.run([sys.executable, "-m", "advisor", "tune", str(job), "--storage", url], cwd=ROOT,
                       capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stdout + r.stderr
    database = db.connect(url)
    try:
        t = queries.get_trial(database, "h200-qwen3-small-defaults", 0)
    finally:
        database.close()
    assert t is not None and t.state.value == "complete", t
    assert [m.concurrency for m in t.measurements] == [16, 64, 256]
    assert all(m.source == "measured" and m.p90_tpot_ms for m in t.measurements)


def test_recorded_h200_results_match_what_the_docs_cite() -> None:
    rows = list(csv.DictReader((RESULTS / "levels.csv").open()))
    summary = json.loads((RESULTS / "summary.json").read_text())
    trials = {(r["study"], r["trial"]) for r in rows}
    assert len(trials) == 5 and all(sum((r["study"], r["trial"]) == t for r in rows) == 3 for t in trials)
    assert all(r["p90_tpot_ms"] and float(r["p90_tokens_per_s_per_user"]) > 0 for r in rows)  # re-read TPOT

    def best(studies: set[str]) -> float:
        return max(float(r["throughput_per_gpu"]) for r in rows if r["study"] in studies and r["meets_slos"] == "True")

    default = best({"h200-qwen3-small-defaults"})
    tuned = best({"h200-qwen3-small", "h200-qwen3-small-defaults"})
    assert summary["tuned_over_default"] == pytest.approx(tuned / default)
    assert round(tuned) == 83810 and round(default) == 73784  # the figures docs/benchmarks.md quotes
    cal = summary["calibration"]
    assert cal["error_after"]["held_out"]["overall"] < cal["error_before"]["held_out"]["overall"]
    from executors.perf import PerfParams

    PerfParams.load(RESULTS / "perf-params-h200.json")


def test_recorded_2x_h200_results_match_what_the_docs_cite() -> None:
    """research/results/h200x2/: 5 deployments × 3 levels, the comparisons docs/benchmarks.md draws from them
    recomputed from the levels, and the EPLB runs' balancedness as today's parser reads EPLB's own log lines."""
    res = ROOT / "research" / "results" / "h200x2"
    rows = list(csv.DictReader((res / "levels.csv").open()))
    by: dict[str, dict[int, dict[str, str]]] = {}
    for r in rows:
        by.setdefault(r["study"], {})[int(r["concurrency"])] = r
    assert len(by) == 5 and all(sorted(levels) == [16, 64, 256] for levels in by.values())

    def tput(study: str, c: int = 64) -> float:
        return float(by[study][c]["throughput_per_gpu"])

    assert tput("h200x2-2xdp1") / tput("h200x2-dep2") == pytest.approx(1.65, abs=0.005)  # small instances win
    best = {s: max(float(r["throughput_per_gpu"]) for r in lv.values() if r["meets_slos"] == "True")
            for s, lv in by.items()}
    assert max(best, key=best.get) == "h200x2-pd-1p1d" and round(best["h200x2-pd-1p1d"]) == 51384
    assert best["h200x2-dep2-eplb2"] < best["h200x2-dep2-eplb0"] < best["h200x2-dep2"]  # EPLB did not pay here
    kv = [float(by["h200x2-pd-1p1d"][c]["kv_transfer_tokens"]) for c in (16, 64, 256)]
    assert kv == sorted(kv) and kv[0] > 0  # the decode instance took prompt KV by NIXL at every level
    cal = json.loads((res / "perf-params-h200x2.report.json").read_text())
    assert cal["error_after"]["held_out"]["overall"] < 0.2 < cal["error_before"]["held_out"]["overall"]
    summary = json.loads((res / "summary.json").read_text())
    assert summary["distinct_deployments"] == 5 and summary["device_seconds"] == 1685.0
