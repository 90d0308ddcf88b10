"""Export buttons: the files ``advisor export`` writes, rendered by ``advisor.api.export`` when clicked.

A button's file is made on click (``on_click="ignore"`` + a callable), not on every render: an export is
recorded in the database. Folder formats (Kubernetes, Ray Serve) download as a zip.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path

import streamlit as st

from advisor import api
from advisor.errors import BadInput
from advisor.exports import FORMATS, RENDERERS

MIME = {".json": "application/json", ".sh": "text/x-shellscript", ".zip": "application/zip"}
#: What a person calls each format.
TITLES = {"vllm": "Launch script", "json": "JSON", "k8s": "Kubernetes", "ray-serve": "Ray Serve"}


def target(fmt: str) -> str:
    """The file (``launch.sh``) or folder (``k8s``) a format writes; a folder downloads as a zip."""
    spec = RENDERERS.get(fmt)
    t = getattr(spec, "target", None) or (spec[0] if isinstance(spec, tuple) else fmt)
    return str(t) if Path(str(t)).suffix else f"{t}.zip"


def _zip(folder: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for f in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".deploy-advisor")):
            z.write(f, Path(folder.name) / f.relative_to(folder))
    return buf.getvalue()


def exporter(url: str, study: str, number: int, fmt: str, run_dir: Path) -> Callable[[], bytes]:
    """Runs ``advisor.api.export`` when the button is clicked."""

    def make() -> bytes:
        out = Path(run_dir) / "exports" / study / f"trial-{number}"
        try:
            path = api.export(url, study, fmt=fmt, trial=number, out=out, model=None)[0]
        except BadInput as e:
            return f"export failed: {e}\n".encode()
        return _zip(path) if path.is_dir() else path.read_bytes()

    return make


def buttons(url: str, study: str, number: int, run_dir: Path, *, prefix: str = "export",
            formats: Sequence[str] = FORMATS, titles: bool = False) -> None:
    """One download button per format, keyed ``{prefix}_{fmt}``."""
    fmts = [f for f in formats if f in FORMATS]
    cols = st.columns([max(1.0, len(TITLES.get(f, f)) / 8) for f in fmts] if titles else len(fmts))
    for col, fmt in zip(cols, fmts, strict=True):
        t = target(fmt)
        col.download_button(TITLES.get(fmt, fmt) if titles else fmt, data=exporter(url, study, number, fmt, run_dir),
                            file_name=f"{study}-trial{number}-{t}", help=f"`{t}` — as `advisor export {study} "
                            f"--trial {number} --format {fmt}`", mime=MIME.get(Path(t).suffix, "text/plain"),
                            key=f"{prefix}_{fmt}", on_click="ignore", icon=":material/download:")
