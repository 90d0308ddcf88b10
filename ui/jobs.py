"""Starting studies from the dashboard: ``python -m advisor tune JOB.yaml --storage URL``, headless.

The dashboard never runs the tune loop in its own process: a study outlives a browser tab (and the
dashboard), and the CLI is the one tested way in. Each tuner runs in a process group of its own (so Stop
reaches its children too) with stdout and stderr in ``RUN_DIR/STUDY.log``; its progress is read back from
the database like any other study's. The registry of what this server started lives as long as the server.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import streamlit as st
import yaml

from advisor.errors import BadInput
from advisor.job import TuningJob, check_study_name, job_from_dict, load_job
from db import redact_url


@dataclass
class TuneProcess:
    study: str
    job_file: Path
    log: Path
    command: str  # for display: password redacted
    started_at: datetime
    proc: subprocess.Popen[bytes] = field(repr=False)

    @property
    def pgid(self) -> int:
        return self.proc.pid  # start_new_session: the leader's pid is the group id

    def status(self) -> str:
        rc = self.proc.poll()
        return "running" if rc is None else ("finished" if rc == 0 else f"exited with code {rc}")

    @property
    def running(self) -> bool:
        return self.proc.poll() is None


@st.cache_resource(show_spinner=False)
def registry() -> dict[str, TuneProcess]:
    """Study name → the tuner this server started for it (one dict per server process)."""
    return {}


def job_from_preset(name: str, preset: str, trials: int, mode: str, executor: str) -> TuningJob:
    """A job document from a preset with the few fields the New study form asks for; ``BadInput`` if wrong."""
    doc: dict[str, Any] = {"name": name, "preset": preset, "budget": {"trials": trials}, "objective": {"mode": mode},
                           "executor": {"kind": executor}}
    return job_from_dict(doc, source="new study")


def write_job(job: TuningJob, run_dir: Path) -> Path:
    """The job as a YAML file the CLI reads (its ``storage`` field is left out: the URL goes on the command)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    doc = job.to_document()
    doc.pop("storage", None)
    path = run_dir / f"{job.name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def save_upload(data: bytes, filename: str, run_dir: Path) -> tuple[Path, TuningJob]:
    """Keep an uploaded job file under ``RUN_DIR/uploads`` and validate it (``BadInput``: one line)."""
    folder = run_dir / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in Path(filename).name) or "job.yaml"
    path = folder / safe
    path.write_bytes(data)
    return path, load_job(path)


def start(job_file: Path, study: str, storage: str, run_dir: Path, trials: int | None = None) -> TuneProcess:
    """Run the tuner on ``job_file`` in its own process group; refuses a second tuner for a study it runs."""
    current = registry().get(check_study_name(study))
    if current is not None and current.running:
        raise BadInput(f"study {study!r} is already being tuned from this dashboard (pid {current.pgid})")
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / f"{study}.log"
    extra = ["--trials", str(trials)] if trials is not None else []
    argv = [sys.executable, "-m", "advisor", "tune", str(job_file), "--storage", storage, *extra]
    shown = shlex.join(["python", "-m", "advisor", "tune", str(job_file), "--storage", redact_url(storage), *extra])
    with log.open("ab") as fh:
        fh.write(f"\n=== {datetime.now(UTC).isoformat(timespec='seconds')} {shown}\n".encode())
        fh.flush()
        env = {**os.environ, "COLUMNS": "160", "PYTHONUNBUFFERED": "1"}
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
    tp = TuneProcess(study, job_file, log, shown, datetime.now(UTC), proc)
    registry()[study] = tp
    return tp


def stop(tp: TuneProcess, grace_s: float = 20.0) -> None:
    """Ctrl-C to the tuner's group (it closes the running trial as interrupted), then TERM, then KILL —
    from a thread, so the page does not wait."""

    def run() -> None:
        for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            if tp.proc.poll() is not None:
                return
            try:
                os.killpg(tp.pgid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and tp.proc.poll() is None:
                time.sleep(0.2)

    threading.Thread(target=run, daemon=True).start()


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a tuner log ("" when there is none)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 64_000))
            text = fh.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def log_of(study: str, run_dir: Path) -> Path | None:
    """The log of the last tuner this dashboard (or an earlier run of it) started for ``study``; none for a name
    that breaks the study-name rule (a study stored by an older version): no path is built from it."""
    tp = registry().get(study)
    if tp is not None:
        return tp.log
    try:
        check_study_name(study)
    except BadInput:
        return None
    path = run_dir / f"{study}.log"
    return path if path.exists() else None
