"""Running the ``advisor`` command as a user does, and reading its one-line refusals (bad input: exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def advisor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL, check=False)


def one_line(p: subprocess.CompletedProcess[str]) -> str:
    """The refusal's one line: exit 2, no traceback, one non-empty line on stderr."""
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr + p.stdout
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]
