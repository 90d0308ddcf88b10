"""An operating point measured outside a study: one deployment at one load, as someone published it or as a user's
own ``vllm bench serve`` run recorded it.

A study's trials are what the tuner measured; an operating point is evidence from elsewhere — public benchmark
tables (InferenceX, engine blogs, vendor reports) or the user's earlier benchmarks of their own cluster. The model
is fitted to and held against them (``advisor calibrate --external``, ``benchmarks/published.py``); they are never a
trial, so the budget, the baseline and the answer never count them.

This module reads the published table's shape (``read_published_csv``: one row per point; the columns are those of
``shared/published/visible.csv``, its README says what each means) into ``OperatingPoint``s, and says for each
row it cannot describe why (``Skipped``). What the model needs to predict a point — a ``TuningJob`` of its model,
cluster and workload — is ``job_of``.
"""

from __future__ import annotations

import csv
import hashlib
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from advisor.errors import BadInput, shown
from search_spaces import (
    GPU_TABLE,
    MODEL_PRESETS,
    DeploymentConfig,
    Mode,
    Role,
    RoleConfig,
    gpu_spec,
    vllm_default_batch,
)

#: The published table's metric columns, with the product's metric each one is (None: no metric of ours has it).
#: Per-GPU throughputs follow the row's ``per_gpu_normalization``.
METRIC_COLUMNS: dict[str, str | None] = {
    "tput_per_gpu": "throughput_per_gpu",
    "output_tput_per_gpu": "output_throughput_per_gpu",
    "input_tput_per_gpu": None,
    "median_ttft_ms": "p50_ttft_ms",
    "p90_ttft_ms": "p90_ttft_ms",
    "median_tpot_ms": "p50_tpot_ms",
    "p90_tpot_ms": "p90_tpot_ms",
    "tok_s_per_user": "p50_tokens_per_s_per_user",
    "mean_ttft_ms": None,
    "mean_tpot_ms": None,
}
#: Columns a published table must have (the metrics may be empty, these may not).
REQUIRED_COLUMNS: tuple[str, ...] = (
    "source", "engine", "model", "precision", "gpu", "total_gpus", "mode",
    "prefill_instances", "prefill_tp", "prefill_dp", "prefill_ep",
    "decode_instances", "decode_tp", "decode_dp", "decode_ep", "isl", "osl", "concurrency",
)
PublishedMode = Literal["agg", "disagg", "prefill-only", "decode-only"]
#: A published table larger than this is not a table of operating points (the visible set is 0.4 MB).
MAX_CSV_BYTES = 64 * 1024 * 1024

#: Published model names → model preset. Matched on the name lower-cased with spaces, underscores and the
#: parenthesised short name dropped, longest key first; DeepSeek-R1 has DeepSeek-V3's shape (its config.json is
#: the same but for the weights).
MODEL_ALIASES: dict[str, str] = {
    "deepseek-v4-pro": "deepseek-v4-pro",
    "deepseek-v4-flash": "deepseek-v4-flash",
    "deepseek-v3.2": "deepseek-v3.2",
    "deepseek-r1": "deepseek-v3",
    "deepseek-v3": "deepseek-v3",
    "kimi-k2": "kimi-k2",
    "glm-5": "glm-5",
    "glm-4.6": "glm-4.6",
    "glm-4.5": "glm-4.5",
    "qwen3-235b": "qwen3-moe-235b",
    "qwen3-30b": "qwen3-moe-30b",
    "qwen3-next": "qwen3-next-80b",
    "qwen3.5": "qwen3.5-397b",
    "minimax-m2.5": "minimax-m2.5",
    "minimax-m2": "minimax-m2",
    "gpt-oss-120b": "gpt-oss-120b",
    "gpt-oss-20b": "gpt-oss-20b",
}


class OperatingPoint(BaseModel):
    """One measured (deployment, workload, load) with what was measured there and where it comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str = Field(min_length=1, description="Where the point comes from: repository@commit:path#id, a URL, "
                                                   "or the file a user's bench JSON was read from.")
    engine: str = Field(description="vllm, sglang, trtllm (as published; a front end in brackets).")
    engine_version: str = ""
    model: str = Field(description="The model as published (e.g. 'DeepSeek-V4-Pro (dsv4)').")
    precision: str = Field("", description="The checkpoint's precision as published ('fp4', 'FP8 (block)', …).")
    gpu: str = Field(description="The GPU kind as published, upper-case.")
    total_gpus: int = Field(ge=1)
    mode: PublishedMode
    config: DeploymentConfig | None = Field(None, description="The layout in the product's terms; None where the "
                                                             "published layout has none (prefill-only/decode-only).")
    layout: str = Field("", description="The source's own words for the layout.")
    mtp: int = Field(0, ge=0, description="MTP draft tokens; 0 = off.")
    isl: int = Field(ge=1, description="Mean prompt length of the requests sent.")
    osl: int = Field(ge=1, description="Mean output length.")
    range_ratio: float = Field(0.0, ge=0.0, lt=1.0, description="Lengths uniform on mean·[1 − r, 1 + r].")
    concurrency: int = Field(ge=1)
    requests: int | None = Field(None, ge=1, description="Requests the level sent (its prompts); None: not stated.")
    measured: dict[str, float] = Field(description="The published metrics by the table's column names.")
    per_gpu_normalization: str = ""
    notes: str = ""

    @property
    def key(self) -> str:
        """A stable identity: the same source, layout, workload and load is the same point (re-imports match)."""
        layout = ";".join(f"{r.role.value}:{r.instances}x{r.tensor_parallel_size}x{r.data_parallel_size}"
                          f"{'ep' if r.enable_expert_parallel else ''}" for r in self.config.roles) \
            if self.config else self.layout  # the layout's own columns: a knob added later changes no key
        text = "|".join(map(str, (self.source, self.engine, self.model, self.precision, self.gpu, self.total_gpus,
                                  self.mode, layout, self.mtp, self.isl, self.osl, self.concurrency)))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    @property
    def family(self) -> str:
        """The model family the point belongs to (its preset's name, else the published name) — what a
        leave-one-family-out validation leaves out."""
        return model_preset_of(self.model) or self.model

    @property
    def as_sent(self) -> bool:
        """Whether the model predicts this point as the benchmark sent it, wave by wave (``executors.perf.burst``),
        rather than as a steady state: an aggregated level of fixed lengths and a stated number of requests. Its
        first ``c`` requests start together and, every request as long as the others, each wave of the closed loop
        stays in lockstep — the prefills of a wave run together, then its decodes alone — so its TTFT is a queue of
        prompts and its TPOT the decode-only step, which the steady state does not describe. Lengths that vary
        spread the waves out and the steady state holds."""
        return self.mode == "agg" and self.range_ratio == 0.0 and self.requests is not None

    @property
    def is_vllm(self) -> bool:
        return self.engine.split()[0].lower() == "vllm"


@dataclass(frozen=True)
class Skipped:
    """A row read but not usable as an operating point, and why (one line)."""

    line: int
    source: str
    reason: str


def model_preset_of(name: str) -> str | None:
    """The model preset a published model name is, or None (the name is matched on its alias, not guessed)."""
    if name in MODEL_PRESETS:
        return name
    text = re.sub(r"\(.*?\)", "", name.lower())
    text = re.sub(r"[\s_]+", "-", text.strip()).strip("-")
    for alias in sorted(MODEL_ALIASES, key=len, reverse=True):
        if text.startswith(alias) or f"/{alias}" in text or f"-{alias}" in f"-{text}":
            return MODEL_ALIASES[alias]
    return None


def gpu_kind_of(name: str) -> str | None:
    """The hardware table's GPU kind a published GPU name is (``H200``, ``GB300``), or None."""
    text = name.strip().upper().replace(" ", "")
    return text if text in GPU_TABLE else None


# ------------------------------------------------------------------------------------------- published CSV
def _int(row: Mapping[str, str], key: str, *, default: int | None = None) -> int:
    text = (row.get(key) or "").strip()
    if not text:
        if default is not None:
            return default
        raise ValueError(f"{key} is empty")
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{key}: {shown(text)} is not a number") from None
    if not math.isfinite(value) or value != int(value) or value < 0 or value > 1_000_000:
        raise ValueError(f"{key}: {shown(text)} is not a whole number between 0 and 1,000,000")
    return int(value)


def _metrics(row: Mapping[str, str]) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in METRIC_COLUMNS:
        text = (row.get(key) or "").strip()
        if not text:
            continue
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{key}: {shown(text)} is not a number") from None
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{key}: {shown(text)} is not a finite non-negative number")
        out[key] = value
    return out


def _role(row: Mapping[str, str], prefix: str, role: Role, spec_gpu: str | None) -> RoleConfig:
    """A role of the published layout: ``tp × dp`` GPUs per instance, expert parallel where ``ep`` > 1 (the
    README's mapping: ep = tp × dp with EP on, ep = 1 with dp > 1 is DP attention with TP-sharded experts). The
    batch knobs are vLLM's defaults for the GPU kind (sources rarely state them), raised to the concurrency a rank
    receives so the published load is not capped by a default the run did not use."""
    tp, dp, ep = _int(row, f"{prefix}_tp", default=1), _int(row, f"{prefix}_dp", default=1), \
        _int(row, f"{prefix}_ep", default=1)
    instances = max(_int(row, f"{prefix}_instances", default=1), 1)
    if tp < 1 or dp < 1:
        raise ValueError(f"{prefix}_tp and {prefix}_dp must be at least 1")
    if ep not in (1, tp * dp, 0):
        raise ValueError(f"{prefix}_ep is {ep}: vLLM's EP group is tp × dp = {tp * dp} or off (1)")
    seqs, tokens = vllm_default_batch(gpu_spec(spec_gpu)) if spec_gpu else (1024, 8192)
    per_rank = math.ceil(_int(row, "concurrency") / max(instances * dp, 1))
    return RoleConfig(role=role, instances=instances, tensor_parallel_size=tp, data_parallel_size=dp,
                      enable_expert_parallel=ep > 1, max_num_seqs=max(seqs, per_rank),
                      max_num_batched_tokens=tokens)


def _requests(row: Mapping[str, str], concurrency: int) -> int | None:
    """Requests per level: ``num_prompts=N`` where the notes state it, else InferenceX's ``10 × concurrency`` (its
    client's ``--num-prompts $(( CONC * 10 ))``) for its rows, else unknown."""
    found = re.search(r"num_prompts\s*=\s*(\d+)", row.get("notes") or "")
    if found:
        return max(int(found.group(1)), 1)
    return 10 * concurrency if "inferencex" in (row.get("source") or "").lower() else None


def _range_ratio(row: Mapping[str, str]) -> tuple[float, float]:
    """(mean length factor, range ratio) of the lengths the source sent. InferenceX's client draws each length
    uniformly from [0.8·L, L] (its ``benchmark_serving.py``, ``sample_uniform`` with range ratio 0.8): a mean of
    0.9·L and ±1/9 around it. Other sources send the nominal lengths."""
    if "inferencex" in (row.get("source") or "").lower() and "fixed" not in (row.get("notes") or "").lower():
        return 0.9, 0.1 / 0.9
    return 1.0, 0.0


def point_of_row(row: Mapping[str, str]) -> OperatingPoint:
    """One published row as an operating point; a row that cannot be read raises ``ValueError`` (one line)."""
    mode = (row.get("mode") or "").strip()
    if mode not in ("agg", "disagg", "prefill-only", "decode-only"):
        raise ValueError(f"mode: {shown(mode)} is not one of agg, disagg, prefill-only, decode-only")
    kind = gpu_kind_of(row.get("gpu") or "")
    config: DeploymentConfig | None = None
    if mode == "agg":
        config = DeploymentConfig(mode=Mode.AGGREGATED, decode=_role(row, "decode", Role.MIXED, kind))
    elif mode == "disagg":
        config = DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=_role(row, "prefill", Role.PREFILL, kind),
                                  decode=_role(row, "decode", Role.DECODE, kind))
    factor, ratio = _range_ratio(row)
    mtp_text = (row.get("mtp") or "").strip().lower()
    mtp = 0 if mtp_text in ("", "no", "false", "0", "off") else (int(mtp_text) if mtp_text.isdigit() else 1)
    return OperatingPoint(
        source=(row.get("source") or "").strip(), engine=(row.get("engine") or "").strip(),
        engine_version=(row.get("engine_version") or "").strip(), model=(row.get("model") or "").strip(),
        precision=(row.get("precision") or "").strip(), gpu=(row.get("gpu") or "").strip().upper(),
        total_gpus=_int(row, "total_gpus"), mode=mode, config=config,
        layout=(row.get("raw_parallel_desc") or "").strip(), mtp=mtp,
        isl=max(round(_int(row, "isl") * factor), 1), osl=max(round(_int(row, "osl") * factor), 1),
        range_ratio=ratio, concurrency=_int(row, "concurrency"), requests=_requests(row, _int(row, "concurrency")),
        measured=_metrics(row),
        per_gpu_normalization=(row.get("per_gpu_normalization") or "").strip(),
        notes=(row.get("notes") or "").strip())


def read_published_csv(path: str | Path) -> list[OperatingPoint | Skipped]:
    """Every row of a published table, in order: an ``OperatingPoint``, or ``Skipped`` with the reason. A file that
    is not such a table (missing, not UTF-8 CSV, a required column absent) raises ``BadInput`` naming the file."""
    p = Path(path)
    if not p.is_file():
        raise BadInput(f"{p}: no such file; give a CSV of published operating points")
    if p.stat().st_size > MAX_CSV_BYTES:
        raise BadInput(f"{p}: {p.stat().st_size:,} bytes is larger than a table of operating points "
                       f"(at most {MAX_CSV_BYTES:,})")
    try:
        with p.open(newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise BadInput(f"{p}: not a table of operating points: missing column(s) {', '.join(missing)}; "
                               f"required: {', '.join(REQUIRED_COLUMNS)}")
            rows = list(reader)
    except UnicodeDecodeError:
        raise BadInput(f"{p}: not a UTF-8 CSV file") from None
    except csv.Error as e:
        raise BadInput(f"{p}: not a readable CSV ({e})") from None
    return list(_points(rows, start=2))


def _points(rows: Iterable[Mapping[str, str]], start: int) -> Iterable[OperatingPoint | Skipped]:
    for n, row in enumerate(rows, start=start):
        try:
            yield point_of_row(row)
        except (ValueError, TypeError) as e:
            yield Skipped(n, (row.get("source") or "").strip(), _first_line(e))


def _first_line(e: BaseException) -> str:
    from pydantic import ValidationError

    if isinstance(e, ValidationError):
        err = e.errors(include_url=False)[0]
        return f"{'.'.join(map(str, err['loc']))}: {err['msg']}"
    return str(e).splitlines()[0] if str(e) else type(e).__name__


# ---------------------------------------------------------------------------------------------- the model
#: The published metrics a fit compares (each with the product's metric): throughput and the medians, as a study's
#: calibration compares its levels (``advisor.calibrate.SERVED_METRICS``).
FITTED_COLUMNS: dict[str, str] = {"tput_per_gpu": "throughput_per_gpu", "median_ttft_ms": "p50_ttft_ms",
                                  "median_tpot_ms": "p50_tpot_ms"}


def _job_doc_key(point: OperatingPoint) -> tuple[Any, ...]:
    """What a point's job depends on: points that share it share one job (and one batch of the model)."""
    return (model_preset_of(point.model), point.precision.lower(), gpu_kind_of(point.gpu), point.total_gpus,
            point.config.total_gpus if point.config else None, point.mode, point.isl, point.osl, point.range_ratio)


class Jobs:
    """``job_of`` once per distinct (model, precision, cluster, workload): the model predicts the points of one
    job together, and a fit over a hundred points evaluates them hundreds of times."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[Any, ...], Any] = {}

    def __call__(self, point: OperatingPoint) -> Any:
        key = _job_doc_key(point)
        if key not in self._jobs:
            self._jobs[key] = job_of(point, name=f"external-{len(self._jobs)}")
        return self._jobs[key]


def samples_of(points: Iterable[OperatingPoint], *, label: str = "external", jobs: Jobs | None = None
               ) -> tuple[list[Any], list[tuple[OperatingPoint, str]]]:
    """Calibration samples (``advisor.calibrate.Sample``, one level each) of the points the model can describe, and
    the others with the reason. A point's fitted values are its throughput per GPU and median TTFT and TPOT where
    published (``FITTED_COLUMNS``), under the product's metric names."""
    from advisor.calibrate import Sample
    from search_spaces import check

    jobs = jobs or Jobs()
    samples: list[Any] = []
    left: list[tuple[OperatingPoint, str]] = []
    for n, point in enumerate(points):
        job = jobs(point)
        if isinstance(job, str):
            left.append((point, job))
            continue
        assert point.config is not None
        broken = check(point.config, job.model_profile(), job.cluster, job.workload.max_model_len)
        if broken:
            left.append((point, "breaks " + "; ".join(map(str, broken))))
            continue
        values = {ours: v for col, ours in FITTED_COLUMNS.items() if (v := point.measured.get(col)) and v > 0}
        if not values:
            left.append((point, "publishes none of " + ", ".join(FITTED_COLUMNS)))
            continue
        sent = {point.concurrency: point.requests} if point.requests else {}
        samples.append(Sample(label, n, point.config, job, {point.concurrency: values}, sent))
    return samples, left


def columns_of(point: OperatingPoint, m: Any) -> dict[str, float]:
    """A level (``Measurement``, predicted or measured) in the published table's columns, normalised per GPU as the
    source normalises them: disaggregated per-role throughputs are divided by that role's GPUs where the row says
    so (InferenceX), every other per-GPU figure by all of the deployment's GPUs."""
    out: dict[str, float] = {}
    for col, ours in METRIC_COLUMNS.items():
        v = getattr(m, ours, None) if ours else None
        if v is not None and math.isfinite(v):
            out[col] = float(v)
    total = out.get("tput_per_gpu")
    output = out.get("output_tput_per_gpu")
    if total is not None and output is not None:
        out["input_tput_per_gpu"] = total - output
        cfg = point.config
        if cfg is not None and cfg.prefill is not None and "decode gpus" in point.per_gpu_normalization.lower():
            gpus = cfg.total_gpus
            out["output_tput_per_gpu"] = output * gpus / cfg.decode.gpus
            out["input_tput_per_gpu"] = (total - output) * gpus / cfg.prefill.gpus
    if (tpot := out.get("median_tpot_ms")) and tpot > 0:
        out["tok_s_per_user"] = 1000.0 / tpot
    return out


def job_of(point: OperatingPoint, *, name: str = "external") -> Any:
    """A ``TuningJob`` of the point's model, cluster and workload — what the model needs to predict it — or a
    one-line reason (``str``) why the model cannot describe the point. The cluster is the point's GPUs, nodes of
    the GPU kind's NVLink domain (8 on HGX boards, up to 72 on NVL72 racks)."""
    from advisor.job import job_from_dict

    preset = model_preset_of(point.model)
    if preset is None:
        return f"no model preset describes {point.model!r} (known: {', '.join(sorted(set(MODEL_ALIASES.values())))})"
    if preset not in MODEL_PRESETS:
        return f"the model preset {preset!r} ({point.model!r}) is not defined"
    kind = gpu_kind_of(point.gpu)
    if kind is None:
        return f"the GPU {point.gpu!r} is not in the hardware table (known: {', '.join(GPU_TABLE)})"
    if point.config is None:
        return f"a {point.mode} measurement has no whole deployment to predict"
    domain = GPU_TABLE[kind].scaleup_domain
    per_node = min(domain, point.total_gpus)
    nodes = max(math.ceil(point.config.total_gpus / per_node), 1)
    model: dict[str, Any] = {"preset": preset, **precision_override(preset, point.precision)}
    doc = {
        "name": name, "model": model,
        "cluster": {"gpu": kind, "nodes": nodes, "gpus_per_node": per_node},
        "workload": {"dataset": "random", "isl": {"mean": point.isl, "range_ratio": point.range_ratio},
                     "osl": {"mean": point.osl, "range_ratio": point.range_ratio},
                     "load_levels": [point.concurrency], "knee_search": False},
        "space": {"modes": ["aggregated" if point.mode == "agg" else "disaggregated"]},
        "executor": {"kind": "simulated"},
    }
    try:
        return job_from_dict(doc, source=f"operating point {point.source}")
    except BadInput as e:
        return str(e)


def precision_override(preset: str, precision: str) -> dict[str, Any]:
    """The ``model`` keys that make a preset the published checkpoint's precision. 'fp4' (NVIDIA's NVFP4 checkpoints:
    routed experts in NVFP4, the rest as the preset keeps it; 'FP8 KV' where the row says so) changes only the
    experts, and nothing where the preset's experts already are 4-bit (DeepSeek-V4 ships MXFP4 experts); 'fp8' is
    8-bit weights, unless the row keeps attention in BF16. Empty where the precision is the preset's own or not
    stated."""
    text = precision.lower()
    model = MODEL_PRESETS.get(preset)
    out: dict[str, Any] = {}
    if "fp4" in text:
        experts = model.expert_weight_bytes if model is not None else None
        if experts is None or experts > 0.5:
            out.update(expert_weight_bytes=0.5, expert_format="nvfp4")
    elif "fp8" in text and "bf16 attention" not in text and model is not None and model.weight_bytes > 1.0:
        out["weight_bytes"] = 1.0
    if "fp8 kv" in text or "attention/kv" in text:
        out["kv_bytes"] = 1.0
    return out
