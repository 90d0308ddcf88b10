"""A study resumed where the PostgreSQL driver is not installed (the lent GPU machine has SQLite only).

The outage rule (``db.outage.is_outage``) looked at every database error with ``import psycopg`` first, so on
the H200 a second ``advisor tune`` of a study (Optuna's ``create_study`` meets the existing name, raises
``DuplicatedStudyError`` and loads it) ended in ``ModuleNotFoundError: No module named 'psycopg'`` instead of
resuming (4 Dec). Run in a fresh interpreter that cannot import psycopg.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_RESUME = """
import sys
sys.modules["psycopg"] = None  # import psycopg -> ImportError, as where it is not installed
from advisor.job import load_job
from advisor.study import open_study
job = load_job("examples/gb300-rack.yaml")
url = "sqlite:///" + sys.argv[1]
first = open_study(job, url, "no-driver")
again = open_study(job, url, "no-driver")
print(first.study_name == again.study_name == "no-driver")
"""


def test_a_study_resumes_where_psycopg_is_not_installed(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _RESUME, str(tmp_path / "r.db")], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "True"
