"""Shared fixtures. Keep this small: each test module owns its own fixtures, except real runs that several files
assert on (``tests/shared_runs.py``: one vLLM cold start instead of one per file)."""

from __future__ import annotations

import os

import pytest

from tests.shared_runs import tiny_local_probe  # noqa: F401 — a session fixture, shared by the files that use it


@pytest.fixture(scope="session")
def pg_url() -> str:
    """The PostgreSQL server URL for tests marked ``postgres`` (env ``DEPLOY_ADVISOR_PG_URL``).

    ``scripts/pg_start.sh`` starts a server and prints such a URL. Without it the test is skipped — except under
    ``CI=true``, where it fails: CI always starts PostgreSQL.
    """
    url = os.environ.get("DEPLOY_ADVISOR_PG_URL", "").strip()
    if not url:
        msg = 'DEPLOY_ADVISOR_PG_URL is not set; start PostgreSQL with: export DEPLOY_ADVISOR_PG_URL="$(scripts/pg_start.sh)"'
        if os.environ.get("CI", "").strip().lower() == "true":
            pytest.fail(f"{msg} (CI=true: PostgreSQL tests must run, not skip)")
        pytest.skip(msg)
    return url
