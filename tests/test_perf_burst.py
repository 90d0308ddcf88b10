"""A level as the benchmark sends it (``executors.perf.burst``): vLLM's chunked-prefill schedule of c users who
start together, checked against hand-computed steps, the scheduler's limits, the bench parser's first-wave rule,
the steady model it must approach on a long random level, and a fit that must recover known parameters."""

from __future__ import annotations

import math

import numpy as np
import pytest

from advisor.calibrate import Problem, Sample, calibrate
from advisor.job import TuningJob
from executors import place
from executors.measuring.bench_result import first_wave
from executors.perf import decode_step_time, default_params, predict, prefill_step_time
from executors.perf.burst import predict_as_sent, schedule
from search_spaces import (
    ClusterSpec,
    DeploymentConfig,
    LengthDist,
    Mode,
    Role,
    RoleConfig,
    Workload,
    model_preset,
)

MODEL = model_preset("qwen3-moe-235b")
CLUSTER = ClusterSpec(gpu="H200", nodes=1, gpus_per_node=8)
ROLE = RoleConfig(role=Role.MIXED, tensor_parallel_size=8, max_num_seqs=256, max_num_batched_tokens=8192)
CONFIG = DeploymentConfig(mode=Mode.AGGREGATED, decode=ROLE)


def workload(isl: int, osl: int, ratio: float = 0.0) -> Workload:
    return Workload(isl=LengthDist(mean=isl, range_ratio=ratio), osl=LengthDist(mean=osl, range_ratio=ratio),
                    load_levels=[1], knee_search=False)


def test_a_lockstep_level_is_one_prefill_step_then_decode_steps():
    """c = 4 prompts of 2,048 tokens fit one 8,192-token step: every request's TTFT is that step, its TPOT the
    decode step at batch 4, and the next wave repeats it (all end together) — the steady model instead mixes a
    prefill chunk into its decode steps and queues nobody."""
    wl, p, c, osl = workload(2048, 64), default_params("H200"), 4, 64
    m = predict_as_sent(place(CONFIG, CLUSTER), MODEL, wl, p, [c], [3 * c])[0]
    pf = prefill_step_time(ROLE, MODEL, CLUSTER, wl, p, tokens=c * 2048).total
    dec = decode_step_time(ROLE, MODEL, CLUSTER, wl, p, batch=c).total
    assert m.p50_ttft_ms == pytest.approx(1e3 * pf, rel=1e-9)
    assert m.p90_ttft_ms == pytest.approx(1e3 * pf, rel=1e-9)
    assert m.p50_tpot_ms == pytest.approx(1e3 * dec, rel=1e-9)
    tokens = 3 * c * (2048 + osl)
    assert m.throughput_per_gpu == pytest.approx(tokens / (3 * (pf + (osl - 1) * dec)) / 8, rel=1e-9)
    assert m.raw["level_model"] == "as sent"
    steady = predict(place(CONFIG, CLUSTER), MODEL, wl, p, [c])[0]
    assert steady.p50_tpot_ms > m.p50_tpot_ms  # the steady state pays prefill interference in its decode steps


def test_the_schedule_keeps_vllms_limits():
    """No step holds more tokens than the budget or more sequences than max_num_seqs; the KV cache bounds the
    requests running together; every request gets its first token before its last, after it arrived."""
    rng = np.random.default_rng(0)
    isl, osl = rng.integers(100, 3000, 200), rng.integers(1, 300, 200)
    seen: list[tuple[int, int, int]] = []

    def step(d: int, p: int, ps: int) -> float:
        seen.append((d, p, ps))
        return 0.01 + 1e-6 * p + 1e-4 * d

    kv = 20_000.0
    s = schedule(64, isl, osl, 1.0, budget=4096, max_seqs=32, kv_tokens=kv, step_time=step, resend_s=0.003)
    assert all(d + p <= 4096 for d, p, _ in seen)
    assert all(d + ps <= 32 for d, _, ps in seen)
    assert s.steps == len(seen) and not np.isnan(s.last).any()
    assert (s.first >= s.arrive).all() and (s.last >= s.first).all()
    # at any instant, the requests admitted and not ended fit the KV cache (each reserves its whole length)
    for t in np.unique(s.first):
        held = (s.first <= t) & (s.last >= t)
        assert float(np.sum((isl + osl)[held])) <= kv
    assert math.isclose(s.out_tokens.sum(), osl.sum())


def test_the_first_wave_left_out_is_the_bench_parsers():
    """The requests ``Schedule.first_wave`` marks are those ``executors.measuring.bench_result.first_wave`` finds in a
    benchmark's JSON of the same requests (start times, TTFTs, inter-token gaps)."""
    rng = np.random.default_rng(1)
    for c, n in ((1, 8), (8, 16), (16, 24), (32, 200)):
        isl, osl = rng.integers(500, 2500, n), rng.integers(20, 120, n)
        s = schedule(c, isl, osl, 1.0, 8192, 256, 0.0, lambda d, p, ps: 0.002 + 1e-5 * p, 0.02)
        ttft = s.first - s.arrive
        data = {"start_times": s.arrive.tolist(), "ttfts": ttft.tolist(),
                "itls": [[(e - f) / max(k - 1, 1)] * int(k - 1) for e, f, k in zip(s.last, s.first, s.out_tokens,
                                                                                     strict=True)]}
        assert np.flatnonzero(s.first_wave).tolist() == first_wave(data, c)


def test_a_long_random_level_approaches_the_steady_model():
    """With lengths ±20% and 20 × c requests the users fall out of step, and the level's throughput and P50 TPOT
    come within 5% of the steady closed loop's (two views of one step model that must agree where both hold)."""
    wl, p = workload(2048, 256, 0.2), default_params("H200")
    topo = place(CONFIG, CLUSTER)
    for c in (4, 32):
        sent = predict_as_sent(topo, MODEL, wl, p, [c], [20 * c], [True])[0]
        steady = predict(topo, MODEL, wl, p, [c])[0]
        assert sent.throughput_per_gpu == pytest.approx(steady.throughput_per_gpu, rel=0.05)
        assert sent.p50_tpot_ms == pytest.approx(steady.p50_tpot_ms, rel=0.05)


def test_a_fit_of_levels_as_sent_recovers_the_machine_that_made_them():
    """Levels made by the as-sent view of a machine unlike the defaults (HBM at half its peak, slower prefill) are
    fitted back by ``calibrate(as_sent=True)``; the steady fit of the same levels lands elsewhere (here: HBM at its
    bound and prefill at a quarter of its peak) and misses them by far more."""
    truth = default_params("H200").model_copy(update={"hbm_eff": 0.5, "mfu_prefill": 0.35})
    wl = workload(2048, 64)
    job = TuningJob.model_validate({
        "name": "burst", "model": {"preset": "qwen3-moe-235b"},
        "cluster": {"gpu": "H200", "nodes": 1, "gpus_per_node": 8},
        "workload": wl.model_dump(), "slos": [], "storage": "sqlite:///:memory:"})
    loads = [1, 8, 32]
    made = predict_as_sent(place(CONFIG, CLUSTER), MODEL, wl, truth, loads, [2 * c for c in loads])
    measured = {c: {k: getattr(m, k) for k in ("throughput_per_gpu", "p50_ttft_ms", "p50_tpot_ms")}
                for c, m in zip(loads, made, strict=True)}
    sample = Sample("burst", 0, CONFIG, job, measured, {c: 2 * c for c in loads})
    assert Problem([sample], as_sent=True).errors(truth).overall == pytest.approx(0.0, abs=1e-12)
    names = ["hbm_eff", "mfu_prefill"]
    sent = calibrate([sample], names=names, as_sent=True)
    steady = calibrate([sample], names=names)
    assert sent.params.hbm_eff == pytest.approx(0.5, rel=0.02)
    assert sent.params.mfu_prefill == pytest.approx(0.35, rel=0.02)
    assert sent.after["in_sample"].overall < 0.01
    assert steady.after["in_sample"].overall > 10 * sent.after["in_sample"].overall


def test_prompts_reach_the_engine_one_after_another_through_the_api_server():
    """With ``front_s`` (the API server's time on each prompt, ``frontend_per_prompt_token_s``) a wave sent at once
    reaches the engine one prompt per ``front_s``: the i-th prompt's first token comes (i + 1)·front_s plus its
    prefill step after the wave was sent, where without it the four share one step."""
    isl, osl = np.full(4, 2048), np.full(4, 2)
    step = lambda d, p, ps: 0.001 + 1e-6 * p  # noqa: E731
    paced = schedule(4, isl, osl, 1.0, 8192, 256, 0.0, step, 0.0, np.full(4, 0.05))
    assert (paced.first - paced.arrive).tolist() == pytest.approx([0.05 * (i + 1) + 0.003048 for i in range(4)])
    together = schedule(4, isl, osl, 1.0, 8192, 256, 0.0, step, 0.0)
    assert (together.first - together.arrive).tolist() == pytest.approx([0.001 + 4 * 2048e-6] * 4)


def test_the_api_servers_prompt_time_adds_to_ttft_and_caps_the_request_rate():
    """In the steady view a lone user's TTFT grows by exactly ISL × frontend_per_prompt_token_s (it waits behind
    nobody), and an instance serves at most 1 / (ISL × it) requests a second however many users there are."""
    wl, topo = workload(2048, 256), place(CONFIG, CLUSTER)
    p0 = default_params("H200")
    p1 = p0.model_copy(update={"frontend_per_prompt_token_s": 5e-5})  # 102.4 ms a prompt: ≤ 9.77 requests/s
    lone0, lone1 = predict(topo, MODEL, wl, p0, [1])[0], predict(topo, MODEL, wl, p1, [1])[0]
    assert lone1.p50_ttft_ms - lone0.p50_ttft_ms == pytest.approx(102.4, rel=1e-6)
    busy0, busy1 = predict(topo, MODEL, wl, p0, [256])[0], predict(topo, MODEL, wl, p1, [256])[0]
    assert busy0.request_throughput > 15.0
    assert busy1.request_throughput <= 1.0 / 0.1024 + 1e-9
    sent = predict_as_sent(topo, MODEL, wl, p1, [256], [512])[0]
    assert sent.request_throughput <= 1.0 / 0.1024 * 1.01


def test_a_knee_search_predicted_as_sent_walks_levels_as_sent():
    """``predicted_plan(as_sent=True)`` (a real trial on a profile fitted as sent): every level the model's own knee
    search made, and the curve the search aims by, are levels as the benchmark sends them, and its start is that
    search's knee — not the steady one's."""
    from executors.measuring.loop import MeasurePlan, knee_of
    from executors.simulated.executor import levels_as_sent, model_levels, predicted_plan
    from search_spaces import SLO

    wl = Workload(isl=LengthDist(mean=2048, range_ratio=0.2), osl=LengthDist(mean=256, range_ratio=0.2),
                  load_levels=[], knee_search=True, max_load=512)
    slos = (SLO(metric="p90_ttft_ms", op="<=", value=2000.0), SLO(metric="p90_tokens_per_s_per_user", op=">=",
                                                                  value=30.0))
    topo, p = place(CONFIG, CLUSTER), default_params("H200")
    plan = predicted_plan(topo, MODEL, wl, slos, p, as_sent=True)
    levels = model_levels(topo, MODEL, wl, MeasurePlan(slos), p, as_sent=True)
    assert levels and {m.raw["level_model"] for m in levels} == {"as sent"}
    assert plan.start == knee_of(levels).load
    steady = predicted_plan(topo, MODEL, wl, slos, p)
    assert steady.start != plan.start
    c = int(plan.curve.loads[len(plan.curve.loads) // 2])
    again = levels_as_sent(topo, MODEL, wl, p, [c])[0]
    assert plan.curve.at("p90_tokens_per_s_per_user", c) == pytest.approx(again.p90_tokens_per_s_per_user)
