"""The committed real study of ``research/results/h200-knee/`` (1 × H200, knee search, vLLM's defaults measured at
c ≥ 99 only) as a database to read: ``tests/data/h200-knee-results.db.xz`` (the device's ``results.db`` from that
run's raw tarball, alone, so that the dashboard's tests need no git history) decompressed and brought to this code's
schema, as any ``advisor`` command leaves it. Its stored job names the model folder by the device run's absolute
path; where that is not this checkout's, the copy is pointed at ``tests/data/qwen3-moe-30b`` (the model's
``config.json`` alone: the job must validate to be read).
"""
from __future__ import annotations

import json
import lzma
import sqlite3
from pathlib import Path

import db

ROOT = Path(__file__).resolve().parent.parent
DATABASE = ROOT / "tests" / "data" / "h200-knee-results.db.xz"
STUDY = "h200-knee-30b"


def unpack(out: Path) -> str:
    """The study's database under ``out``; its URL."""
    path = out / "results.db"
    path.write_bytes(lzma.decompress(DATABASE.read_bytes()))
    con = sqlite3.connect(path)
    with con:
        (text,) = con.execute("SELECT job FROM advisor_studies WHERE name = ?", (STUDY,)).fetchone()
        job = json.loads(text)
        if not Path(job["model"]["path"]).exists():
            job["model"]["path"] = str(ROOT / "tests" / "data" / Path(job["model"]["path"]).name)
            con.execute("UPDATE advisor_studies SET job = ? WHERE name = ?", (json.dumps(job), STUDY))
    con.close()
    db.connect(f"sqlite:///{path}").close()
    return f"sqlite:///{path}"
