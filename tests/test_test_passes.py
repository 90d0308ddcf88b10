"""``scripts/test.sh`` runs the tests in two passes split by marker: the second selects ``REAL``, the first its
complement, so a test runs in exactly one — but a marker for something heavy that ``REAL`` does not name would
run beside other tests, two at a time. Every marker the project declares is in ``REAL``."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _real() -> set[str]:
    (expr,) = re.findall(r'^REAL="([^"]+)"$', (ROOT / "scripts" / "test.sh").read_text(), flags=re.MULTILINE)
    return {m.strip() for m in expr.split(" or ")}


def test_every_declared_marker_runs_in_the_one_at_a_time_pass() -> None:
    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {m.split(":")[0].strip() for m in ini["markers"]}
    assert _real() == declared


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / "scripts" / "test.sh"), *args], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
                          env={"PATH": "/usr/bin:/bin", "DEPLOY_ADVISOR_TEST_WORKERS": "1"})


def test_a_selection_that_one_pass_lacks_passes_and_an_empty_one_fails() -> None:
    one = _run("tests/test_test_passes.py", "-k", "declared_marker")  # pass 1 only: pass 2 collects nothing
    assert one.returncode == 0, one.stdout + one.stderr
    assert "1 passed" in one.stdout and "pass 2 of 2" in one.stdout
    none = _run("tests/test_test_passes.py", "-k", "no_such_test")
    assert none.returncode == 5, none.stdout + none.stderr
    assert "no tests collected (exit 5)" in none.stdout
