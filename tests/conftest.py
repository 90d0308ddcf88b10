"""Shared fixtures. Keep this small: each test module owns its own fixtures, except real runs that several files
assert on (``tests/shared_runs.py``: one vLLM cold start instead of one per file)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from tests.shared_runs import tiny_local_probe  # noqa: F401 — a session fixture, shared by the files that use it

#: What pytest-xdist's workers get in their environment that the command did not set (seen 6 Dec with
#: pytest-xdist 3.8: COLUMNS=80 and LINES=24 in every worker, None in the command). Rich and our CLI size their
#: output from COLUMNS, so a CLI run in a worker, or a tuner a test starts from it, folded its lines at 80 columns
#: and a test looking for "budget reached" on one line failed only when run two at a time.
TERMINAL_ENV = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """In the command (xdist's controller): hand each worker the command's own terminal variables."""
    node.workerinput["terminal_env"] = {k: os.environ.get(k) for k in TERMINAL_ENV}


#: One vLLM cache folder for the whole run (``executors.vllm.serving.cache_home``): each test deploys from a run
#: folder of its own, and without it every server of the run compiled and inspected the tiny model from nothing.
CACHE_ENV = "DEPLOY_ADVISOR_CACHE_DIR"
_MADE_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """In the command: one vLLM cache folder for the run, unless the caller names one (xdist's workers and the
    processes tests start inherit it). In an xdist worker: the command's terminal variables, as if the tests ran
    in the command itself."""
    given = getattr(config, "workerinput", None)
    if given is None and not os.environ.get(CACHE_ENV):
        os.environ[CACHE_ENV] = config.stash[_MADE_CACHE] = tempfile.mkdtemp(prefix="deploy-advisor-vllm-cache-")
    for k, v in ((given or {}).get("terminal_env") or {}).items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_MADE_CACHE, None)
    if made:
        shutil.rmtree(made, ignore_errors=True)


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
