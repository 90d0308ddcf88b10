"""Side by side with NVIDIA's aiconfigurator: both tools' predictions of the same deployments (issue 29, part 5).

Two problems, as issue 29 states them: DeepSeek-V3 (FP8) on 32 H200 and Qwen3-235B-A22B (BF16) on 16 H200, every
request 4,000 tokens in and 1,000 out, TTFT ≤ 2 s and ≥ 20 tokens/s per user (TPOT ≤ 50 ms). For each, four
deployments — each tool's best aggregated and best disaggregated — and each deployment predicted by both tools:

* **Ours**: the performance model (``executors.perf``) over the preset's space (``h200-dsv3`` widened to
  TP-sharded experts too, so both tools' vocabularies are searched; ``h200-qwen3-235b``), every valid candidate
  scored as a trial would be (``advisor.proposers.model_rank.exhaustive``: its knee under P90 SLOs), the objective
  output tokens/s per GPU of the cluster. A deployment's number is its knee; "at the point" is the model at the
  other tool's concurrency.
* **aiconfigurator 0.12** (PyPI ``aiconfigurator``, its vLLM 0.24.0 database of H200 kernel measurements; a venv
  of its own, ``.venv-aic/``, made by this script; ``benchmarks/aic_side.py`` runs there): its best deployments
  from ``cli_default`` (what ``aiconfigurator cli default`` prints), ours priced with ``cli_estimate`` at our
  operating point and at the largest batch meeting the SLO. Its TTFT/TPOT are single values (the typical
  request); ours are judged at P90, the project's SLO convention (P50 is shown beside it).

One aiconfigurator replica (its ``num_total_gpus``) is one of our ``DeploymentConfig``s; the cluster holds
``total // gpus`` copies of either (our objective's ``scope: cluster``). ``to_aic``/``from_aic`` are the
translation; where one vocabulary cannot say the other's deployment, the row says so.

For a disagreement above 1.5×, the step-time terms of both tools at the same operating point (ours:
``Measurement.raw``; aiconfigurator: its per-operation latencies, grouped into the same four kernel families)
name the term with the largest gap (the ratio of the best numbers, or where aiconfigurator finds no batch
meeting the SLO, the ratio at the same point). Writes ``benchmarks/results/model_vs_aic.{json,csv}``.

    python benchmarks/model_vs_aic.py                 # installs aiconfigurator into .venv-aic on first use
    python benchmarks/model_vs_aic.py --no-aic        # our side only
    python benchmarks/model_vs_aic.py --aic-answer F  # reuse an aiconfigurator answer (the JSON's "aic" key)
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script

from advisor.proposers.model_rank import exhaustive, predicted_outcome  # noqa: E402
from advisor.job import TuningJob, job_from_dict  # noqa: E402
from executors import place  # noqa: E402
from executors.perf import MODEL_VERSION, default_params, predict  # noqa: E402
from search_spaces import DeploymentConfig, Measurement, Mode, Role, RoleConfig, check  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
VENV = ROOT / ".venv-aic"
AIC_REQUIREMENT = "aiconfigurator==0.12.*"
ISL, OSL, TTFT_MS, MIN_TOKENS_PER_S_PER_USER = 4000, 1000, 2000.0, 20.0
TPOT_MS = 1000.0 / MIN_TOKENS_PER_S_PER_USER
DISAGREEMENT = 1.5
#: aiconfigurator's vLLM rules (``generator/rule_plugin/vllm.rule``): what it renders as vLLM's batch limits.
AIC_AGG_MAX_SEQS, AIC_PREFILL_EXTRA_TOKENS = 512, 1500


@dataclass(frozen=True)
class Problem:
    preset: str
    aic_model: str
    gpus: int
    space: dict[str, Any] = field(default_factory=dict)


PROBLEMS = {
    "deepseek-v3": Problem("h200-dsv3", "deepseek-ai/DeepSeek-V3", 32,
                           {r: {"expert_parallel": [True, False]} for r in ("mixed", "prefill", "decode")}),
    "qwen3-235b": Problem("h200-qwen3-235b", "Qwen/Qwen3-235B-A22B", 16),
}


def job_of(problem: Problem) -> TuningJob:
    return job_from_dict({
        "name": f"vs-aic-{problem.preset}", "preset": problem.preset,
        "workload": {"isl": {"mean": ISL, "range_ratio": 0.0}, "osl": {"mean": OSL, "range_ratio": 0.0}},
        "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": TTFT_MS},
                 {"metric": "p90_tokens_per_s_per_user", "op": ">=", "value": MIN_TOKENS_PER_S_PER_USER}],
        "objective": {"mode": "max_under_slo", "metric": "output_throughput_per_gpu", "scope": "cluster"},
        "space": problem.space,
    })


# ------------------------------------------------------------------------------------------- translation
class NotExpressible(ValueError):
    """A deployment one tool's vocabulary cannot say in the other's."""


def _moe(role: RoleConfig) -> dict[str, int]:
    """vLLM shards every expert over the instance's TP × DP GPUs unless expert parallelism spreads them."""
    width = role.tensor_parallel_size * role.data_parallel_size
    ep = width if role.enable_expert_parallel else 1
    return {"tp_size": role.tensor_parallel_size, "attention_dp_size": role.data_parallel_size,
            "moe_tp_size": width // ep, "moe_ep_size": ep}


def to_aic(cfg: DeploymentConfig, point: Measurement, isl: int = ISL) -> dict[str, Any]:
    """``cli_estimate``'s arguments for ``cfg`` loaded as at ``point`` (one of our levels): the per-rank batches
    are the level's (``raw``), the prefill batch is what ``max_num_batched_tokens`` holds of whole prompts, the
    aggregated chunk is the level's prefill chunk; the workers are our instances."""
    raw = point.raw
    if cfg.mode is Mode.AGGREGATED:
        return {"mode": "agg", **_moe(cfg.decode), "batch_size": max(1, round(raw["batch_per_rank"])),
                "ctx_tokens": int(raw["prefill_chunk"]), "_workers": cfg.decode.instances}
    assert cfg.prefill is not None
    kw: dict[str, Any] = {"mode": "disagg"}
    for name, role in (("prefill", cfg.prefill), ("decode", cfg.decode)):
        kw |= {f"{name}_{k}": v for k, v in _moe(role).items()}
        kw[f"{name}_num_workers"] = role.instances
    kw["prefill_batch_size"] = max(1, cfg.prefill.max_num_batched_tokens // isl)
    kw["decode_batch_size"] = max(1, round(raw["decode_batch_per_rank"]))
    return kw


def _role_from_aic(role: Role, instances: int, tp: int, dp: int, moe_tp: int, moe_ep: int, max_num_seqs: int,
                   max_num_batched_tokens: int) -> RoleConfig:
    if moe_tp * moe_ep != tp * dp:
        raise NotExpressible(f"experts over moe_tp {moe_tp} × moe_ep {moe_ep} GPUs, attention over tp {tp} × dp {dp}: "
                             "vLLM spreads experts over exactly the instance's TP × DP GPUs")
    if moe_tp > 1 and moe_ep > 1:
        raise NotExpressible(f"moe_tp {moe_tp} × moe_ep {moe_ep}: vLLM either shards every expert or spreads them")
    return RoleConfig(role=role, instances=instances, tensor_parallel_size=tp, data_parallel_size=dp,
                      enable_expert_parallel=moe_ep > 1, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=max_num_batched_tokens)


def from_aic(mode: str, row: dict[str, Any], isl: int = ISL) -> tuple[DeploymentConfig, int]:
    """One replica of a ``cli_default`` best-config row as our deployment, and its concurrency. vLLM's batch limits
    are the ones aiconfigurator's own vLLM generator renders (``vllm.rule``): aggregated max-num-seqs 512 (or
    twice the batch) and batched tokens batch + ISL + 1500; prefill max-num-seqs = its batch, batched tokens
    ISL + 1500; decode max-num-seqs 512, batched tokens = max-num-seqs."""
    if mode == "agg":
        bs = int(row["bs"])
        seqs = max(AIC_AGG_MAX_SEQS, 2 * bs)
        role = _role_from_aic(Role.MIXED, 1, int(row["tp"]), int(row["dp"]), int(row["moe_tp"]), int(row["moe_ep"]),
                              seqs, bs + isl + AIC_PREFILL_EXTRA_TOKENS)
        return DeploymentConfig(mode=Mode.AGGREGATED, decode=role), int(row["concurrency"])
    pbs, dbs = int(row["(p)bs"]), int(row["(d)bs"])
    dseqs = max(AIC_AGG_MAX_SEQS, 2 * dbs)
    p = _role_from_aic(Role.PREFILL, int(row["(p)workers"]), int(row["(p)tp"]), int(row["(p)dp"]),
                       int(row["(p)moe_tp"]), int(row["(p)moe_ep"]), pbs, isl + AIC_PREFILL_EXTRA_TOKENS)
    d = _role_from_aic(Role.DECODE, int(row["(d)workers"]), int(row["(d)tp"]), int(row["(d)dp"]),
                       int(row["(d)moe_tp"]), int(row["(d)moe_ep"]), dseqs, dseqs)
    return DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=p, decode=d), int(row["concurrency"])


# ------------------------------------------------------------------------------------------- aiconfigurator
def ensure_aic(venv: Path) -> tuple[Path | None, str]:
    """aiconfigurator's Python, installing it into ``venv`` when absent; (None, why) when it cannot be had."""
    py = venv / "bin" / "python"
    probe = [str(py), "-c", "import aiconfigurator; print(aiconfigurator.__version__)"]
    if not py.exists():
        made = _run([sys.executable, "-m", "venv", str(venv)], 300)
        if made.returncode != 0:
            return None, f"python -m venv {venv} failed: {_last_line(made)}"
    got = _run(probe, 120)
    if got.returncode != 0:
        print(f"installing {AIC_REQUIREMENT} into {venv} (pip, a few minutes) …", file=sys.stderr)
        inst = _run([str(py), "-m", "pip", "install", "--quiet", AIC_REQUIREMENT], 1800)
        if inst.returncode != 0:
            return None, f"pip install {AIC_REQUIREMENT} failed: {_last_line(inst)}"
        got = _run(probe, 120)
        if got.returncode != 0:
            return None, f"aiconfigurator installed but does not import: {_last_line(got)}"
    version = got.stdout.strip()
    if not version.startswith("0.12."):
        return None, f"{venv} holds aiconfigurator {version}, not 0.12.x; remove the venv to reinstall"
    return py, version


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """A child in a process group of its own (stopped by its id on a timeout)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        err += f"\ntimed out after {timeout:.0f} s"
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _last_line(p: subprocess.CompletedProcess[str]) -> str:
    lines = [s for s in (p.stderr or p.stdout or "").splitlines() if s.strip()]
    return lines[-1].strip() if lines else f"exit {p.returncode}"


def ask_aic(py: Path, request: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    with tempfile.TemporaryDirectory() as d:
        req, ans = Path(d) / "request.json", Path(d) / "answer.json"
        req.write_text(json.dumps(request))
        p = _run([str(py), str(ROOT / "benchmarks" / "aic_side.py"), str(req), str(ans)], 3600)
        if p.returncode != 0 or not ans.exists():
            return None, f"aiconfigurator run failed: {_last_line(p)}"
        return json.loads(ans.read_text()), ""


# ------------------------------------------------------------------------------------------- terms
TERMS = ("dense", "attention", "experts", "comm", "overhead")


def aic_terms(ops: dict[str, float]) -> dict[str, float]:
    """aiconfigurator's per-operation latencies (ms) in our four kernel families: all-to-all / all-reduce / P2P
    → comm; routed-expert ops → experts; attention and the MLA block (which includes MLA's projections, which
    ours counts as dense) → attention; every other GEMM, norm, embedding and the LM head → dense."""
    out = dict.fromkeys(TERMS, 0.0)
    for name, ms in ops.items():
        n = name.lower()
        if any(s in n for s in ("dispatch", "combine", "allreduce", "p2p", "a2a", "allgather", "reduce_scatter")):
            out["comm"] += ms
        elif "moe" in n and "shared" not in n:
            out["experts"] += ms
        elif "attention" in n or "mla" in n or "dsa" in n:
            out["attention"] += ms
        else:
            out["dense"] += ms
    return out


def our_terms(raw: dict[str, Any], prefix: str) -> dict[str, float]:
    t = {k: float(raw.get(f"{prefix}_{k}_ms", 0.0)) for k in ("dense", "attention", "experts", "overhead")}
    t["comm"] = float(raw.get(f"{prefix}_exposed_comm_ms", 0.0))
    return {k: t[k] for k in TERMS}


def compare_terms(ours: Measurement, aic: dict[str, Any] | None, isl: int = ISL, osl: int = OSL) -> list[dict[str, Any]]:
    """Per role, both tools' step terms at the same operating point. Prefill terms are ms per 1,000 prompt tokens
    of one rank's step (the two tools batch prompts differently); decode and mixed terms are ms per step at the
    point's per-rank batch (aiconfigurator's decode section sums a request's ``osl`` steps: divided by ``osl``)."""
    if not aic or not aic.get("per_ops"):
        return []
    raw, ops, row = ours.raw, aic["per_ops"], aic["row"]
    pairs: list[tuple[str, dict[str, float], dict[str, float]]] = []
    if raw.get("mode") == "disaggregated":
        if "prefill" in ops:
            ours_k = float(raw["prefill_tokens_per_rank"]) / 1e3
            aic_k = float(row.get("(p)bs", 1)) * isl / 1e3
            pairs.append(("prefill (ms per 1k tokens)", {k: v / ours_k for k, v in our_terms(raw, "prefill").items()},
                          {k: v / aic_k for k, v in aic_terms(ops["prefill"]).items()}))
        if "decode" in ops:
            pairs.append(("decode (ms per step)", our_terms(raw, "decode"),
                          {k: v / osl for k, v in aic_terms(ops["decode"]).items()}))
    else:
        if "mix_step" in ops:
            pairs.append(("mixed step (ms)", our_terms(raw, "mixed"), aic_terms(ops["mix_step"])))
        if "genonly_step" in ops:
            pairs.append(("decode-only step (ms)", our_terms(raw, "decode"), aic_terms(ops["genonly_step"])))
    rows = []
    for role, o, a in pairs:
        for k in TERMS:
            rows.append({"role": role, "term": k, "ours": round(o[k], 3), "aic": round(a[k], 3),
                         "gap": round(o[k] - a[k], 3)})
        rows.append({"role": role, "term": "total", "ours": round(sum(o.values()), 3),
                     "aic": round(sum(a.values()), 3), "gap": round(sum(o.values()) - sum(a.values()), 3)})
    return rows


def prefill_rates(ours: Measurement, aic: dict[str, Any] | None, isl: int = ISL) -> tuple[float | None, float | None]:
    """Prompt tokens/s per prefill GPU, disaggregated deployments: ours (``raw``) and aiconfigurator's (a
    prefill worker's requests/s × ISL over its GPUs)."""
    ours_rate = ours.raw.get("prefill_input_tokens_per_s_per_gpu")
    aic_rate = None
    if aic and "(p)seq/s/worker" in aic.get("row", {}):
        row = aic["row"]
        aic_rate = float(row["(p)seq/s/worker"]) * isl / (int(row["(p)tp"]) * int(row["(p)dp"]) * int(row.get("(p)pp", 1)))
    return (float(ours_rate) if ours_rate is not None else None), aic_rate


def step_mix(ours: Measurement, aic: dict[str, Any] | None) -> dict[str, float] | None:
    """Aggregated: a user's mean step = (1 − s)·decode-only step + s·mixed step, ``s`` the share of steps that
    carry a prefill chunk, implied from each tool's own mean (ours ``mean_step_ms``, aiconfigurator's TPOT).
    The gap of the means splits exactly into the decode step, the mixed step and the share (``s_o − s_a`` times
    aiconfigurator's mixed-minus-decode step): the share is where our DP stall (any rank's prefill chunk stalls
    every rank of the instance) differs from aiconfigurator's (a rank waits for its own prefills only)."""
    if ours.raw.get("mode") != "aggregated" or not aic or not aic.get("per_ops"):
        return None
    sched = aic["per_ops"].get("scheduling", {})
    dec_o, mix_o, mean_o = (float(ours.raw[k]) for k in ("decode_step_ms", "mixed_step_ms", "mean_step_ms"))
    dec_a, mix_a = float(sched["genonly_step_latency_ms"]), float(sched["mix_step_latency_ms"])
    mean_a = float(aic["row"]["tpot"])
    s_o = (mean_o - dec_o) / (mix_o - dec_o) if mix_o > dec_o else 0.0
    s_a = (mean_a - dec_a) / (mix_a - dec_a) if mix_a > dec_a else 0.0
    return {"ours_mean_step_ms": mean_o, "aic_mean_step_ms": mean_a, "ours_mixed_share": s_o, "aic_mixed_share": s_a,
            "gap_from_decode_step_ms": (1 - s_o) * (dec_o - dec_a), "gap_from_mixed_step_ms": s_o * (mix_o - mix_a),
            "gap_from_mixed_share_ms": (s_o - s_a) * (mix_a - dec_a)}


def cause(terms: list[dict[str, Any]], ratio: float | None, mix: dict[str, float] | None = None) -> str:
    """The role and term with the largest gap in the disagreement's direction (ours faster: ours smaller);
    aggregated, first which part of the mean step (``step_mix``) carries the gap."""
    if ratio is None or not terms or (1 / DISAGREEMENT) <= ratio <= DISAGREEMENT:
        return ""
    sign = -1.0 if ratio > 1 else 1.0
    cands = [r for r in terms if r["term"] != "total"]
    if mix is not None:
        parts = {k: mix[f"gap_from_{k}_ms"] for k in ("decode_step", "mixed_step", "mixed_share")}
        part = max(parts, key=lambda k: sign * parts[k])
        if part == "mixed_share":
            return (f"share of steps stalled by a prefill chunk: ours {mix['ours_mixed_share']:.3f} vs aic "
                    f"{mix['aic_mixed_share']:.3f} (mean step {mix['ours_mean_step_ms']:.1f} vs "
                    f"{mix['aic_mean_step_ms']:.1f} ms; {parts[part]:+.1f} ms of it)")
        cands = [r for r in cands if r["role"].startswith("mixed" if part == "mixed_step" else "decode")]
    worst = max(cands, key=lambda r: sign * r["gap"])
    return f"{worst['role']}: {worst['term']} ours {worst['ours']:.1f} vs aic {worst['aic']:.1f}"


# ------------------------------------------------------------------------------------------- assembly
def _point(m: Measurement | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {"concurrency": m.concurrency, "output_tok_s_gpu": m.output_throughput_per_gpu,
            "p50_ttft_ms": m.p50_ttft_ms, "p90_ttft_ms": m.p90_ttft_ms, "p50_tpot_ms": m.p50_tpot_ms,
            "p90_tpot_ms": m.p90_tpot_ms, "p90_tok_s_user": m.p90_tokens_per_s_per_user, "raw": m.raw}


def _aic_point(e: dict[str, Any] | None) -> dict[str, Any] | None:
    if not e or "row" not in e:
        return None
    r = e["row"]
    return {"concurrency": r.get("concurrency"), "output_tok_s_gpu": r.get("tokens/s/gpu"), "ttft_ms": r.get("ttft"),
            "tpot_ms": r.get("tpot"), "parallel": r.get("parallel") or f"P {r.get('(p)parallel')} | D {r.get('(d)parallel')}",
            "meets_slo": r.get("ttft", math.inf) <= TTFT_MS and r.get("tpot", math.inf) <= TPOT_MS,
            "moe_comm_fallbacks": e.get("moe_comm_fallbacks", [])}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


@dataclass
class OurSide:
    """One problem on our side: the job and our best deployment of each mode with its outcome (knee)."""

    job: TuningJob
    best: dict[str, tuple[DeploymentConfig, Any]]

    def requests(self) -> dict[str, dict[str, Any]]:
        """Our best deployments in aiconfigurator's terms, at our knee: what ``aic_side.py`` prices."""
        return {f"ours-{_aic_mode(m)}": {k: v for k, v in to_aic(c, o.best).items() if not k.startswith("_")}
                for m, (c, o) in self.best.items()}


def _aic_mode(mode: str) -> str:
    return "agg" if mode == Mode.AGGREGATED.value else "disagg"


def our_side(problem: Problem) -> OurSide:
    job = job_of(problem)
    best: dict[str, tuple[DeploymentConfig, Any]] = {}
    for key, o in exhaustive(job, default_params(job.cluster.gpu)).items():
        cfg = DeploymentConfig.model_validate_json(key)
        if o.feasible and (cfg.mode.value not in best or o.values[0] > best[cfg.mode.value][1].values[0]):
            best[cfg.mode.value] = (cfg, o)
    return OurSide(job, best)


def compare(name: str, ours: OurSide, aic: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Every deployment of one problem, both tools' numbers. ``aic``: aiconfigurator's answer for the problem."""
    job = ours.job
    model, wl, params = job.model_profile(), job.workload, default_params(job.cluster.gpu)
    rows: list[dict[str, Any]] = []
    for mode, (cfg, o) in ours.best.items():
        tag = f"ours-{_aic_mode(mode)}"
        est = (aic or {}).get("deployments", {}).get(tag, {})
        rows.append(_row(name, tag, cfg, o.best, o.best, est.get("at_point"), est.get("best_under_slo"), job,
                         est.get("error")))
    for aic_mode, pick in (aic or {}).get("picks", {}).items():
        tag = f"aic-{aic_mode}"
        try:
            cfg, c = from_aic(aic_mode, pick["row"])
        except NotExpressible as e:
            rows.append({"problem": name, "pick": tag, "note": f"not expressible in our terms: {e}"})
            continue
        same = predict(place(cfg, job.cluster), model, wl, params, [c])[0]
        knee = predicted_outcome(job, cfg, params).best
        rows.append(_row(name, tag, cfg, knee, same, pick["estimate"], pick["estimate"], job, None))
    return rows


def _row(name: str, tag: str, cfg: DeploymentConfig, knee: Measurement | None, same: Measurement,
         aic_at: dict[str, Any] | None, aic_best: dict[str, Any] | None, job: TuningJob,
         aic_error: str | None) -> dict[str, Any]:
    violations = [str(v) for v in check(cfg, job.model_profile(), job.cluster, job.workload.max_model_len)]
    ours_best = knee.output_throughput_per_gpu if knee is not None else None
    aic_best_v = (aic_best or {}).get("row", {}).get("tokens/s/gpu") if aic_best else None
    ratio = _ratio(ours_best, aic_best_v)
    at_ratio = _ratio(same.output_throughput_per_gpu, (aic_at or {}).get("row", {}).get("tokens/s/gpu"))
    terms = compare_terms(same, aic_at)
    mix = step_mix(same, aic_at)
    p_ours, p_aic = prefill_rates(same, aic_at)
    gpus = cfg.total_gpus
    return {
        "problem": name, "pick": tag, "deployment": cfg.short(), "gpus_per_copy": gpus,
        "copies": job.cluster.total_gpus // gpus, "our_rule_violations": violations,
        "ours_knee": _point(knee), "ours_at_point": _point(same),
        "aic_at_point": _aic_point(aic_at), "aic_best_under_slo": _aic_point(aic_best),
        "ours_best_tok_s_gpu": ours_best, "aic_best_tok_s_gpu": aic_best_v, "ratio_ours_over_aic": ratio,
        "ratio_at_point": at_ratio, "prefill_input_tok_s_gpu": {"ours": p_ours, "aic": p_aic, "ratio": _ratio(p_ours, p_aic)},
        "terms_at_point": terms, "step_mix": mix,
        "cause": cause(terms, ratio if ratio is not None else at_ratio, mix), "aic_error": aic_error,
        "config": json.loads(cfg.model_dump_json()),
    }


# ------------------------------------------------------------------------------------------- output
def _f(x: Any, nd: int = 0) -> str:
    return "—" if x is None else f"{x:,.{nd}f}"


def print_table(rows: list[dict[str, Any]], aic_status: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"Output tok/s per GPU, ISL {ISL} / OSL {OSL}, TTFT ≤ {TTFT_MS / 1e3:.0f} s, "
                    f"≥ {MIN_TOKENS_PER_S_PER_USER:.0f} tok/s/user — aiconfigurator: {aic_status}")
    for c in ("problem", "pick", "deployment (ours)", "aic", "ours", "ours/aic", "aic at our point", "ours at point",
              "prefill tok/s/GPU ours|aic", "largest term gap"):
        t.add_column(c, overflow="fold")
    for r in rows:
        if "deployment" not in r:
            t.add_row(r["problem"], r["pick"], r.get("note", ""), *[""] * 7)
            continue
        aic_at, ours_at = r["aic_at_point"] or {}, r["ours_at_point"] or {}
        slo = "" if not aic_at else (" ✓" if aic_at.get("meets_slo") else " ✗SLO")
        pf = r["prefill_input_tok_s_gpu"]
        t.add_row(r["problem"], r["pick"], r["deployment"], _f(r["aic_best_tok_s_gpu"]), _f(r["ours_best_tok_s_gpu"]),
                  _f(r["ratio_ours_over_aic"], 2),
                  f"c={_f(aic_at.get('concurrency'))} {_f(aic_at.get('output_tok_s_gpu'))}{slo}" if aic_at else "—",
                  f"c={ours_at.get('concurrency')} {_f(ours_at.get('output_tok_s_gpu'))}",
                  f"{_f(pf['ours'])} | {_f(pf['aic'])}", r["cause"])
    Console(width=220).print(t)


CSV_COLS = ("problem", "pick", "deployment", "gpus_per_copy", "copies", "aic_best_tok_s_gpu", "ours_best_tok_s_gpu",
            "ratio_ours_over_aic", "ratio_at_point", "cause")


def write(rows: list[dict[str, Any]], doc: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "model_vs_aic.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    with open(RESULTS / "model_vs_aic.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow([*CSV_COLS, "aic_tok_s_gpu_at_point", "aic_meets_slo_at_point", "ours_tok_s_gpu_at_point",
                    "point_concurrency", "prefill_tok_s_gpu_ours", "prefill_tok_s_gpu_aic", "note"])
        for r in rows:
            aic_at, ours_at = r.get("aic_at_point") or {}, r.get("ours_at_point") or {}
            pf = r.get("prefill_input_tok_s_gpu") or {}
            w.writerow([*(r.get(c) for c in CSV_COLS), aic_at.get("output_tok_s_gpu"), aic_at.get("meets_slo"),
                        ours_at.get("output_tok_s_gpu"), ours_at.get("concurrency"), pf.get("ours"), pf.get("aic"),
                        r.get("note", "")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-aic", action="store_true", help="our side only; do not install or run aiconfigurator")
    ap.add_argument("--aic-answer", type=Path, help="reuse the 'aic' answer of an earlier results JSON")
    ap.add_argument("--venv", type=Path, default=VENV, help="aiconfigurator's venv (made when absent)")
    args = ap.parse_args(argv)
    t0 = time.time()
    # our side first: its operating points are what aiconfigurator is asked to price
    ours = {name: our_side(p) for name, p in PROBLEMS.items()}
    answer: dict[str, Any] | None = None
    if args.aic_answer:
        try:
            answer = json.loads(args.aic_answer.read_text())["aic"]
        except (OSError, ValueError, KeyError) as e:
            print(f"--aic-answer: cannot read an 'aic' answer from {args.aic_answer}: {e}", file=sys.stderr)
            return 2
        status = f"{answer['version']} (answer reused from {args.aic_answer.name})"
    elif args.no_aic:
        status = "not run (--no-aic)"
    else:
        py, status = ensure_aic(args.venv)
        if py is not None:
            req = {"problems": {name: {"aic_model": p.aic_model, "system": "h200_sxm", "backend": "vllm",
                                       "total_gpus": p.gpus, "isl": ISL, "osl": OSL, "ttft_ms": TTFT_MS,
                                       "tpot_ms": TPOT_MS, "deployments": ours[name].requests()}
                                for name, p in PROBLEMS.items()}}
            answer, why = ask_aic(py, req)
            status = status if answer is not None else why
    if answer is None:
        print(f"aiconfigurator absent: {status}; printing our side only", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    for name, p in PROBLEMS.items():
        rows += compare(name, ours[name], (answer or {}).get("problems", {}).get(name))
    print_table(rows, status)
    write(rows, {"command": "python benchmarks/model_vs_aic.py " + " ".join(argv if argv is not None else sys.argv[1:]),
                 "model": MODEL_VERSION, "aic_status": status, "seconds": round(time.time() - t0, 1),
                 "problem": {"isl": ISL, "osl": OSL, "ttft_ms": TTFT_MS, "tpot_ms": TPOT_MS,
                             "our_slos": "P90 TTFT and P90 tok/s/user"},
                 "rows": rows, "aic": answer})
    return 0


if __name__ == "__main__":
    sys.exit(main())
