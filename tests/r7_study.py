"""The real H200 study r7 (``research/results/h200-study-30b-r7/``: 1 × H200, vLLM's defaults measured and
repeated, 5 search trials, the best repeated) as a database to read: ``tests/data/h200-study-30b-r7-results.db.xz``
is the device's ``results.db`` alone, with the earlier sessions' studies it also holds (r2 and r5 left trials
RUNNING when their tuners were cut off; the first one's job predates today's schema). Decompressed and brought to
this code's schema as any ``advisor`` command leaves it; the stored jobs' model folder is pointed at this
checkout's copy of the same model folder (a job must validate to be read).
"""

from __future__ import annotations

import json
import lzma
import sqlite3
from pathlib import Path

import db

ROOT = Path(__file__).resolve().parent.parent
DATABASE = ROOT / "tests" / "data" / "h200-study-30b-r7-results.db.xz"
STUDY = "h200-study-30b-r7"


def _model_folder(name: str) -> Path:
    """This checkout's copy of the model folder the device run named (its config.json)."""
    return ROOT / "tests" / "data" / name


def unpack(out: Path) -> str:
    """The study's database under ``out``; its URL."""
    path = out / "results.db"
    path.write_bytes(lzma.decompress(DATABASE.read_bytes()))
    con = sqlite3.connect(path)
    with con:
        for name, text in con.execute("SELECT name, job FROM advisor_studies").fetchall():
            job = json.loads(text)
            model = job.get("model") or {}
            if isinstance(model, dict) and model.get("path") and not Path(model["path"]).exists():
                model["path"] = str(_model_folder(Path(model["path"]).name))
                con.execute("UPDATE advisor_studies SET job = ? WHERE name = ?", (json.dumps(job), name))
    con.close()
    db.connect(f"sqlite:///{path}").close()
    return f"sqlite:///{path}"
