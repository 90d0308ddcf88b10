"""SIGTERM to ``advisor tune`` ends it with one line saying it was stopped and what the stop left, and exit 143
(128 + SIGTERM, as the CLI's docstring and docs/reliability.md say); Ctrl-C (SIGINT) the same line and exit 130.
The study is left with no trial RUNNING."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from tests.cli_run import advisor


def _trials(path: Path) -> int:
    if not path.exists():
        return 0
    try:  # closed at once: an open reader would hold the tuner's writes up
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=1)) as c:
            return c.execute("SELECT count(*) FROM advisor_trials").fetchall()[0][0]
    except sqlite3.Error:
        return 0


@pytest.mark.parametrize(("sig", "code", "said"), [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_a_signal_ends_tune_with_one_line_and_its_exit_code(tmp_path: Path, sig: signal.Signals, code: int,
                                                            said: str) -> None:
    (tmp_path / "job.yaml").write_text(json.dumps({"name": "stop", "preset": "h200-qwen3-235b",
                                                   "budget": {"trials": 100000}}))
    p = subprocess.Popen([sys.executable, "-m", "advisor", "tune", "job.yaml"], cwd=tmp_path, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                         start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _trials(tmp_path / "advisor.db") < 3:  # trials under way
            time.sleep(0.3)
        os.killpg(p.pid, sig)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == code, (p.returncode, out, err)
    assert "Traceback" not in out + err, err
    last = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert last.startswith(f"error: stopped by {said}: ") and "run the same command again" in last, err
    rows = json.loads(advisor("trials", "stop", "--format", "json", cwd=tmp_path).stdout)
    assert rows and not [r for r in rows if r["state"] == "running"], rows
