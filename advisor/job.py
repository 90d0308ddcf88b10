"""TuningJob: what the user asks for, loaded from YAML and checked before anything runs.

A job may name a preset (``search_spaces/presets/NAME.yaml``); the job's own keys override the
preset's, key by key and deeply: a nested mapping overrides only the keys it names (``workload: {isl: {mean:
1024}}`` keeps the preset's ``isl.range_ratio``), a list or scalar replaces the preset's whole, and derived
values (``workload.max_model_len``) follow the merged result; ``advisor validate --show`` prints it.
Whatever is wrong comes back as one ``BadInput`` line naming the field.
"""

from __future__ import annotations

import copy
import re
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from advisor.errors import BadInput, describe_validation_error, shown
from db.redaction import redact_url
from search_spaces import (
    DEFAULT_ERROR_SLO,
    DEFAULT_OBJECTIVE,
    DEFAULT_PARETO_Y,
    SLO,
    ClusterSpec,
    DeploymentConfig,
    ModelProfile,
    SearchSpace,
    Workload,
    load_preset,
    maximizable,
    model_preset,
    valid_space,
)
from search_spaces.default_space import default_space
from search_spaces.model_profile import WeightFormat
from search_spaces.rules import precision_error
from search_spaces.valid_space import SpaceTooLarge, ValidSpace

DEFAULT_STORAGE = "sqlite:///advisor.db"


class ModelRef(BaseModel):
    """A model by preset name or by an HF ``config.json`` path, with optional overrides of its facts."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str | None = None
    path: str | None = Field(None, description="A config.json, or a folder holding one (also what real runs serve).")
    weight_bytes: float | None = Field(None, gt=0, description=(
        "Bytes per body weight (attention, dense, shared experts, embeddings; also the experts unless the model "
        "or expert_weight_bytes says otherwise): 2 bf16, 1 fp8, 0.5 nvfp4."))
    expert_weight_bytes: float | None = Field(None, gt=0, description="Bytes per routed-expert weight.")
    expert_format: WeightFormat | None = Field(None, description=(
        "Routed experts' format when their width alone does not say it: bf16, fp8, nvfp4 or mxfp4 (0.5 bytes "
        "means nvfp4 unless this says mxfp4)."))
    kv_bytes: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_source(self) -> ModelRef:
        if (self.preset is None) == (self.path is None):
            raise ValueError("give exactly one of 'preset' or 'path'")
        if self.preset is not None:
            from search_spaces import MODEL_PRESETS

            if self.preset not in MODEL_PRESETS:
                raise ValueError(f"unknown model preset {self.preset!r}; allowed: {', '.join(MODEL_PRESETS)}")
        return self

    def profile(self, base_dir: Path | None = None) -> ModelProfile:
        if self.preset is not None:
            prof = model_preset(self.preset)
        else:
            p = Path(self.path)  # type: ignore[arg-type]
            if not p.is_absolute() and base_dir is not None:
                p = base_dir / p
            prof = ModelProfile.from_hf_config(p)
        upd: dict[str, Any] = {k: v for k, v in (("weight_bytes", self.weight_bytes), ("kv_bytes", self.kv_bytes),
                                                 ("expert_weight_bytes", self.expert_weight_bytes),
                                                 ("expert_format", self.expert_format)) if v is not None}
        if self.weight_bytes is not None:
            upd["weight_format"] = None  # the width given says the format
        if self.expert_weight_bytes is not None and self.expert_format is None:
            upd["expert_format"] = None
        # validated again: a width that contradicts the model is one line, not a silent mix
        return ModelProfile.model_validate({**prof.model_dump(), **upd}) if upd else prof


class ObjectiveMode(StrEnum):
    MAX_UNDER_SLO = "max_under_slo"  # maximize one metric (throughput/GPU) over load levels meeting the SLOs
    PARETO = "pareto"  # the front of throughput/GPU × tokens/s/user


class Scope(StrEnum):
    DEPLOYMENT = "deployment"  # throughput per GPU the deployment uses
    CLUSTER = "cluster"  # per GPU of the whole cluster: copies that fit, idle GPUs count as zero


class Per(StrEnum):
    """What the answer compares deployments by (``objective.per``; what the sampler is told is ``scope``)."""

    CLUSTER = "cluster"  # what the copies that fit serve on the whole cluster (idle GPUs serve nothing)
    USED_GPU = "used_gpu"  # throughput per GPU the deployment uses


class Objective(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: ObjectiveMode = ObjectiveMode.MAX_UNDER_SLO
    metric: str = DEFAULT_OBJECTIVE
    pareto_y: str = DEFAULT_PARETO_Y
    scope: Scope = Field(Scope.DEPLOYMENT, description="cluster: throughput counts every GPU of the cluster (the "
                         "deployment copied as often as it fits; the GPUs left over produce nothing).")
    per: Per = Field(Per.CLUSTER, description="How the answer (advisor best, export without --trial, the "
                     "dashboard) compares measured deployments: cluster: by what the copies that fit serve on the "
                     "whole cluster (idle GPUs count); used_gpu: per GPU each deployment uses. The sampler is told "
                     "what `scope` says either way.")

    @model_validator(mode="after")
    def _metrics(self) -> Objective:
        allowed = maximizable()
        for name in (self.metric, self.pareto_y):
            if name not in allowed:
                raise ValueError(f"objective metric {name!r} is not maximizable; allowed: {', '.join(allowed)}")
        if self.scope is Scope.CLUSTER and self.per is Per.USED_GPU:
            raise ValueError("objective.per: used_gpu contradicts objective.scope: cluster (the sampler is told "
                             "per cluster GPU); allowed with scope cluster: per cluster")
        return self


#: A study's trial budget at most (checked when the job is read; a simulated study runs ~10⁴ trials a minute).
MAX_TRIALS = 1_000_000


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    trials: int = Field(200, ge=1, le=MAX_TRIALS, description="Total trials of the study (a re-run continues up "
                        "to this).")
    wall_time_s: float | None = Field(None, gt=0, description=(
        "This run ends by this many seconds after its start: no trial starts that its median trial would not "
        "finish in time, and a trial still measuring then stops before its next level (its levels kept, marked "
        "interrupted). A later run continues the study."))
    max_consecutive_failures: int = Field(10, ge=1)
    repeat_top: int = Field(2, ge=0, description="Real executors: at the end, the best this many deployments (and "
                            "the baseline) are deployed and measured again, for the run-to-run spread.")


class SamplerKind(StrEnum):
    TPE = "tpe"
    NSGA2 = "nsga2"
    GP = "gp"
    RANDOM = "random"
    GRID = "grid"


class SamplerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: SamplerKind = SamplerKind.TPE
    seed: int = 0
    n_startup_trials: int = Field(10, ge=0)
    guide: bool = Field(True, description="TPE only: every other trial is the performance model's pick, the model "
                        "re-fitted to the study's measured trials (advisor.proposers.guide).")
    guided_trials: int = Field(20, ge=0, description="At most this many model-proposed trials per study.")


class ExecutorKind(StrEnum):
    SIMULATED = "simulated"
    LOCAL = "local"
    RAY = "ray"


class Timeouts(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    health_s: float | None = Field(None, gt=0, description="How long a server may take to answer /health. Default: "
                                   "by model size (300 s plus 60 s per 100 GB of weights), see health_timeout_for.")
    benchmark_s: float = Field(900, gt=0)
    teardown_s: float = Field(30, gt=0)
    router_s: float = Field(60, gt=0)
    placement_s: float = Field(120, gt=0, description="How long Ray may take to place an instance's GPUs; past it "
                               "the trial failed for the environment (retried), not for its configuration.")


class ExecutorSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("profile", mode="before")
    @classmethod
    def _yaml_switch(cls, v: Any) -> Any:
        """YAML 1.1 reads an unquoted ``off`` (and ``on``) as a boolean: ``profile: off`` means what it says."""
        return {False: "off", True: "auto"}.get(v, v) if isinstance(v, bool) else v

    kind: ExecutorKind = ExecutorKind.SIMULATED
    platform: str = Field("auto", pattern=r"^(auto|cpu|gpu)$")
    ray_address: str | None = None
    engine_cmd: list[str] | None = Field(None, description="Replaces `vllm` (e.g. python -m vllm.entrypoints.cli.main).")
    router_cmd: list[str] | None = Field(None, description="Replaces `vllm-router` (e.g. python -m "
                                         "vllm_router.launch_router, where pip --target left no script).")
    served_model_name: str | None = None
    run_dir: str = "runs"
    perf_params: str | None = Field(None, description="A calibrated performance-model JSON (advisor calibrate), or "
                                   "'reference' (the shipped calibration to published vLLM measurements, for the GPU "
                                   "kinds it covers): what the simulated executor predicts with and where a guided "
                                   "study's model starts.")
    profile: Literal["auto", "off"] = Field("auto", description="The local executor: before the first trial, "
                                            "measure the model's shape on the job's GPU kind (advisor profile) "
                                            "when no stored profile of this vLLM matches, so the knee searches "
                                            "and the guide start from the hardware rather than from defaults "
                                            "(with Ray, run advisor profile first); off: start from the stored "
                                            "profile, the parameter file or the defaults.")
    reserve_gpus: bool = Field(False, description="Simulated executor: hold real Ray GPU reservations (ray_address) "
                               "for hold_s per trial — several tuner workers sharing one cluster.")
    hold_s: float = Field(2.0, ge=0, description="With reserve_gpus: how long a trial holds its GPUs.")
    timeouts: Timeouts = Timeouts()
    host: str = Field("127.0.0.1", description="Where servers bind; 127.0.0.1 unless the job says otherwise.")
    extra_serve_args: list[str] = Field(default_factory=list, description="Appended to every `vllm serve`.")
    port_base: int | None = Field(None, ge=1100, le=64000, description="Ray executor: fixed ports as the launch "
                                  "script uses them (instance k's API on port_base + k, DP RPC 29550 + k, router "
                                  "port_base - 100), checked on the node that binds them; default: free ports "
                                  "picked on each node. Fixed ports suit firewalled clusters and one tuner worker.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment of every process a trial starts "
                                "(vLLM servers, router, benchmark) on every node, and of the exports — e.g. "
                                "NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME, NCCL_IB_HCA, HF_HOME. A value written "
                                "${NAME} is read from the tuner's environment at run time and never stored or "
                                "exported as a value (tokens, passwords).")


class Baseline(BaseModel):
    """The deployment a user would start with, at vLLM's defaults: every real study measures it first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, description="Real executors only (the model needs no baseline).")
    config: DeploymentConfig | None = Field(None, description="Default: one aggregated instance, data parallel "
                                            "with expert parallelism over the fewest GPUs that hold the model, "
                                            "vLLM's default batch sizes for the GPU kind.")


#: A study's name, a job's ``name`` or any other way a study is named (``--study``, the API, the dashboard's URL):
#: it becomes part of file names (the tuner's log, run folders), so no separator, no leading dot, no spaces.
STUDY_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


def check_study_name(name: str, field: str = "study") -> str:
    """``name`` if it obeys the job-name rule, else BadInput naming ``field`` and the rule: every study name
    that comes from outside passes here before anything is looked up, written or built from it."""
    if not isinstance(name, str) or not re.fullmatch(STUDY_NAME_PATTERN, name):
        raise BadInput(f"{field}: {shown(name)} is not a study name; allowed: 1-100 letters, digits, '_', '.' or "
                       "'-', starting with a letter or digit")
    return name


class TuningJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=STUDY_NAME_PATTERN, description="The study name.")
    description: str = ""
    preset: str | None = None
    model: ModelRef
    cluster: ClusterSpec
    workload: Workload = Workload()
    slos: list[SLO] = Field(default_factory=list)
    objective: Objective = Objective()
    space: SearchSpace = SearchSpace()
    budget: Budget = Budget()
    baseline: Baseline = Baseline()
    executor: ExecutorSpec = ExecutorSpec()
    storage: str = DEFAULT_STORAGE
    sampler: SamplerSpec = SamplerSpec()
    _base_dir: str | None = PrivateAttr(None)  # where relative paths in the job file are anchored
    _valid: list[ValidSpace | None] = PrivateAttr(default_factory=list)  # computed once, on first use
    _space_derived: bool = PrivateAttr(False)  # the job named no space: ``with_default_space`` derived it
    _profile: tuple[Any, str | None, ModelProfile] | None = PrivateAttr(None)  # ``model_profile``'s, built once
    _params_file: tuple[str, Any] | None = PrivateAttr(None)  # ``params_file``'s, read once

    @model_validator(mode="before")
    @classmethod
    def _error_slo(cls, data: Any) -> Any:
        """Every job gets the error-rate SLO (≤ 1% of a level's requests failed) unless it names its own."""
        if isinstance(data, dict):
            slos = data.get("slos") or []
            if isinstance(slos, list) and not any(
                    (s.get("metric") if isinstance(s, dict) else getattr(s, "metric", None)) == "error_rate"
                    for s in slos):
                data = {**data, "slos": [*slos, dict(DEFAULT_ERROR_SLO)]}
        return data

    @model_validator(mode="after")
    def _space_fits_cluster(self) -> TuningJob:
        total = self.cluster.total_gpus
        roles = (["mixed"] if "aggregated" in self.space.modes else []) + \
            (["prefill", "decode"] if "disaggregated" in self.space.modes else [])
        for role in roles:
            rs = getattr(self.space, role)
            keyed = [(f"dp_sizes_by_tp.{tp}", dps) for tp, dps in rs.dp_sizes_by_tp.items()]
            for dim, sizes in [("dp_sizes", rs.dp_sizes), ("tp_sizes", rs.tp_sizes), *keyed]:
                too_big = [v for v in sizes if v > total]
                if too_big:
                    raise ValueError(
                        f"space.{role}.{dim}: {too_big[0]} is wider than the cluster's {total} GPUs; "
                        f"allowed: 1..{total}"
                    )
            if max(rs.tp_sizes) > self.cluster.gpus_per_node:
                raise ValueError(
                    f"space.{role}.tp_sizes: TP{max(rs.tp_sizes)} is wider than a node of "
                    f"{self.cluster.gpus_per_node} GPUs"
                )
        return self

    @model_validator(mode="after")
    def _levels_to_measure(self) -> TuningJob:
        searchable = self.workload.knee_search and any(s.metric != "error_rate" for s in self.slos)
        if not self.workload.load_levels and not searchable:
            raise ValueError("workload.load_levels is empty and there is no knee to search (knee_search is off or "
                             "no SLO but the error rate): give load levels or an SLO such as p90_ttft_ms <= 2000")
        return self

    def model_profile(self) -> ModelProfile:
        """The model's profile, built once per job (a copy of the job with another model builds its own)."""
        cached = self._profile
        if cached is None or cached[0] is not self.model or cached[1] != self._base_dir:
            cached = self._profile = (self.model, self._base_dir,
                                      self.model.profile(Path(self._base_dir) if self._base_dir else None))
        return cached[2]

    def params_file(self) -> Any:
        """``executor.perf_params`` (a parameter file ``advisor calibrate`` wrote), read once per job: ``load_job``
        reads it to report a broken one, and the model's parameters come from the same read. ``OSError`` or
        ``ValueError`` (``executors.perf.params.ParamsFileInvalid``) for a file that cannot serve."""
        from executors.perf import PerfParams

        path = str(self.resolve_path(self.executor.perf_params or ""))
        if self._params_file is None or self._params_file[0] != path:
            self._params_file = (path, PerfParams.load(path))
        return self._params_file[1]

    @property
    def space_derived(self) -> bool:
        """Whether the space was derived from the model and cluster (the job named none): then what the user can
        change is the job's model, cluster, workload and budget, or a ``space:`` of their own."""
        return self._space_derived

    def valid_space(self) -> ValidSpace | None:
        """The space's valid candidates on this model and cluster (None: a role has too many choices to
        enumerate; then each proposal is checked as it comes)."""
        if not self._valid:
            try:
                vs: ValidSpace | None = ValidSpace(self.space, self.model_profile(), self.cluster,
                                                   self.workload.max_model_len, valid_space.ROLE_LIMIT)
            except SpaceTooLarge:
                vs = None
            self._valid.append(vs)
        return self._valid[0]

    def resolve_path(self, p: str) -> Path:
        """A path from the job file, anchored at the file's folder when relative."""
        path = Path(p)
        return path if path.is_absolute() or not self._base_dir else Path(self._base_dir) / path

    def to_document(self) -> dict[str, Any]:
        """The job as stored in the database and shown by the dashboard: JSON-safe, and the storage URL
        without its password (passwords come from the environment or the URL, never into the results)."""
        doc = self.model_dump(mode="json")
        doc["storage"] = redact_url(doc["storage"])
        if self.model.path:  # anchored here: the stored job must not depend on the tuner's working directory
            doc["model"]["path"] = str(self.resolve_path(self.model.path).resolve())
        return doc


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: a mapping in ``over`` merges into the preset's mapping key by key (so ``workload: {isl:
    {mean: 1024}}`` keeps the preset's ``isl.range_ratio``); any other value — a list, a scalar, null —
    replaces the preset's whole. ``advisor validate --show`` prints the merged job."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def job_from_dict(doc: Any, source: str = "job", base_dir: Path | None = None) -> TuningJob:
    """Validate a job document (after applying its preset); raise BadInput with one line.

    With ``preset: NAME`` the job is the preset's document deep-merged with the job's own keys (see
    ``_merge``); values derived from the workload (max_model_len) are computed from the merged result."""
    if doc is None:
        raise BadInput(f"{source}: the job is empty; a job is a YAML mapping with at least name and a preset "
                       "(or name, model and cluster)")
    if not isinstance(doc, dict):
        raise BadInput(f"{source}: the document must be a mapping of fields such as name, preset, model, cluster "
                       f"(got {type(doc).__name__})")
    preset = doc.get("preset")
    if preset is not None:
        from search_spaces.space import preset_names

        if not isinstance(preset, str) or preset not in preset_names():  # a name, never a path
            raise BadInput(f"{source}: preset: unknown preset {shown(preset)}; allowed: {', '.join(preset_names())}")
        try:
            base = load_preset(preset)
        except KeyError as e:
            raise BadInput(f"{source}: preset: {e.args[0]}") from None
        base.pop("description", None) if "description" in doc else None
        if isinstance(doc.get("model"), dict) and isinstance(base.get("model"), dict):
            for mine, other in (("path", "preset"), ("preset", "path")):  # the job names its model: it replaces
                if doc["model"].get(mine) is not None:                    # the preset's, not joins it
                    base["model"].pop(other, None)
        doc = _merge(base, doc)
    try:
        job = TuningJob.model_validate(doc)
    except ValidationError as e:
        e._advisor_model = TuningJob  # type: ignore[attr-defined]
        raise BadInput(describe_validation_error(e, source)) from None
    if base_dir is not None:
        job._base_dir = str(base_dir)
    try:
        profile = job.model_profile()
    except (OSError, ValueError, KeyError, TypeError) as e:
        field = "model.path" if job.model.path else "model"
        raise BadInput(f"{source}: {field}: {_one_line(e)}") from None
    refused = precision_error(profile, job.cluster.spec)
    if refused:
        raise BadInput(f"{source}: model: {refused}")
    if "space" not in doc:
        job = with_default_space(job)
    return job


def with_default_space(job: TuningJob) -> TuningJob:
    """The job with the space derived from its model and cluster (``search_spaces.default_space``)."""
    derived = job.model_copy(update={"space": default_space(job.model_profile(), job.cluster,
                                                            job.workload.max_model_len, job.budget.trials)})
    derived._base_dir = job._base_dir
    derived._valid = []
    derived._space_derived = True
    return derived


#: A job file is a few kilobytes; past this it is not a job (and YAML would take long to say so).
MAX_JOB_BYTES = 4 * 1024 * 1024


def _one_line(e: BaseException) -> str:
    text = e.args[0] if isinstance(e, KeyError) and e.args and isinstance(e.args[0], str) else str(e)
    return " ".join(text.split())


def load_job(path: str | Path) -> TuningJob:
    """Read, parse and validate a job file; whatever is wrong is one ``BadInput`` line naming the file.

    Also reads the job's ``executor.perf_params`` file (what ``advisor tune`` will load), so that a broken one
    is reported here, by ``advisor validate`` too."""
    from advisor.errors import read_yaml_file

    p = Path(path)
    try:
        if p.is_file() and p.stat().st_size > MAX_JOB_BYTES:
            raise BadInput(f"{p}: {p.stat().st_size:,} bytes is too large for a job file (at most "
                           f"{MAX_JOB_BYTES:,}); a job is a small YAML file")
    except OSError as e:
        raise BadInput(f"{p}: cannot read the job file ({e.strerror or e})") from None
    doc = read_yaml_file(p, "job file", max_bytes=MAX_JOB_BYTES)
    job = job_from_dict(doc, source=str(p), base_dir=p.parent.resolve())
    if job.executor.perf_params == "reference":  # executors.perf.params.REFERENCE: the shipped calibration
        from executors.perf.params import reference_missing

        if (missing := reference_missing(job.cluster.gpu)) is not None:
            raise BadInput(f"{p}: {missing}")
    elif job.executor.perf_params:
        from executors.perf.params import ParamsFileInvalid

        params = job.resolve_path(job.executor.perf_params)
        try:
            job.params_file()  # read once, here: the job carries it (``model_params``)
        except OSError as e:
            raise BadInput(f"{p}: executor.perf_params: cannot read {params} ({e.strerror or e}); give a file "
                           "advisor calibrate wrote") from None
        except ParamsFileInvalid as e:
            raise BadInput(f"{p}: executor.perf_params: {describe_validation_error(e.error, e.path)}") from None
        except ValueError as e:
            raise BadInput(f"{p}: executor.perf_params: {_one_line(e)}") from None
    from advisor.workload_inputs import with_checked_inputs

    return with_checked_inputs(job, str(p))
