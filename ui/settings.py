"""How the dashboard was started: which database, and whether it may start studies.

``advisor dashboard`` hands the storage URL over in the environment (``ADVISOR_STORAGE``), not on the
command line, so that a PostgreSQL password never shows in ``ps``; ``streamlit run ui/app.py -- --storage
URL`` works too. Pages read ``settings()`` on every run: it is cheap and keeps AppTest (which sets the
environment) and the real server on one code path.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from advisor.job import DEFAULT_STORAGE
from db import redact_url

STORAGE_ENV = "ADVISOR_STORAGE"
ALLOW_ENV = "ADVISOR_ALLOW_NEW_STUDIES"
RUN_DIR_ENV = "ADVISOR_UI_RUN_DIR"
REFRESH_ENV = "ADVISOR_UI_REFRESH_S"


@dataclass(frozen=True)
class Settings:
    storage: str
    allow_new_studies: bool
    #: Where the New study page writes job files and tuner logs.
    run_dir: Path
    #: Seconds between live-progress polls on the Study page.
    refresh_s: float

    @property
    def storage_for_display(self) -> str:
        return redact_url(self.storage)


def _truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def settings(argv: list[str] | None = None) -> Settings:
    """Arguments after ``--`` of ``streamlit run`` win over the environment, which wins over the defaults."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--storage")
    parser.add_argument("--allow-new-studies", action="store_true")
    parser.add_argument("--run-dir")
    args, _ = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    storage = args.storage or os.environ.get(STORAGE_ENV) or DEFAULT_STORAGE
    allow = bool(args.allow_new_studies) or _truthy(os.environ.get(ALLOW_ENV))
    run_dir = Path(args.run_dir or os.environ.get(RUN_DIR_ENV) or "runs/dashboard")
    try:
        refresh = max(0.5, float(os.environ.get(REFRESH_ENV, "3")))
    except ValueError:
        refresh = 3.0
    return Settings(storage=storage, allow_new_studies=allow, run_dir=run_dir, refresh_s=refresh)
