"""A level as ``vllm bench serve --max-concurrency c`` sends it: ``c`` requests at once, each replaced the moment
it ends, scheduled step by step as vLLM's scheduler does — where the closed-loop model (``perf.levels``) has a
steady state of randomly phased users.

Why a second view of a level: a measured level is short (2 × c requests), and its users are never randomly
phased. The ``c`` requests of the first wave arrive together and their prefills queue behind each other; with fixed
lengths (a profile's probes) the loop then stays in lockstep — each wave's prefills run together, then its decodes
alone — so a decode probe's TPOT is the decode-only step and its TTFT the queue of ``c`` prefills. The steady state
puts a prefill chunk into every ``1/f`` decode steps instead. Fitted to the lockstep probes, the steady model had
to bend its step terms: on the DeepSeek-V3-width profile (H200) decode at c = 16 read P50 TPOT 3.8 ms
(5 layers) where the model's steady state with the defaults says 10.0 ms, and the fit drove ``cpu_per_seq_s``
to 72x its default. A profile's fit and a check held to measured levels compare like with like here; the guide
still ranks candidates by the steady state (fast over thousands of candidates, and the load the user will serve).

How: an event clock steps through the level as vLLM V1's scheduler does with chunked prefill — running requests
first (a decode token each, or their next prefill chunk), then waiting requests admitted in arrival order while the
token budget, ``max_num_seqs`` and the KV cache (each request's whole length reserved) allow; a request's first
token comes at the end of the step that completes its prompt. Each step lasts what the step model (``perf.step._step``)
says for its decodes and prefill tokens (kept per distinct step within a level), and a user's next request reaches
the server ``request_latency_s`` after its last ended and the engine once the API server has worked through the
prompts sent before it (``frontend_per_prompt_token_s`` a token: a wave sent at once reaches the engine prompt by
prompt), so which requests share a step depends on the parameters (a
fit runs every level's schedule at each evaluation: 0.5–5 minutes to fit a stored GPU profile's 11–14 levels on
2 cores, where the steady view takes seconds — fine for a profile, not for the guide's thousands of candidates). Lengths
are drawn as vLLM's random dataset draws them (uniform within ``range_ratio``), from a fixed seed.

Limits: one DP rank of one instance (more ranks or instances: each simulated with its share of the users, no
lockstep between ranks); no preemption; the client's time between a request's end and its successor's start is
``request_latency_s`` (the way in and out: TTFT and E2E latency carry it once); MTP as whole accepted tokens per step;
aggregated deployments only (P/D levels keep the steady model).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from executors.perf.levels import Batch
from executors.perf.params import PerfParams, default_params
from executors.perf.step import _decode_cv, _step
from search_spaces import PERCENTILES, Measurement, ModelProfile, Workload

if TYPE_CHECKING:
    from executors.topology import Topology

#: The two views of a level (``raw["level_model"]``, a profile's ``level_model``): as the benchmark sent it, and the
#: steady closed loop of ``perf.levels``.
AS_SENT = "as sent"
STEADY = "steady"

#: Seed of the lengths a simulated level draws (fixed: a parameter fit needs the same level at every evaluation).
LENGTH_SEED = 20261205


@dataclass(frozen=True)
class Schedule:
    """When each request of a simulated level reached the server, got its first token and its last (seconds from
    the level's start, server side), its lengths, and the steps the server ran."""

    arrive: np.ndarray
    first: np.ndarray
    last: np.ndarray
    isl: np.ndarray  # prompt tokens per request
    out_tokens: np.ndarray  # output tokens per request
    concurrency: int
    steps: int

    @property
    def first_wave(self) -> np.ndarray:
        """The requests sent at once as the level began, as ``executors.measuring.bench_result.first_wave`` leaves them
        out: at most the ``c`` earliest and half the run; none below c = 2."""
        n = len(self.arrive)
        if self.concurrency < 2:
            return np.zeros(n, dtype=bool)
        return np.arange(n) < min(self.concurrency, n // 2)


def lengths(mean: float, range_ratio: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` lengths as vLLM's random dataset draws them: uniform integers in [mean·(1−r), mean·(1+r)]."""
    lo, hi = max(int(mean * (1.0 - range_ratio)), 1), max(int(mean * (1.0 + range_ratio)), 1)
    return rng.integers(lo, hi + 1, size=n) if hi > lo else np.full(n, lo)


def schedule(c: int, isl: np.ndarray, osl: np.ndarray, acc: float, budget: int, max_seqs: int, kv_tokens: float,
             step_time: Callable[[int, int, int], float], resend_s: float,
             front_s: np.ndarray | None = None) -> Schedule:
    """vLLM V1's chunked-prefill schedule of a closed loop of ``c`` users sending ``len(isl)`` requests: the
    ``i``-th has ``isl[i]`` prompt and ``osl[i]`` output tokens (``acc`` of them per decode step after the first)
    and reserves its whole length in the KV cache (``kv_tokens`` per rank; ≤ 0: unbounded); a step holds at most
    ``budget`` tokens and ``max_seqs`` sequences and lasts ``step_time(decodes, prefill tokens, prefill
    sequences)``; a user's next request reaches the server ``resend_s`` after its last one ended; ``front_s[i]``
    (default none) is the time the API server spends on request ``i`` before the engine sees it, one request after
    another (``frontend_per_prompt_token_s``).

    The delay matters: on the H200 (c = 16) a wave's requests ended 2.6-ms decode steps apart and the client
    sent each successor at once, but the first new prompt reached the engine only after the other groups' last
    decode steps had run, so the next wave queued for its prefills together (P50 TTFT 0.23 s where one prefill step
    is 0.06 s). With no delay each group's successors would be prefilled in the step after it ended."""
    requests = len(isl)
    osl_steps = np.ceil(np.maximum(osl - 1, 0) / acc).astype(np.int64)
    reserve = (isl + osl).astype(float)
    kv = kv_tokens if kv_tokens > 0 else math.inf
    arrive = np.full(requests, math.inf)  # at the server (the API server)
    arrive[:min(c, requests)] = 0.0
    front = front_s if front_s is not None else np.zeros(requests)
    engine = np.full(requests, math.inf)  # at the engine: through the API server in arrival order
    free = 0.0  # when the API server is next free
    for r in range(min(c, requests)):
        engine[r] = free = max(arrive[r], free) + front[r]
    first = np.full(requests, math.nan)
    last = np.full(requests, math.nan)
    left = isl.astype(np.int64).copy()  # prompt tokens still to prefill
    steps_left = osl_steps.copy()
    waiting: deque[int] = deque()
    pending: list[int] = list(range(min(c, requests)))  # sent, not yet at the engine (sorted by arrival)
    running: list[int] = []
    nxt, done, kv_used, now, steps = min(c, requests), 0, 0.0, 0.0, 0
    while done < requests:
        while pending and engine[pending[0]] <= now:
            waiting.append(pending.pop(0))
        if not running and not waiting:
            if not pending:
                break
            now = float(engine[pending[0]])  # idle until the next request arrives
            continue
        room, d, p, ps = budget, 0, 0, 0
        prefilled: list[int] = []
        decoded: list[int] = []
        for r in running:  # running requests first: a decode token each, or the next chunk of a started prompt
            if room <= 0:
                break
            if left[r] == 0:
                decoded.append(r)
                d += 1
                room -= 1
            else:
                t = min(int(left[r]), room)
                left[r] -= t
                p, ps, room = p + t, ps + 1, room - t
                if left[r] == 0:
                    prefilled.append(r)
        while waiting and room > 0 and len(running) < max_seqs and kv_used + reserve[waiting[0]] <= kv:
            r = waiting.popleft()
            running.append(r)
            kv_used += reserve[r]
            t = min(int(left[r]), room)
            left[r] -= t
            p, ps, room = p + t, ps + 1, room - t
            if left[r] == 0:
                prefilled.append(r)
        if not running:  # nothing fits (a request larger than the KV cache): stop rather than spin
            break
        now += step_time(d, p, ps)
        steps += 1
        ended: list[int] = []
        for r in prefilled:  # the step that completes a prompt samples its first token
            first[r] = now
            if steps_left[r] <= 0:
                ended.append(r)
        for r in decoded:
            steps_left[r] -= 1
            if steps_left[r] <= 0:
                ended.append(r)
        for r in ended:
            last[r] = now
            running.remove(r)
            kv_used -= reserve[r]
            done += 1
            if nxt < requests:  # the user sends its next request
                arrive[nxt] = now + resend_s
                engine[nxt] = free = max(arrive[nxt], free) + front[nxt]
                pending.append(nxt)
                nxt += 1
    return Schedule(arrive, first, last, isl.astype(float), 1.0 + osl_steps * acc, c, steps)


def _pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if len(x) else None


def predict_as_sent(topology: Topology, model: ModelProfile, workload: Workload, params: PerfParams | None,
                    levels: Sequence[int], requests: Sequence[int] | None = None,
                    first_wave_out: Sequence[bool] | None = None) -> list[Measurement]:
    """The Measurement of each concurrency of ``levels`` as the benchmark sends it (``requests[i]`` requests;
    default the workload's count), its latencies without the first wave where ``first_wave_out[i]`` (as the bench
    parser leaves it out, ``executors.measuring.bench_result.first_wave``). Fields the simulation does not produce (ITL,
    the raw breakdown) are the steady model's; ``raw["level_model"]`` says which view made the level."""
    p = params or default_params(topology.cluster.gpu)
    batch = Batch([topology], model, workload, p)
    cs = [max(1, int(c)) for c in levels]
    steady = batch.predict([(0, float(c)) for c in cs], workload)
    if len(batch.agg) == 0:
        return steady  # type: ignore[return-value]
    R = batch.Ra.take(np.zeros(1, dtype=int))
    wd = batch.wd
    cfg = topology.config.decode
    ranks = cfg.instances * cfg.data_parallel_size
    acc = float(R.acc[0])
    times: dict[tuple[int, int, int], float] = {}

    def step_time(d: int, pf: int, ps: int) -> float:
        """One step's time by the step model (``perf.step._step``), kept per (decodes, prefill tokens, sequences)."""
        key = (d, pf, ps)
        t = times.get(key)
        if t is None:
            b = np.array([float(d)])
            t = times[key] = float(_step(R, b, np.array([float(pf)]), np.array([float(ps)]), _decode_cv(R, b),
                                         np.ones(1))[0][0])
        return t

    out: list[Measurement] = []
    for i, c in enumerate(cs):
        n = int(requests[i]) if requests else workload.num_prompts(c)
        c_rank, n_rank = max(1, math.ceil(c / ranks)), max(1, math.ceil(n / ranks))
        rng = np.random.default_rng(LENGTH_SEED)
        isl = lengths(wd.isl_new, wd.r_i, n_rank, rng)
        osl = lengths(wd.osl, wd.r_o, n_rank, rng)
        # the instance's one API server takes every rank's prompts: a rank's share of it runs dp x as long
        front = isl * (wd.isl / wd.isl_new) * p.frontend_per_prompt_token_s * cfg.data_parallel_size
        sch = schedule(c_rank, isl, osl, acc, int(R.mnbt[0]), int(R.mns[0]), float(R.kv_cap[0]), step_time,
                       p.request_latency_s, front)
        out.append(_measured(steady[i], sch, p, wd.isl / wd.isl_new, ranks, topology.gpus,
                             bool(first_wave_out[i]) if first_wave_out else False))
    return out


def _measured(base: Measurement, sch: Schedule, p: PerfParams, isl_scale: float, ranks: int, gpus: int,
              wave_out: bool) -> Measurement:
    """``base`` (the steady model's level) with what a benchmark of the simulated schedule ``sch`` measures: the
    client sees each request ``request_latency_s`` later than the server holds it (its way in and out)."""
    if sch.steps == 0 or np.isnan(sch.last).any():
        return base
    lat = p.request_latency_s
    ttft = sch.first - sch.arrive + lat
    e2e = sch.last - sch.arrive + lat
    n = len(sch.arrive)
    wall = float(np.max(sch.last)) + lat
    keep = ~sch.first_wave if wave_out else np.ones(n, dtype=bool)
    multi = keep & (sch.out_tokens > 1.0)
    tpot = (e2e - ttft)[multi] / (sch.out_tokens[multi] - 1.0)
    tokens_in = float(np.sum(sch.isl)) * isl_scale
    tokens_out = float(np.sum(sch.out_tokens))
    upd: dict[str, object] = {
        "throughput_per_gpu": (tokens_in + tokens_out) * ranks / wall / gpus,
        "output_throughput_per_gpu": tokens_out * ranks / wall / gpus,
        "request_throughput": n * ranks / wall,
        "raw": {**base.raw, "level_model": AS_SENT, "simulated_steps": sch.steps},
    }
    for q in PERCENTILES:
        tp = _pct(tpot * 1e3, q)
        upd[f"p{q}_ttft_ms"], upd[f"p{q}_e2el_ms"] = _pct(ttft[keep] * 1e3, q), _pct(e2e[keep] * 1e3, q)
        upd[f"p{q}_tpot_ms"], upd[f"p{q}_tokens_per_s_per_user"] = tp, (1000.0 / tp if tp else None)
    return base.model_copy(update=upd)
