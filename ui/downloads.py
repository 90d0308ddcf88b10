"""Export buttons: the files ``advisor export`` writes, rendered in memory by ``advisor.api.rendered_export``
when clicked (``on_click="ignore"`` + a callable), not on every render.

A download writes nothing — no file, no export row — so the read-only dashboard stays read-only. Folder formats
(Kubernetes, Ray Serve) download as a zip made in memory.

An export that cannot be made is said on the page before any button is offered (``advisor.api.export_problem``,
the line ``advisor export`` would print): a download never carries error text. Where what is missing is the model
every node loads (a job whose ``model.path`` is a folder of the tuner's machine), the page asks for it.
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
from ui.common import md

#: How long a trial's export problem is remembered (the stored job and trial do not change under it).
PROBLEM_TTL_S = 60

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


class ExportFailed(RuntimeError):
    """Raised in place of a file: Streamlit then downloads nothing (and says the file could not be made)."""


def exporter(url: str, study: str, number: int, fmt: str, model: str | None = None) -> Callable[[], bytes]:
    """Renders the export when the button is clicked."""

    def make() -> bytes:
        try:
            rendered = api.rendered_export(url, study, fmt=fmt, trial=number, model=model)
        except BadInput as e:
            raise ExportFailed(str(e)) from None
        return rendered.encode() if isinstance(rendered, str) else _zip(RENDERERS[fmt].target, rendered)

    return make


@st.cache_data(ttl=PROBLEM_TTL_S, show_spinner=False)
def problem(url: str, study: str, number: int, model: str | None) -> api.ExportProblem | None:
    return api.export_problem(url, study, trial=number, model=model)


def model_needed(url: str, study: str, number: int, prefix: str) -> tuple[str | None, api.ExportProblem | None]:
    """The model to export with (None: the job's own), and what still stops the export: asks for the model when
    that is what is missing, and says the reason on the page."""
    found = problem(url, study, number, None)
    if found is None:
        return None, None
    if not found.needs_model:
        st.error(f"Cannot export trial {number}: {md(found.reason)}", icon=":material/error:")
        return None, found
    if (st.session_state.get(f"{prefix}_model") or "").strip():  # given: said quietly
        st.caption(f"The exports of trial {number} serve the model named below: {md(found.reason)}")
    else:
        st.warning(f"To export trial {number}, name the model the cluster loads: {md(found.reason)}",
                   icon=":material/warning:")
    model = st.text_input("Model to serve (its hub id, org/name, or a path every node has — `--model` of "
                          "`advisor export`)", key=f"{prefix}_model", placeholder="e.g. Qwen/Qwen3-30B-A3B").strip()
    if not model:
        return None, found
    still = problem(url, study, number, model)
    if still is not None:
        st.error(f"Cannot export trial {number}: {md(still.reason)}", icon=":material/error:")
    return model, still


def buttons(url: str, study: str, number: int, *, prefix: str = "export",
            formats: Sequence[str] = FORMATS, titles: bool = False) -> None:
    """One download button per format, keyed ``{prefix}_{fmt}`` — or, when the export cannot be made, the reason
    (and a box for the model, where that is what is missing)."""
    model, stopped = model_needed(url, study, number, prefix)
    if stopped is not None:
        return
    fmts = [f for f in formats if f in FORMATS]
    cols = st.columns([max(1.0, len(TITLES.get(f, f)) / 8) for f in fmts] if titles else len(fmts))
    for col, fmt in zip(cols, fmts, strict=True):
        t = target(fmt)
        as_cli = f"advisor export {study} --trial {number} --format {fmt}" + (" --model MODEL" if model else "")
        col.download_button(TITLES.get(fmt, fmt) if titles else fmt, data=exporter(url, study, number, fmt, model),
                            file_name=f"{study}-trial{number}-{t}", help=f"`{t}` — as `{as_cli}`",
                            mime=MIME.get(Path(t).suffix, "text/plain"),
                            key=f"{prefix}_{fmt}", on_click="ignore", icon=":material/download:")
