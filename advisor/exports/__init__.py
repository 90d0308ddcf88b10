"""Ready-to-run output of a chosen trial: a launch script (``vllm``), the whole config with its evidence
(``json``; both ``advisor.exports.launch``), Kubernetes manifests (``k8s``, one LeaderWorkerSet per role:
``advisor.exports.k8s``) and a Ray Serve LLM application (``ray-serve``: ``advisor.exports.ray_serve``). This
package's face holds what every format shares (the evidence, the options, the model name, writing). Every format
is written from the ``{flag: value}`` mapping of each node shard that ``executors.vllm.render`` builds
(``ShardCommand.flags``), the one real runs launch from; no format reads an argv back.

A format writes one file (``launch.sh``, ``deployment.json``) or a folder of files (``k8s/``, ``ray-serve/``).
Every format is right across nodes: what differs per node (NIXL's side-channel host, addresses) is each node's
own, the job's ``executor.env`` is in each, its ``${NAME}`` values as references, and the model is one the
cluster can load (``model_name``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from advisor.errors import BadInput
from advisor.executor_factory import is_simulated, model_path_for
from advisor.job import TuningJob
from search_spaces import SLO, Measurement

if TYPE_CHECKING:
    from executors import Topology

FORMATS = ("vllm", "json", "k8s", "ray-serve")
#: The container image the Kubernetes export runs (``ExportOptions.image``).
DEFAULT_IMAGE = "vllm/vllm-openai:latest"

#: Where the presets' weights live on a model hub; an export names them, a real run needs a local path.
HUB_IDS = {"deepseek-v3": "deepseek-ai/DeepSeek-V3", "qwen3-moe-235b": "Qwen/Qwen3-235B-A22B"}
#: What an export of a trial without a stored topology says about its placement (``Evidence.placed_now``).
PLACED_NOW = "placed by this export (the trial stored none), not necessarily where it was measured"


@dataclass(frozen=True)
class Evidence:
    """Why this configuration: which trial, what it measured (or the model predicted), on what."""

    study: str
    trial: int
    source: str  # measured | simulated
    engine_version: str
    hardware: str
    measurements: list[Measurement]
    #: The trial stored no topology (a database from before they were stored): the export placed the
    #: configuration with today's ``place``, which may differ from what was measured — and says so.
    placed_now: bool = False
    #: The study's SLOs: each level in the header says whether it met them, so a level that missed one is never
    #: read as a figure the deployment delivers.
    slos: tuple[SLO, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        doc = {
            "study": self.study,
            "trial": self.trial,
            "source": self.source,
            "engine_version": self.engine_version,
            "hardware": self.hardware,
            "measurements": [m.model_dump(mode="json", exclude={"raw"}) for m in self.measurements],
        }
        if self.placed_now:
            doc["topology"] = PLACED_NOW
        return doc

    def header(self) -> str:
        lines = [f"deploy-advisor export — study {self.study!r}, trial {self.trial} ({self.source})",
                 f"engine: {self.engine_version}; hardware: {self.hardware}"]
        if self.placed_now:
            lines.append(f"topology: {PLACED_NOW}")
        for m in self.measurements:
            lines.append(
                f"concurrency {m.concurrency}: {_f(m.throughput_per_gpu)} tok/s/GPU, "
                f"P90 {_f(m.p90_tokens_per_s_per_user)} tok/s/user, P90 TTFT {_f(m.p90_ttft_ms)} ms"
                + _slo_marks(m, self.slos)
            )
        lines.append(f"exported {datetime.now(UTC).isoformat(timespec='seconds')}")
        return "\n".join(lines)


def _slo_marks(m: Measurement, slos: tuple[SLO, ...]) -> str:
    """`` — meets every SLO`` / `` — MISSES p90_ttft_ms <= 2000 (2,311.0)`` for one level ("" without SLOs)."""
    if not slos:
        return ""
    missed = [f"{s} ({_f(getattr(m, s.metric, None))})" for s in slos if not s.met(m)]
    return " — meets every SLO" if not missed else f" — MISSES {', '.join(missed)}"


def _f(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.1f}"


@dataclass(frozen=True)
class ExportOptions:
    """What an export needs beyond the trial: where it runs (used by the ``k8s`` format)."""

    image: str = DEFAULT_IMAGE  # the vLLM container image
    router_image: str | None = None  # an image with `vllm-router` on PATH (default: ``image``)
    hf_token_secret: str = "hf-token"  # Kubernetes Secret (key ``token``) the pods read HF_TOKEN from
    name: str | None = None  # prefix of the Kubernetes objects' names (default: the study's name)


class ModelNeeded(BadInput):
    """The export needs the model every node loads (``--model``): the job names none the cluster can load."""


def model_name(job: TuningJob, override: str | None = None) -> str:
    """The model every node of the export's cluster can load: ``--model``, else the preset's hub id.

    A job's ``model.path`` is a folder on the tuner's machine: written into a launch script or a pod it names
    nothing on the other hosts, so the export asks for ``--model`` (a hub id, or a path every node has) rather
    than guess. The ``tiny-moe`` test model is the exception: the tool generates it wherever it runs.
    """
    if override:
        return override
    if job.model.preset == "tiny-moe":
        return str(model_path_for(job))
    if job.model.path:
        raise ModelNeeded(f"--model: the job's model.path {job.resolve_path(job.model.path)} is a folder on this "
                       "machine, not a model the cluster can load; pass --model with its hub id (org/name) or a "
                       "path that exists on every node")
    if job.model.preset not in HUB_IDS:
        raise ModelNeeded(f"--model: model preset {job.model.preset!r} has no hub id to export; pass --model with "
                       "the model's hub id (org/name) or a path that exists on every node")
    return HUB_IDS[job.model.preset]


#: One file's text, or a folder's files (relative path → text).
Rendered = str | dict[str, str]


class Renderer(NamedTuple):
    """How one format is written: ``target`` is the file name, or the folder name when ``render`` returns files.
    (A tuple, so ``RENDERERS[fmt][0]`` is still the target, as when it was ``(filename, render)``.)"""

    target: str
    render: Callable[[TuningJob, Topology, Evidence, str, ExportOptions], Rendered]
    executable: bool = False


def _renderers() -> dict[str, Renderer]:
    from advisor.exports import k8s, launch, ray_serve

    return {
        "vllm": Renderer("launch.sh", lambda job, topo, ev, model, _o: launch.render_vllm(job, topo, ev, model),
                         executable=True),
        "json": Renderer("deployment.json",
                         lambda job, topo, ev, model, _o: launch.render_json(job, topo, ev, model)),
        "k8s": Renderer("k8s", k8s.render),
        "ray-serve": Renderer("ray-serve", ray_serve.render),
    }


RENDERERS: dict[str, Renderer] = _renderers()
#: Written into every folder an export owns: a folder with it may be replaced by the next export, one without never.
FOLDER_MARK = ".deploy-advisor-export"


def render_export(job: TuningJob, topo: Topology, ev: Evidence, fmt: str, model: str | None = None,
                  options: ExportOptions | None = None) -> Rendered:
    """What ``write_export`` would write, in memory."""
    return RENDERERS[fmt].render(job, topo, ev, model_name(job, model), options or ExportOptions())


def files_sha256(files: dict[str, str]) -> str:
    """One digest of a folder's files: sha256 over ``path NUL sha256(text) LF`` lines in path order."""
    lines = "".join(f"{p}\0{hashlib.sha256(t.encode()).hexdigest()}\n" for p, t in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def write_export(job: TuningJob, topo: Topology, ev: Evidence, fmt: str, out: Path,
                 model: str | None = None, options: ExportOptions | None = None) -> tuple[Path, str]:
    """Write ``topo`` (a trial's stored placement, with its configuration) in one format under ``out``; returns
    the path (a file, or the folder of a multi-file format) and its sha256 (of the file, or ``files_sha256`` of
    the folder). ``write_exports`` of one format."""
    return write_exports(job, topo, ev, [fmt], out, model, options)[0]


def write_exports(job: TuningJob, topo: Topology, ev: Evidence, formats: list[str], out: Path,
                  model: str | None = None, options: ExportOptions | None = None) -> list[tuple[Path, str]]:
    """Write ``formats`` under the folder ``out`` (created if missing); (path, sha256) of each.

    Every format is rendered and every target checked before anything is written, so bad input (``out`` a file
    or a device, a foreign folder where a format's folder goes, a place no folder can be made) is one line
    (``BadInput``) with nothing written. A file is written beside its target and renamed over it, a folder
    written beside its target and swapped in: a failure leaves no half-written file or folder, and folders this
    call created are removed again."""
    model = model_name(job, model)
    rendered = [(RENDERERS[f], f, RENDERERS[f].render(job, topo, ev, model, options or ExportOptions()))
                for f in formats]
    _check_targets(out, [(out / spec.target, isinstance(r, dict)) for spec, _, r in rendered])
    created = _make_folder(out)
    try:
        return [_write_one(spec, fmt, r, out) for spec, fmt, r in rendered]
    except OSError as e:
        for d in reversed(created):
            shutil.rmtree(d, ignore_errors=True)
        raise BadInput(f"--out: cannot write under {out}: {e.strerror or e}") from None


def _check_targets(out: Path, targets: list[tuple[Path, bool]]) -> None:
    """Raise ``BadInput`` when ``out`` or a format's target is taken by something an export must not replace."""
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out: {out} exists and is not a folder; name a folder (it is created if missing)")
    for path, folder in targets:
        if folder and path.exists() and not (path / FOLDER_MARK).is_file():
            raise BadInput(f"--out: {path} exists and was not written by `advisor export`; "
                           "move it away or pick another --out")
        if not folder and path.is_dir():
            raise BadInput(f"--out: {path} is a folder where the file {path.name} goes; move it away or pick "
                           "another --out")


def _make_folder(out: Path) -> list[Path]:
    """Create ``out`` and its missing parents; the folders created, outermost first."""
    missing = [p for p in (out, *out.parents) if not p.exists()][::-1]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        for d in reversed(missing):
            if d.is_dir():
                d.rmdir()
        raise BadInput(f"--out: cannot create the folder {out}: {e.strerror or e}") from None
    return missing


def _write_one(spec: Renderer, fmt: str, rendered: Rendered, out: Path) -> tuple[Path, str]:
    path = out / spec.target
    if isinstance(rendered, str):
        fd, name = tempfile.mkstemp(prefix=f".{spec.target}.", dir=out)
        tmp = Path(name)
        try:
            with os.fdopen(fd, "w") as fh:
                fh.write(rendered)
            tmp.chmod(0o755 if spec.executable else 0o644)
            tmp.replace(path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path, hashlib.sha256(rendered.encode()).hexdigest()
    tmp = Path(tempfile.mkdtemp(prefix=f".{spec.target}.", dir=out))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would follow the folder after the rename
        for rel, text in rendered.items():
            f = tmp / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
        (tmp / FOLDER_MARK).write_text(f"{fmt}\n")
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path, files_sha256(rendered)


def evidence_source(job: TuningJob) -> str:
    return "simulated" if is_simulated(job.executor) else "measured"
