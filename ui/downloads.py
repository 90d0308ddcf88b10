"""Export buttons: the files ``advisor export`` writes, rendered in memory by ``advisor.api.rendered_export``
when clicked (``on_click="ignore"`` + a callable), not on every render.

A download writes nothing — no file, no export row — so the read-only dashboard stays read-only. Folder formats
(Kubernetes, Ray Serve) download as a zip made in memory.
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


def _zip(folder: str, files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel, text in sorted(files.items()):
            z.writestr(str(Path(folder) / rel), text)
    return buf.getvalue()


def exporter(url: str, study: str, number: int, fmt: str) -> Callable[[], bytes]:
    """Renders the export when the button is clicked."""

    def make() -> bytes:
        try:
            rendered = api.rendered_export(url, study, fmt=fmt, trial=number, model=None)
        except BadInput as e:
            return f"export failed: {e}\n".encode()
        return rendered.encode() if isinstance(rendered, str) else _zip(RENDERERS[fmt].target, rendered)

    return make


def buttons(url: str, study: str, number: int, *, prefix: str = "export",
            formats: Sequence[str] = FORMATS, titles: bool = False) -> None:
    """One download button per format, keyed ``{prefix}_{fmt}``."""
    fmts = [f for f in formats if f in FORMATS]
    cols = st.columns([max(1.0, len(TITLES.get(f, f)) / 8) for f in fmts] if titles else len(fmts))
    for col, fmt in zip(cols, fmts, strict=True):
        t = target(fmt)
        col.download_button(TITLES.get(fmt, fmt) if titles else fmt, data=exporter(url, study, number, fmt),
                            file_name=f"{study}-trial{number}-{t}", help=f"`{t}` — as `advisor export {study} "
                            f"--trial {number} --format {fmt}`", mime=MIME.get(Path(t).suffix, "text/plain"),
                            key=f"{prefix}_{fmt}", on_click="ignore", icon=":material/download:")
