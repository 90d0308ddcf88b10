"""``advisor profile``: the performance model measured on the user's hardware before the first trial.

A trial is the expensive thing the model exists to save, so the model must not learn the hardware only through
trials. A profile deploys the job's model *shape* — its real widths, at two reduced depths so that the
per-layer part of a step separates from the fixed part — with real vLLM on one GPU of the job's kind, and
measures with ``vllm bench serve``:

* prefill-only levels of several prompt lengths and a single output token: one request at a time (the prefill of
  one chunk, and of a few chunks where the prompt is longer than the token budget), and on GPUs as many at once as
  fill one step's token budget (``prefill_loads``: the steps a loaded server runs);
* decode-heavy levels: short answers at several concurrencies (the decode step over batch sizes, at the job's
  context length).

The model's compute and overhead terms are then fitted to those levels by the same least squares as
``advisor calibrate`` (``advisor.calibrate``: log ratios of throughput, TTFT and TPOT — E2E latency in their place on
a level whose tokens reached the client in bursts —, a ridge towards the defaults, only the parameters the levels
move), cross-validated by probe so that the reported error is on
levels the fit did not see. Each level is predicted as the benchmark sent it (``executors.perf.burst``): a probe
releases its requests in waves of c that are prefilled together and then decode together, which the steady closed
loop cannot describe — fitted in the steady view, a ~30B H200 profile predicts three studies' levels under
their knees at 19.4 / 27.6 / 19.0%; fitted and predicted as sent, with the API server's per-prompt-token time
(``frontend_per_prompt_token_s``) in the model, at 7.2 / 12.5 / 11.7% (docs/benchmarks.md). The report says
``level_model: as sent``, and a trial's knee search predicts its levels in that view (``advisor.tune._predict``).
The profile — GPU kind and count, vLLM's version, the model's shape, every probe level, the fitted parameters and
their errors — goes into the database and a parameter file; a study of the same shape on the same GPU kind then
starts from it without being told (``resolve_params``), and says so.

What one GPU cannot measure (all-to-all, all-reduce, KV transfer between GPUs) keeps its documented default;
on a node of several GPUs the profile adds a data-parallel + expert-parallel deployment of the shallow stack
whose levels fit the communication terms (``comm_config``), which runs where such a node exists.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import db
from advisor.calibrate import Calibration, Sample, calibrate, fitted_values
from advisor.errors import BadInput, EnvironmentFailed
from advisor.job import ExecutorKind, ModelRef, TuningJob
from executors import place
from executors.base import DeploymentFailed
from executors.measuring.bench_result import first_wave_left_out
from executors.measuring.loop import MeasurePlan
from executors.perf import CALIBRATABLE, PerfParams, default_params
from executors.perf.burst import AS_SENT, STEADY
from executors.perf.params import REFERENCE, reference_source
from executors.vllm.model_folder import at_depth, hf_config, write_model_folder
from search_spaces import (
    ClusterSpec,
    DeploymentConfig,
    LengthDist,
    Measurement,
    Mode,
    ModelProfile,
    Role,
    RoleConfig,
    Workload,
    gpu_spec,
    vllm_default_batch,
)

#: Share of a GPU's memory the deeper stack's weights and its probes' KV cache (``KV_HEADROOM`` times the largest
#: level's) may take together; the rest holds activations and CUDA graphs.
PROBE_MEMORY_SHARE = 0.7
#: KV cache a probe deployment reserves on a GPU, as a multiple of what its largest level holds at once (at least
#: ``MIN_KV_GIB``). Left to itself vLLM gives the KV cache 92% of an H200 less its *estimate* of the CUDA graphs'
#: memory; on the DeepSeek-V3-width FP8 stack that estimate was 4.2 GiB short of the 8.4 GiB captured, and the
#: first prefill probe died of CUDA out-of-memory (H200, vLLM 0.26.0). A probe needs a few GiB of KV, not 100.
KV_HEADROOM = 2.0
MIN_KV_GIB = 2.0
#: Parameters a profile may fit: compute, memory and overhead terms, and the API server's. Communication
#: terms are fitted only from a several-GPU probe (``COMM_PARAMS``).
#: ``layer_latency_s`` (a per-layer floor of every step) is left at its value: on the ~30B H200 probes it fitted to
#: 0.3 us and moved the rest to worse held-out levels (research/results/profile-generalise).
STEP_PARAMS: tuple[str, ...] = (
    "mfu_prefill", "mfu_decode", "attn_eff_prefill", "attn_eff_decode", "hbm_eff", "step_latency_s",
    "eager_layer_latency_s", "cpu_step_s", "cpu_per_seq_s", "frontend_per_token_s", "request_latency_s",
    "frontend_per_request_s", "tpot_cv", "frontend_per_prompt_token_s",
)
#: The profile fit's pull towards the GPU kind's defaults, per unit of a parameter's range (``advisor.calibrate.fit``;
#: a study's calibration keeps ``calibrate.RIDGE``, 0.05). A profile fits 14 terms to ~18 levels whose per-layer part
#: is a small difference between two shallow stacks, and at 0.05 the least squares stopped wherever the weakly
#: identified directions left it: refitted as sent, the ~30B H200 profile (3 and 12 layers) without its two c = 1
#: decode levels moved ``mfu_decode`` 0.45 -> 0.09, ``step_latency_s`` 1.9 -> 0.35 ms and ``cpu_step_s`` 0.23 -> 1.7
#: ms. A stronger pull also reached lower in-sample errors (0.226, 0.215, 0.204, 0.195 at 0.05, 0.2, 0.5, 1.0). At
#: 0.5, on the stored runs' levels the fits never saw (against 0.05): the 48-layer studies' levels under their knees
#: 8.3 / 12.1 / 12.2% (7.2 / 12.5 / 11.7%) and their knees at median |log| 0.103 (0.139);
#: the CPU build's study levels 11.7% and 32.9% (15.9%, 34.4%); worse on one case, the DeepSeek-V3-width stack's one
#: level at depth 3, 15.2% (12.2%) (research/level_views.py). Not monotone: 0.2 did worse on the 48-layer studies
#: (19-23%), so the figure is the one measured, not a trend.
PROFILE_RIDGE = 0.5
COMM_PARAMS: tuple[str, ...] = ("a2a_scaleup_eff", "a2a_ht_latency_s", "a2a_latency_s", "allreduce_latency_s",
                                "cpu_dp_sync_s", "dp_balance_cv", "expert_skew_cv")


# ------------------------------------------------------------------------------------------------ lookup
@dataclass(frozen=True)
class ModelParams:
    """The model's parameters for a job and what they rest on — every prediction says which."""

    params: PerfParams
    source: str
    profile_id: int | None = None
    #: The view of a level the parameters were fitted in (``executors.perf.burst``): a profile's fit is ``AS_SENT``;
    #: the defaults, a parameter file and a profile stored before profiles were fitted as sent are ``STEADY``.
    view: str = STEADY


def matching_profile(database: db.Database, job: TuningJob, engine_version: str | None = None
                     ) -> db.HardwareProfile | None:
    """The newest stored profile of the job's model shape on its GPU kind, on no more GPUs than the cluster has;
    with ``engine_version`` (a real study), only one measured with that vLLM (kernels change between versions)."""
    found = [p for p in database.profiles(gpu=job.cluster.gpu, shape_key=job.model_profile().shape_key)
             if p.gpu_count <= job.cluster.total_gpus]
    if engine_version is not None:
        found = [p for p in found if p.engine_version == engine_version]
    return found[0] if found else None


def resolve_params(job: TuningJob, database: db.Database | None = None, engine_version: str | None = None
                   ) -> ModelParams:
    """A job's ``executor.perf_params`` file when it names one, else the matching profile, else the GPU kind's
    documented defaults — said as "unmeasured". ``executor.perf_params: reference`` names the reference calibration,
    said with what it rests on (``reference_source``)."""
    if job.executor.perf_params:
        from advisor.executor_factory import model_params

        if job.executor.perf_params == REFERENCE:
            return ModelParams(model_params(job),
                               reference_source(job.cluster.gpu, job.model.preset or job.model_profile().name))
        return ModelParams(model_params(job), f"parameter file {job.executor.perf_params}")
    if database is not None:
        prof = matching_profile(database, job, engine_version)
        if prof is not None:
            return ModelParams(PerfParams.model_validate(prof.params), prof.label, prof.id,
                               str((prof.report or {}).get("level_model", STEADY)))
    return ModelParams(default_params(job.cluster.gpu), f"defaults for {job.cluster.gpu}, unmeasured")


# ------------------------------------------------------------------------------------------------ plan
@dataclass(frozen=True)
class Probe:
    """One family of probe levels: a workload (fixed lengths) and the concurrencies it is measured at."""

    kind: str  # "prefill" or "decode"
    isl: int
    osl: int
    loads: tuple[int, ...]
    min_prompts: int = 8  # requests per level (``plan_profile`` sets it: fewer on a GPU, more on vLLM's CPU build)

    def workload(self, load: int | None = None) -> Workload:
        """The probe's levels (only ``load``'s when given), each with a warm-up at its own load: the first requests
        of a new batch shape wait for kernels compiled just in time (Triton's MoE and FP8 kernels per token-count
        bucket). On the DeepSeek-V3-width FP8 stack a probe warmed only once per deployment read a 4-prompt,
        1-token prefill level at 2,374 tok/s beside 27,439 for the shorter prompt (28 s of wall, one request
        stalled) and a decode level at 4.9 s P50 TTFT; the fit to those levels was worse than the defaults.
        Its own dataset seed: a level's prompts are seeded by its load, so probes of one deployment at the same
        concurrency would otherwise start with the same tokens and read each other's prefixes from the cache
        (seen on the H200: 25-50% hits on the prefill probes of one GPU run). Each level starts as a burst, whatever
        the study's levels do: the profile is fitted as sent, c requests at once (``tune._view``)."""
        seed = zlib.crc32(f"{self.kind}/{self.isl}/{self.osl}".encode())
        return Workload(isl=LengthDist(mean=self.isl), osl=LengthDist(mean=self.osl),
                        load_levels=list(self.loads) if load is None else [load], knee_search=False,
                        prompts_per_concurrency=2.0, min_prompts=self.min_prompts,
                        warmups_per_concurrency=1.0, seed=seed, level_start="burst")


@dataclass(frozen=True)
class ProfilePlan:
    depths: tuple[int, ...]
    probes: tuple[Probe, ...]
    config: DeploymentConfig

    @property
    def levels(self) -> int:
        return len(self.depths) * sum(len(p.loads) for p in self.probes)


def default_depths(model: ModelProfile, gpu: str, kv_tokens: int = 0) -> tuple[int, int]:
    """Two depths: the deeper as many layers as one GPU holds — each layer's weights and its share of the KV cache
    for ``kv_tokens`` tokens (the largest probe level's) ``KV_HEADROOM`` times over, in ``PROBE_MEMORY_SHARE`` of
    the GPU —, up to the model's own depth; the shallower a quarter of it (at least one layer).

    As deep as fits, because what the fit learns from two depths it extrapolates to the model's: the per-layer
    part of a step is the difference between them, and everything the model has no term for (kernel floors of
    small GEMMs, per-layer launch gaps that overlap compute on a loaded step) lands in the efficiencies, which
    then scale with the layers and the tokens of a loaded step. Fitted on one depth's probes alone, the ~30B
    profile's 3-layer probes put its 48-layer studies' knees 2x off (median |log| 0.69), its 12-layer probes at
    0.16 (research/results/profile-generalise). A DeepSeek-V2-Lite-shaped MoE (27 layers) profiled
    at 3 and 12 layers on one H100 fitted ``mfu_prefill`` 0.16 with ``attn_eff_prefill`` and ``hbm_eff`` at their
    bounds and predicted vLLM's defaults at 0.40x the measured knee's throughput; that model fits an H100 whole.
    The probes' time barely grows with depth (the ~30B profile on an H200: 104 s of probes at 3 layers, 99 s at 12;
    deploys 122 s and 115 s), so a deeper stack costs little."""
    per_layer = (model.total_weight_bytes - 2 * model.vocab_size * model.hidden_size * model.weight_bytes) \
        / model.num_layers
    per_layer += KV_HEADROOM * kv_tokens * model.kv_bytes_per_token / model.num_layers
    embed = 2 * model.vocab_size * model.hidden_size * 2.0
    room = PROBE_MEMORY_SHARE * gpu_spec(gpu).memory_gib * 2**30 - embed
    deep = max(2, min(model.num_layers, int(room // per_layer) if per_layer > 0 else model.num_layers))
    return max(1, deep // 4), deep


def prefill_loads(isl: int, budget: int, seqs: int) -> tuple[int, ...]:
    """A prefill probe's concurrencies: one prompt at a time (a step of one prompt's chunks), and where the token
    budget holds two or more of its prompts, as many as fill one step (``budget // isl``, at most ``seqs``).

    Why the second level: with one prompt at a time every probe step holds a single sequence, so the fit never saw
    the step a loaded server runs — several prompts, the API server handing them over one by one
    (``frontend_per_prompt_token_s``), the second wave arriving as the first one's requests end. An as-sent fit
    of single-prompt probes (the ~30B shape on an H200) meets those steps only in the decode probes' waves and
    bends its prefill terms to them (``mfu_prefill`` 0.29, ``attn_eff_prefill`` 0.20; docs/benchmarks.md)."""
    full = min(seqs, budget // max(isl, 1))
    return (1, full) if full >= 2 else (1,)


def plan_profile(job: TuningJob, depths: Sequence[int] | None = None,
                 step_filling: bool | None = None) -> ProfilePlan:
    """What a profile of ``job`` deploys and measures: vLLM's default batch sizes for the GPU kind on one GPU,
    prompt lengths around the workload's for prefill, the workload's prompt length for decode.

    ``step_filling``: prefill levels of as many prompts as fill a step (``prefill_loads``) beside the single-prompt
    ones — by default on GPUs only. On vLLM's CPU build they gained nothing measurable: held to 8 levels of other
    deployments and workloads, the fit with them was better in 2 of 4 runs and worse in 2, by 4-11 points of median
    error either way (``research/prefill_probes.py``, docs/benchmarks.md), and they add 4 levels (~1-2 minutes
    on 2 cores) to a profile; on 2 cores the client that sends 32 prompts at once shares the machine with the
    server it measures (the 1-layer stack's 32-prompt level read slower than the 2-layer one's in 3 of 4 runs)."""
    if job.executor.kind is ExecutorKind.SIMULATED:
        raise BadInput("executor.kind: a profile measures real vLLM; give local or ray (the simulated executor "
                       "then uses the stored profile)")
    model, gpu = job.model_profile(), job.cluster.gpu
    seqs, tokens = vllm_default_batch(gpu_spec(gpu))
    cpu = gpu == "CPU"
    osl = 32 if cpu else 64
    longest = int(source_config(job)[0].get("max_position_embeddings") or 1 << 20) - osl  # what the model admits
    isl = max(16, min(job.workload.isl.mean, 256 if cpu else 4096, longest))
    lens = sorted({min(n, longest) for n in ((64, 256) if cpu else (512, 2048, 8192))})
    batches = (1, 4) if cpu else (1, 16, 64, 256)
    # Requests per level. On a GPU 4 prefill and 8 decode requests (the larger batches send 2 x c) take seconds each.
    # On vLLM's CPU build the same counts were levels of 0.1-0.4 s, and the 2-core machines these run on change
    # speed for seconds at a time: a CI run's study has measured the profile's shape 1.7x slower than its
    # probes minutes before (P50 TPOT 9.0 ms against 5.4 predicted), where another machine measured 2.7-3.8 ms on 8
    # fresh deployments of that shape. 24 and 32 requests are 1-3 s per level, a few seconds in all.
    pre_n, dec_n = (24, 32) if cpu else (4, 8)
    filling = not cpu if step_filling is None else step_filling
    probes = tuple(Probe("prefill", n, 1, prefill_loads(n, tokens, seqs) if filling else (1,), pre_n)
                   for n in lens) + (
        Probe("decode", isl, osl, tuple(b for b in batches if b <= seqs), dec_n),)
    kv_tokens = max(max(p.loads) * (p.isl + p.osl) for p in probes)
    ds = tuple(sorted(set(depths))) if depths else default_depths(model, gpu, kv_tokens)
    if len(ds) < 2 or ds[0] < 1 or ds[-1] > model.num_layers:
        raise BadInput(f"--depths: give two or more distinct layer counts in 1..{model.num_layers} "
                       f"(got {', '.join(map(str, depths or ()))})")
    role = RoleConfig(role=Role.MIXED, data_parallel_size=1, max_num_seqs=seqs, max_num_batched_tokens=tokens)
    return ProfilePlan(ds, probes, DeploymentConfig(mode=Mode.AGGREGATED, decode=role))


# ------------------------------------------------------------------------------------------------ run
@dataclass
class ProfileResult:
    profile: db.HardwareProfile
    calibration: Calibration
    levels: int
    deploy_s: list[float] = field(default_factory=list)
    measure_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def source_config(job: TuningJob) -> tuple[dict[str, Any], Path | None]:
    """The job's model as an HF config (its folder's config.json — for ``tiny-moe`` the generated CI folder —, or
    the preset written as one) and the folder whose tokenizer a profile's folders reuse (None: generate one)."""
    from advisor.executor_factory import model_path_for
    from search_spaces.json_file import read_json_file

    if job.model.path or job.model.preset == "tiny-moe":
        folder = model_path_for(job)
        cfg = read_json_file(folder / "config.json", "model config", hint="a model config.json is JSON")
        if not isinstance(cfg, dict):
            raise BadInput(f"{folder / 'config.json'}: must be a JSON object")
        return dict(cfg), folder
    return hf_config(job.model_profile()), None


def probe_job(job: TuningJob, folder: Path, workload: Workload, cluster: ClusterSpec) -> TuningJob:
    """The job as one probe runs it: the reduced-depth folder on ``cluster`` (one node of the job's GPU kind)."""
    return job.model_copy(update={"name": f"{job.name}-profile", "model": ModelRef(path=str(folder.resolve())),
                                  "cluster": cluster, "workload": workload})


def with_probe_kv(job: TuningJob, tokens: int) -> TuningJob:
    """``job`` whose ``vllm serve`` reserves KV cache for ``tokens`` tokens at once (``KV_HEADROOM``) on a GPU
    platform, unless the user's ``extra_serve_args`` size the KV cache or the memory share themselves. The CPU
    build sizes its KV cache by ``VLLM_CPU_KVCACHE_SPACE`` and is left alone."""
    args = job.executor.extra_serve_args
    if job.cluster.gpu == "CPU" or any(a.split("=")[0] in ("--kv-cache-memory-bytes", "--kv-cache-memory",
                                                            "--gpu-memory-utilization") for a in args):
        return job
    need = max(MIN_KV_GIB * 2**30, KV_HEADROOM * tokens * job.model_profile().kv_bytes_per_token)
    executor = job.executor.model_copy(update={"extra_serve_args": [*args, "--kv-cache-memory-bytes", str(int(need))]})
    return job.model_copy(update={"executor": executor})


def comm_config(job: TuningJob, plan: ProfilePlan) -> DeploymentConfig | None:
    """The several-GPU probe: data parallel with expert parallelism over two GPUs of one node (the all-to-all and
    the DP synchronisation one GPU cannot show); None where the node has one GPU or the GPUs are CPU slots (MoE
    with DP does not run on vLLM's CPU build)."""
    if job.cluster.gpu == "CPU" or job.cluster.gpus_per_node < 2:
        return None
    role = plan.config.decode.model_copy(update={"data_parallel_size": 2, "enable_expert_parallel": True})
    return plan.config.model_copy(update={"decode": role})


@dataclass
class _Measured:
    """What the probes measured so far: fit samples, the raw levels, and the time spent."""

    samples: list[Sample] = field(default_factory=list)
    comm: list[Sample] = field(default_factory=list)
    levels: list[dict[str, Any]] = field(default_factory=list)
    deploy_s: list[float] = field(default_factory=list)
    measure_s: list[float] = field(default_factory=list)
    engine: str = ""
    checkpoints: list[Path] = field(default_factory=list)  # one per deployment, removed once the profile is stored
    reused: list[str] = field(default_factory=list)  # the checkpoints an unfinished profile had left

    def add(self, probe_job: TuningJob, config: DeploymentConfig, measured: dict[int, dict[str, float]],
            comm: bool, levels: Sequence[dict[str, Any]] = ()) -> None:
        """One probe's fit sample (none where no level of it completed), measured now or by a checkpoint, with how
        its ``levels`` were sent (requests, first wave left out) for the fit as sent."""
        if measured:
            requests, wave = how_sent(levels)
            (self.comm if comm else self.samples).append(
                Sample("profile", len(self.samples) + len(self.comm), config, probe_job, measured, requests, wave))


def how_sent(levels: Sequence[dict[str, Any]]) -> tuple[dict[int, int], frozenset[int]]:
    """How a probe's stored ``levels`` were sent, for the fit as sent (``Sample.requests``,
    ``Sample.first_wave_out``): each concurrency's completed requests, and the concurrencies whose first wave the
    bench parser left out (levels stored without the record read as not left out)."""
    requests = {int(lv["concurrency"]): int(lv["completed"]) for lv in levels if lv.get("completed")}
    return requests, frozenset(int(lv["concurrency"]) for lv in levels if lv.get("first_wave_out"))


def probe_executor_job(job: TuningJob, folder: Path, probes: Sequence[Probe], gpus: int) -> TuningJob:
    """The job one probe deployment is launched from: the ``folder``'s model on ``gpus`` GPUs of one node, KV
    cache for the probes' largest level."""
    cluster = ClusterSpec(gpu=job.cluster.gpu, nodes=1, gpus_per_node=gpus)
    envelope = Workload(isl=LengthDist(mean=max(p.isl for p in probes)), osl=LengthDist(mean=max(p.osl for p in probes)),
                        load_levels=[1], knee_search=False)
    tokens = max(max(p.loads) * (p.isl + p.osl) for p in probes)
    return with_probe_kv(probe_job(job, folder, envelope, cluster), tokens)


def checkpoint_path(job: TuningJob, folder: Path, config: DeploymentConfig, gpus: int, probes: Sequence[Probe],
                    depth: int, engine: str) -> Path:
    """Where one depth's measured probes wait for the rest of an unfinished profile, named by everything that
    shaped them: the GPU kind and count, the vLLM build, the deployment, the serve arguments and environment, the
    probes and the model's shape. A profile of a wide model costs two cold starts of ~5 minutes each on a fresh
    H200 (the FP8 MoE kernels compile per batch size); one stopped after its first depth resumes at the second
    instead of paying the first again."""
    ex = probe_executor_job(job, folder, probes, gpus).executor
    key = json.dumps([job.cluster.gpu, gpus, engine, config.model_dump(mode="json"), ex.extra_serve_args,
                      sorted(ex.env.items()), [dataclasses.astuple(p) for p in probes],
                      job.model_profile().shape_key, depth], default=str)
    root = job.resolve_path(job.executor.run_dir) / "profile-models" / "measured"
    return root / f"L{depth}-x{gpus}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _reuse(path: Path, job: TuningJob, folder: Path, config: DeploymentConfig, cluster: ClusterSpec,
           probes: Sequence[Probe], into: _Measured, comm: bool) -> bool:
    """Take one depth's measurements from its checkpoint (False: there is none, or it cannot be read)."""
    try:
        got = json.loads(path.read_text())
        measured = [{int(c): {k: float(v) for k, v in vals.items()} for c, vals in m.items()} for m in got["measured"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    for probe, m in zip(probes, measured, strict=True):
        mine = [lv for lv in got["levels"] if (lv["kind"], lv["isl"], lv["osl"]) == (probe.kind, probe.isl, probe.osl)]
        into.add(probe_job(job, folder, probe.workload(), cluster), config, m, comm, mine)
    into.levels.extend(got["levels"])
    into.deploy_s.append(float(got["deploy_s"]))
    into.measure_s.append(float(got["measure_s"]))
    into.reused.append(path.name)
    return True


def probe_values(levels: Sequence[Measurement]) -> dict[int, dict[str, float]]:
    """One probe's fit values by concurrency (``fitted_values``). A level still flagged ``stalled`` (its server
    paused twice, ``LevelProbe._unstall``) measured a compile, not the probe, and is left out: on an H200 such
    levels read P50 TTFT 6.6 s at c=16 beside 276 ms at c=64."""
    return {m.concurrency: v for m in levels if "stalled" not in m.flags and (v := fitted_values(m))}


def _measure(job: TuningJob, folder: Path, config: DeploymentConfig, gpus: int, probes: Sequence[Probe],
             depth: int, into: _Measured, comm: bool, on_level: Callable[[str], None] | None) -> None:
    """Deploy ``config`` of the ``depth``-layer folder on ``gpus`` GPUs, measure ``probes``, tear down — unless
    an unfinished profile already measured this depth the same way (``checkpoint_path``)."""
    from advisor.executor_factory import make_executor

    ejob = probe_executor_job(job, folder, probes, gpus)
    cluster = ejob.cluster
    executor = make_executor(ejob)
    into.engine = executor.engine_version
    tag = f"L{depth}" + (f" x{gpus} GPUs" if gpus > 1 else "")
    saved = checkpoint_path(job, folder, config, gpus, probes, depth, executor.engine_version)
    into.checkpoints.append(saved)
    before = len(into.levels)
    if _reuse(saved, job, folder, config, cluster, probes, into, comm):
        executor.close()
        for _ in range(len(into.levels) - before):
            if on_level:
                on_level(f"{tag}: measured by the unfinished profile before")
        return
    measured: list[dict[int, dict[str, float]]] = []
    step = "deploying"
    try:
        if on_level:
            on_level(f"{tag}: deploying")
        t0 = time.monotonic()
        dep = executor.deploy(place(config, cluster))
        into.deploy_s.append(time.monotonic() - t0)
        try:
            t0 = time.monotonic()
            for probe in probes:
                step = f"{probe.kind} probe ISL {probe.isl} OSL {probe.osl}"
                levels = [m for c in probe.loads for m in executor.measure(dep, probe.workload(c), MeasurePlan())]
                measured.append(probe_values(levels))
                mine = [{"depth": depth, "gpus": gpus, "kind": probe.kind, "isl": probe.isl, "osl": probe.osl,
                         "concurrency": m.concurrency, "values": fitted_values(m), "p50_e2el_ms": m.p50_e2el_ms,
                         "completed": m.completed, "first_wave_out": first_wave_left_out(m),
                         "prefix_cache_hit_rate": m.prefix_cache_hit_rate, "bench_wall_s": m.raw.get("bench_wall_s"),
                         "flags": list(m.flags), "longest_pause_s": m.raw.get("longest_pause_s"),
                         "fitted": "stalled" not in m.flags} for m in levels]
                into.add(probe_job(job, folder, probe.workload(), cluster), config, measured[-1], comm, mine)
                into.levels.extend(mine)
                for m in levels:
                    if on_level:
                        left = " (stalled twice: left out of the fit)" if "stalled" in m.flags else ""
                        on_level(f"{tag}: {probe.kind} ISL {probe.isl} OSL {probe.osl} c={m.concurrency}{left}")
            into.measure_s.append(time.monotonic() - t0)
        finally:
            executor.teardown(dep)
        saved.parent.mkdir(parents=True, exist_ok=True)
        tmp = saved.with_suffix(".tmp")
        tmp.write_text(json.dumps({"measured": measured, "levels": into.levels[before:],
                                   "deploy_s": into.deploy_s[-1], "measure_s": into.measure_s[-1]}, default=str))
        tmp.replace(saved)
    except DeploymentFailed as e:  # the machine failed, not the input: one line, nothing stored
        kept = len(into.checkpoints) - 1
        kept_text = f"; the {kept} deployment(s) measured before are kept, and a rerun starts after them" if kept else ""
        raise EnvironmentFailed(f"profile stopped at {tag}, {step}: {e.reason} (nothing stored{kept_text}; the "
                                f"deployment's logs are under {job.resolve_path(job.executor.run_dir)})") from None
    finally:
        executor.close()


def fit_probes(samples: Sequence[Sample], gpu: str, as_sent: bool = False) -> Calibration:
    """The single-GPU terms fitted to a profile's probe levels, from the GPU kind's defaults (``advisor profile``,
    and ``profile_check.py refit`` refitting stored levels after a change of the model's formulas; ``as_sent``:
    each probe predicted as the benchmark sent it, ``advisor.calibrate.Problem``)."""
    return calibrate(samples, start=default_params(gpu), names=list(STEP_PARAMS), as_sent=as_sent, ridge=PROFILE_RIDGE)


def at_bounds(cal: Calibration) -> dict[str, str]:
    """The fitted parameters the fit left at an end of their range ("low" or "high", within 0.1% of it): there the
    probes asked for more than the parameter's term can give, and the rest of the fit bent to make up for it — a
    profile to read with care where it extrapolates (a DeepSeek-V2-Lite-shaped profile with ``attn_eff_prefill`` and
    ``hbm_eff`` at their bounds predicted a full-depth knee at 0.40x the measured throughput)."""
    bounds = dict(zip(CALIBRATABLE, PerfParams.bounds(), strict=True))
    out: dict[str, str] = {}
    for name in cal.fitted:
        lo, hi = bounds[name]
        v, tol = getattr(cal.params, name), 1e-3 * (hi - lo)
        if v <= lo + tol or v >= hi - tol:
            out[name] = "low" if v <= lo + tol else "high"
    return out


def run_profile(job: TuningJob, database: db.Database, *, depths: Sequence[int] | None = None,
                out: Path | None = None, on_level: Callable[[str], None] | None = None,
                step_filling: bool | None = None) -> ProfileResult:
    """Deploy each depth, measure every probe on it, fit, store. ``on_level(text)`` hears of each step (a
    progress bar); ``step_filling`` as ``plan_profile``'s. Every deployment is torn down whatever happens; nothing
    is stored unless the whole profile was measured and fitted."""
    t0 = time.monotonic()
    plan = plan_profile(job, depths, step_filling)  # bad input (a simulated job, depths) before anything is deployed
    cfg, tok_from = source_config(job)
    model = job.model_profile()
    root = job.resolve_path(job.executor.run_dir) / "profile-models"
    got = _Measured()
    folders = {d: write_model_folder(at_depth(cfg, d), root / f"{model.shape_key}-L{d}", tokenizer_from=tok_from)
               for d in plan.depths}
    for depth in plan.depths:
        _measure(job, folders[depth], plan.config, 1, plan.probes, depth, got, False, on_level)
    comm_cfg = comm_config(job, plan)
    if comm_cfg is not None:
        decode = tuple(p for p in plan.probes if p.kind == "decode")
        _measure(job, folders[plan.depths[0]], comm_cfg, 2, decode, plan.depths[0], got, True, on_level)
    if not got.samples:
        raise BadInput("profile: no probe level completed; see the servers' logs under executor.run_dir")
    cal = fit_probes(got.samples, job.cluster.gpu, as_sent=True)
    report: dict[str, Any] = {**cal.to_dict(), "level_model": AS_SENT, "depths": list(plan.depths),
                              "at_bounds": at_bounds(cal),
                              "deploy_s": got.deploy_s, "measure_s": got.measure_s, "levels": len(got.levels),
                              "resumed_from": got.reused}
    params = cal.params
    if got.comm:  # the communication terms, fitted with the single-GPU terms held at their fitted values
        comm_cal = calibrate(got.comm, start=params, names=list(COMM_PARAMS))
        params = comm_cal.params
        report["communication"] = comm_cal.to_dict()
    report["wall_s"] = time.monotonic() - t0
    stored = database.add_profile(gpu=job.cluster.gpu, gpu_count=2 if got.comm else 1, engine_version=got.engine,
                                  shape_key=model.shape_key, model_name=model.name, shape=model.shape,
                                  params=params.model_dump(), report=report, probes=got.levels)
    for saved in got.checkpoints:
        saved.unlink(missing_ok=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        params.save(out)
        out.with_suffix(".report.json").write_text(json.dumps(
            {"profile": stored.id, "label": stored.label, "shape": model.shape, "shape_key": model.shape_key,
             **report, "probes": got.levels}, indent=2, default=str) + "\n")
    return ProfileResult(stored, cal, len(got.levels), got.deploy_s, got.measure_s, time.monotonic() - t0)
