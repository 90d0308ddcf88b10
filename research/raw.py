"""Raw results of GPU runs (``raw.tar.xz``: the device's database, logs and bench JSONs) and large one-off outputs,
read without keeping them in the working tree.

Tens of megabytes of them in the tree would make every checkout, and every working tree sent to a lent GPU machine,
carry them. They live in git history instead; ``results/raw-index.json`` names, for each file's place in the tree,
the commit and path that hold it, its sha256 and size. ``raw_file`` returns the file from the working tree where it
is there (a run just brought back), else writes it out of git once into a cache folder, checked against the sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path
from typing import TypedDict

ROOT = Path(__file__).resolve().parents[1]
INDEX = Path(__file__).resolve().parent / "results" / "raw-index.json"


class RawEntry(TypedDict):
    """Where one file is kept: ``commit:git_path`` holds the blob of ``sha256``, ``bytes`` long."""

    commit: str
    git_path: str
    sha256: str
    bytes: int


class RawUnavailable(RuntimeError):
    """The file is neither in the working tree nor readable from git history (a shallow clone, an export)."""


@cache
def index() -> dict[str, RawEntry]:
    """Tree path (relative to the checkout, POSIX) → where git keeps that file."""
    return json.loads(INDEX.read_text())["files"]


def cache_dir() -> Path:
    """``DEPLOY_ADVISOR_RAW_CACHE``, else ``$XDG_CACHE_HOME/deploy-advisor/raw`` (``~/.cache`` by default)."""
    if env := os.environ.get("DEPLOY_ADVISOR_RAW_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "deploy-advisor" / "raw"


def tree_path(path: str | Path) -> str:
    """``path`` (absolute inside the checkout, or relative to it) as the index's key."""
    p = Path(path)
    if p.is_absolute():
        p = p.resolve().relative_to(ROOT)
    return p.as_posix()


def raw_file(path: str | Path) -> Path:
    """The file at ``path`` (a key of the index, or that place as an absolute path): the working tree's file
    where there is one, else the cached copy of the blob git holds. Raises ``RawUnavailable`` saying why not."""
    key = tree_path(path)
    here = ROOT / key
    if here.is_file():
        return here
    entry = index().get(key)
    if entry is None:
        raise RawUnavailable(f"{key}: not in the working tree and not listed in {INDEX.relative_to(ROOT)}")
    cached = cache_dir() / f"{entry['sha256']}{''.join(Path(key).suffixes)}"
    if cached.is_file() and cached.stat().st_size == entry["bytes"]:
        return cached
    spec = f"{entry['commit']}:{entry['git_path']}"
    try:
        blob = subprocess.run(["git", "-C", str(ROOT), "cat-file", "blob", spec], capture_output=True, check=True,
                              timeout=120).stdout
    except FileNotFoundError as e:
        raise RawUnavailable(f"{key}: git is not installed, so {spec} cannot be read") from e
    except subprocess.CalledProcessError as e:
        why = e.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no message"]
        raise RawUnavailable(f"{key}: git history does not hold {spec} (a shallow clone or an export?): "
                             f"{why[0]}") from e
    got = hashlib.sha256(blob).hexdigest()
    if got != entry["sha256"] or len(blob) != entry["bytes"]:
        raise RawUnavailable(f"{key}: {spec} has sha256 {got} ({len(blob)} bytes), the index says "
                             f"{entry['sha256']} ({entry['bytes']} bytes)")
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cached.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(blob)
        os.replace(tmp, cached)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return cached
