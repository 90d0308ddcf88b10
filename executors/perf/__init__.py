"""An analytical, calibratable performance model of vLLM serving a Mixture-of-Experts model.

A first-order model, written to rank candidates and to answer what-if questions, not to replace a
measurement. ``docs/performance-model.md`` states every equation, where each default comes from and what
the model leaves out. In one paragraph:

* **One step of one DP rank** (``prefill_step_time`` / ``decode_step_time``) is a roofline per kernel
  family — dense layers, attention (MLA or GQA, with context length), routed experts (only the experts a
  batch actually touches are read) — plus the expert-parallel all-to-all (dispatch + combine volume over
  NVLink or the network, per backend), tensor-parallel all-reduces, dual-batch overlap (DBO), kernel
  launch latency, scheduler CPU time, the DP synchronisation and the API server (one per instance, which
  becomes the bottleneck when one instance streams tens of thousands of tokens per step). Every DP rank
  of an instance waits for the slowest at each MoE layer, so the token-proportional terms are multiplied
  by the expected maximum over ranks of a random per-rank load, and expert compute by the expected
  maximum over EP ranks of the per-GPU expert load (EPLB and redundant experts shrink the latter).
  Without expert parallelism (TP experts, vLLM's behaviour for ``tp × dp > 1`` without
  ``--enable-expert-parallel``) every GPU holds ``1/(tp·dp)`` of every expert: no expert imbalance,
  narrower expert GEMMs, and with DP > 1 an all-gather / reduce-scatter of every DP rank's tokens
  around each MoE layer.
* **A load level** (``predict``) is a closed loop of ``C`` users: requests queue for prefill
  (M/D/1-like), move their KV to a decode instance (P/D) or share the batch with decode (aggregated,
  where any rank's prefill chunk stalls every rank's decode step), decode with a batch capped by
  ``max_num_seqs``, KV capacity and (aggregated) the token budget; users beyond the cap wait.

Written once, over arrays: one evaluation computes a term for every (deployment, level) asked with one NumPy
operation — the guide's rankings ask thousands at once, and a single deployment is a batch of one. Per-model,
per-workload and per-role derived numbers are computed once (cached).

This package's face is the model's public API (what other packages import); the parts live in it, each one concern:

* ``executors.perf.params`` — ``PerfParams``, per-GPU-kind defaults, the calibration vector;
* ``executors.perf.derived`` — per-model, per-workload and per-role derived quantities;
* ``executors.perf.step`` — the step-time model over arrays of roles, and the public step/throughput functions;
* ``executors.perf.deployments`` — what does not depend on the load level (KV hand-off, a lone request's prefill,
  the decode step grid), gathered per deployment;
* ``executors.perf.levels`` — the load-level (closed-loop queueing) model over arrays of (deployment, level) pairs
  (``Batch``: the guide's rankings, ``executors.simulated.executor.model_levels_many``), ``predict`` and
  ``predict_load``;
* ``executors.perf.measurement`` — percentiles and the assembly of ``Measurement``s (``LevelTable``).
* ``executors.perf.burst`` — a level as the benchmark sends it, step by step (``predict_as_sent``): the view a fit
  or a check compares with measured short levels (a profile's probes); the guide ranks by the steady state above.

Besides ``predict`` and the step functions, the face gives the batch side other modules use: ``Batch``,
``LazyLevel``, ``collector_paused`` (rankings), ``memo`` and ``same_lengths`` (the per-workload caches).

Seeded perturbed parameters (a stand-in machine for research) are ``benchmarks/truths.py``.
"""

from __future__ import annotations

from executors.perf.derived import expected_max_z, memo, same_lengths
from executors.perf.levels import Batch, collector_paused, predict, predict_load
from executors.perf.measurement import LazyLevel
from executors.perf.params import CALIBRATABLE, MODEL_VERSION, PerfParams, default_params
from executors.perf.step import (
    Step,
    decode_step_time,
    decode_throughput_per_gpu,
    prefill_step_time,
    prefill_throughput_per_gpu,
)

__all__ = [
    "CALIBRATABLE", "MODEL_VERSION", "Batch", "LazyLevel", "PerfParams", "Step", "collector_paused",
    "decode_step_time", "decode_throughput_per_gpu", "default_params", "expected_max_z", "memo", "predict",
    "predict_load", "prefill_step_time", "prefill_throughput_per_gpu", "same_lengths",
]
