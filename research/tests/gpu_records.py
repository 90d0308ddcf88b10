"""A committed H200 study read back: its raw.tar.xz unpacked, its trials through the project's own queries, the docs
page and the profile's held-out errors beside it (the r3, r4 and r5 study tests hold the docs to these)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

import db
from db import queries
from research.raw import RawUnavailable, raw_file

ROOT = Path(__file__).resolve().parents[2]
#: Where the figures of past runs are written: the docs quote the current ones, the research diary keeps the story
#: of how each was found (the paragraphs these tests hold to their raw results).
RECORD = (ROOT / "docs" / "benchmarks.md", ROOT / "docs" / "measurement.md", ROOT / "research" / "diary.md")


def written_record() -> str:
    """The docs' and the diary's text together: each figure these tests re-derive is quoted in one of them."""
    return "\n".join(p.read_text() for p in RECORD)


def raw_or_skip(path: Path) -> Path:
    """The raw tarball at ``path`` (research/raw.py); the test skips, saying why, where git history lacks it."""
    try:
        return raw_file(path)
    except RawUnavailable as e:
        pytest.skip(str(e))


def recorded_study(results: Path, study: str, out: Path) -> dict[str, Any]:
    """``trials`` (number → Trial), ``docs`` (docs/benchmarks.md) and ``heldout`` (``results/heldout.json``, None
    where the study has none)."""
    with tarfile.open(raw_or_skip(results / "raw.tar.xz")) as tar:
        tar.extractall(out, filter="data")
    database = db.connect(f"sqlite:///{out / 'da-gpu/results.db'}")
    try:
        trials = {t.number: queries.get_trial(database, study, t.number) for t in queries.list_trials(database, study)}
    finally:
        database.close()
    return {"trials": trials, "docs": written_record(),
            "heldout": json.loads((results / "heldout.json").read_text()) if (results / "heldout.json").exists()
            else None}
