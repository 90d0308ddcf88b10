"""``benchmarks/knee_noise.py``'s parts that need no server: its settings are valid workloads that differ where they
say, its counts and spreads, and bad arguments are one line (the measurement itself needs real vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks import knee_noise
from search_spaces import Workload

ROOT = Path(__file__).resolve().parents[1]


def test_each_setting_is_a_valid_workload_with_its_start_and_length() -> None:
    for name, setting in knee_noise.SETTINGS.items():
        wl = Workload.model_validate({**knee_noise.BASE_WORKLOAD, **setting})
        assert wl.level_start == name.split("-")[0]
        assert wl.prompts_per_concurrency == float(name.split("-")[1].rstrip("c"))


def test_prompts_sent_count_every_new_run_once(tmp_path: Path) -> None:
    (tmp_path / "warmup-c4.json").write_text(json.dumps({"num_prompts": 8}))
    (tmp_path / "c4.json").write_text(json.dumps({"completed": 7, "failed": 1}))
    seen: set[Path] = set()
    assert knee_noise.sent(tmp_path, seen) == (2, 16)
    (tmp_path / "c5.json").write_text(json.dumps({"num_prompts": 10}))
    assert knee_noise.sent(tmp_path, seen) == (1, 10)


def test_spread_is_max_over_min() -> None:
    assert knee_noise.spread([4, 5, 4]) == 0.25
    assert knee_noise.spread([4]) is None and knee_noise.spread([0, 4]) is None


def test_bad_arguments_are_one_line_and_exit_2() -> None:
    r = subprocess.run([sys.executable, "benchmarks/knee_noise.py", "--settings", "sideways"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "sideways" in r.stderr and len(r.stderr.strip().splitlines()) == 1
