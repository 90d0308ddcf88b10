"""The committed stack checks of a GPU session predicted again here (``research/gpu/stack_checks.py`` over copies:
nothing deployed), for the tests that hold a session's figures to what the docs say of them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "research/gpu/h200-profile-qwen3-235b.yaml"


def stack_checks_again(work: Path, files: list[Path], params: dict[str, str], gpu: str = "H100",
                       job: Path = JOB) -> dict:
    """``files`` (the checks, and parameter files named by their base name in ``params``) copied to ``work``, then
    stack_checks.py there; its ``stack_checks.json``."""
    for f in files:
        shutil.copy(f, work / f.name)
    args = [sys.executable, str(ROOT / "research/gpu/stack_checks.py"), str(work), "--job", str(job), "--gpu", gpu,
            *[a for name, f in params.items() for a in ("--params", f"{name}={f}")]]
    r = subprocess.run(args, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL, cwd=work)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((work / "stack_checks.json").read_text())


def assert_as_committed(again: dict, committed: Path) -> None:
    """Every check's median error per parameter set and view is the committed ``stack_checks.json``'s."""
    want = json.loads(committed.read_text())
    key = lambda r: (r["check"], r["set"], r["view"])  # noqa: E731
    got = {key(r): r["median"] for r in again["errors"]}
    assert set(got) == {key(r) for r in want["errors"]}
    for r in want["errors"]:
        assert got[key(r)] == pytest.approx(r["median"], rel=1e-6), key(r)
