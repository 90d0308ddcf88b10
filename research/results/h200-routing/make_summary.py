"""Rebuild summary.json of the one-GPU routing runs (issue 18) from raw.tar.xz: the two result databases the
device calls wrote (call7: real + zipf 1.1, call15: uniform), read through the project's own queries.

    python research/results/h200-routing/make_summary.py [--check]
"""

from __future__ import annotations

import json
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import db  # noqa: E402
from db import queries  # noqa: E402
from research.raw import raw_file  # noqa: E402

STUDIES = {"call7": ["h200-routing-real", "h200-routing-zipf"], "call15": ["h200-routing-uniform"]}
KEEP = ("concurrency", "num_requests", "completed", "throughput_per_gpu", "p50_tpot_ms", "p90_tpot_ms",
        "p90_ttft_ms", "p90_tokens_per_s_per_user", "prefix_cache_hit_rate", "expert_routing", "flags")


def summary() -> dict:
    out: dict = {"gpu": "1 x NVIDIA H200 (device kind nvidia-h200)", "engine": "vLLM 0.26.0 (GPU build), --enforce-eager",
                 "model": "qwen3-moe-small (dummy weights, 64 experts, top-8)", "studies": {}}
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(raw_file(HERE / "raw.tar.xz")) as tar:
            tar.extractall(tmp, filter="data")
        for call, studies in STUDIES.items():
            database = db.connect(f"sqlite:///{Path(tmp) / call / 'da-gpu' / 'results.db'}")
            try:
                for name in studies:
                    levels = []
                    for t in queries.list_trials(database, name):
                        trial = queries.get_trial(database, name, t.number)
                        for m in trial.measurements:
                            row = {k: getattr(m, k) for k in KEEP}
                            row["throughput_per_gpu_95ci"] = (m.intervals or {}).get("throughput_per_gpu")
                            row["flags"] = list(m.flags or [])
                            levels.append(row)
                    out["studies"][name] = {"device_call": call, "levels": levels}
            finally:
                database.close()
    return out


def main() -> int:
    text = json.dumps(summary(), indent=2, default=str) + "\n"
    target = HERE / "summary.json"
    if "--check" in sys.argv:
        same = target.read_text() == text
        print("summary.json matches raw.tar.xz" if same else "summary.json differs from raw.tar.xz")
        return 0 if same else 1
    target.write_text(text)
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
