"""The performance model: the seed report's lessons as directions, monotonic sanity, robustness, speed."""

from __future__ import annotations

import json
import math
import random

import pytest

from benchmarks.seed_scenario import AGENTIC, DSV3_FP4, GB300, A, decode, pd, prefill
from executors import place
from executors.perf import (
    CALIBRATABLE,
    PerfParams,
    decode_step_time,
    decode_throughput_per_gpu,
    default_params,
    expected_max_z,
    predict,
    prefill_step_time,
    prefill_throughput_per_gpu,
)
from executors.simulated.executor import SimulatedExecutor
from search_spaces import (
    ClusterSpec,
    DeploymentConfig,
    LengthDist,
    Measurement,
    Mode,
    Role,
    RoleConfig,
    SearchSpace,
    Workload,
    check,
    load_preset,
    model_preset,
    preset_names,
)

DSV3_FP8 = model_preset("deepseek-v3")
H200 = ClusterSpec(gpu="H200", nodes=4, gpus_per_node=8)


def run(cfg: DeploymentConfig, cluster: ClusterSpec = GB300, model=DSV3_FP4,
        wl: Workload = AGENTIC) -> list[Measurement]:
    assert not check(cfg, model, cluster, wl.max_model_len), check(cfg, model, cluster, wl.max_model_len)
    return predict(place(cfg, cluster), model, wl, default_params(cluster.gpu))


# ------------------------------------------------------------------ the seed's lessons
def test_small_dep_prefill_beats_dep4_per_gpu():
    """Seed: DEP2 64.4K vs DEP4 53.3K prefill tok/s/GPU at concurrency 256 (ratio 1.21), same GPUs."""
    dep2 = prefill_throughput_per_gpu(prefill(2, 4), DSV3_FP4, GB300, AGENTIC, concurrency=256)
    dep4 = prefill_throughput_per_gpu(prefill(4, 2), DSV3_FP4, GB300, AGENTIC, concurrency=256)
    t2, t4 = dep2["input_tokens_per_s_per_gpu"], dep4["input_tokens_per_s_per_gpu"]
    assert 1.08 <= t2 / t4 <= 1.35
    # same order of magnitude as the seed's numbers
    for got, seed in ((t2, 64_400), (t4, 53_300)):
        assert seed / 4 <= got <= seed * 3


def test_dp_imbalance_explains_part_of_the_dep4_loss():
    """Seed: replay attributed a 13.6% DEP4 throughput loss to DP imbalance."""
    def loss(dp: int, inst: int) -> float:
        real = prefill_throughput_per_gpu(prefill(dp, inst), DSV3_FP4, GB300, AGENTIC, concurrency=256)
        ideal = prefill_throughput_per_gpu(prefill(dp, inst), DSV3_FP4, GB300, AGENTIC, concurrency=256,
                                           imbalance=False)
        return 1 - real["input_tokens_per_s_per_gpu"] / ideal["input_tokens_per_s_per_gpu"]

    l2, l4 = loss(2, 4), loss(4, 2)
    assert 0.08 <= l4 <= 0.20  # the seed's 13.6%, within calibration slack
    assert l2 < l4
    assert prefill_throughput_per_gpu(prefill(4, 2), DSV3_FP4, GB300, AGENTIC, concurrency=256)["dp_imbalance"] > 1.05


def test_small_dep_prefill_in_a_full_pd_deployment():
    """The same direction through predict: a P/D deployment with DEP2 prefill reports more prefill tok/s/GPU."""
    d = decode(16, eplb=32, max_num_seqs=128)
    m2 = run(pd(prefill(2, 4), d))[0].raw["prefill_input_tokens_per_s_per_gpu"]
    m4 = run(pd(prefill(4, 2), d))[0].raw["prefill_input_tokens_per_s_per_gpu"]
    assert m2 > 1.05 * m4


@pytest.mark.parametrize("batch", [128, 256])
def test_wide_ep_decode_scales_with_eplb(batch):
    """Seed: Wide-EP decode scales well with EPLB — EPLB (+32 redundant experts) helps, more so when wider."""
    gains = []
    for ep in (16, 32, 48):
        off = decode_throughput_per_gpu(decode(ep), DSV3_FP4, GB300, AGENTIC, batch=batch)
        on = decode_throughput_per_gpu(decode(ep, eplb=32), DSV3_FP4, GB300, AGENTIC, batch=batch)
        assert on["expert_imbalance"] < off["expert_imbalance"]
        gains.append(on["output_tokens_per_s_per_gpu"] / off["output_tokens_per_s_per_gpu"] - 1)
    # Wide (EP32/48) always gains; at EP16 the replicas' extra weight reads can cancel the gain at small
    # batches (the model's prediction, to be checked on hardware), but never cost more than 1%.
    assert gains[1] > 0 and gains[2] > 0 and gains[0] > -0.01, gains
    assert gains[0] < gains[1] < gains[2], gains


def test_with_eplb_wide_ep_keeps_its_per_gpu_throughput():
    """With EPLB, EP48 loses little per GPU against EP16 at the same per-rank batch; without, it loses more."""
    def tput(ep: int, eplb: int | None) -> float:
        return decode_throughput_per_gpu(decode(ep, eplb=eplb), DSV3_FP4, GB300, AGENTIC, batch=256)[
            "output_tokens_per_s_per_gpu"]

    assert tput(48, 32) / tput(16, 32) > tput(48, None) / tput(16, None)
    assert tput(48, 32) / tput(16, 32) > 0.9


def test_cpu_overhead_grows_with_dp_size():
    """Seed: CPU overhead becomes critical at NVL72 scale — the API server sees the whole instance."""
    small = decode_step_time(decode(8), DSV3_FP4, GB300, AGENTIC, batch=256)
    wide = decode_step_time(decode(48, eplb=32), DSV3_FP4, GB300, AGENTIC, batch=256)
    assert wide.frontend > 5 * small.frontend
    assert wide.overhead > small.overhead
    slow_cpu = PerfParams(frontend_per_token_s=10e-6)
    capped = decode_step_time(decode(48, eplb=32), DSV3_FP4, GB300, AGENTIC, slow_cpu, batch=256)
    assert capped.total == pytest.approx(capped.frontend)  # the API server bounds the step


def test_aggregated_prefill_stalls_decode():
    """Aggregated DEP: any rank's prefill chunk stalls every rank's decode step (P/D interference)."""
    mixed = RoleConfig(role=Role.MIXED, data_parallel_size=16, enable_expert_parallel=True, max_num_seqs=128,
                       all2all_backend=A.DEEPEP_LOW_LATENCY)
    agg = DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed)
    dis = pd(prefill(2, 4), decode(8, max_num_seqs=128))
    ma, md = run(agg)[1], run(dis)[1]
    assert ma.raw["stall_share"] > 0.3
    assert ma.p99_itl_ms > 5 * md.p99_itl_ms
    assert ma.p90_tokens_per_s_per_user < md.p90_tokens_per_s_per_user


# ------------------------------------------------------------------ monotonic sanity
def test_concurrency_raises_throughput_and_lowers_speed_per_user():
    wl = AGENTIC.model_copy(update={"load_levels": [16, 64, 256, 1024, 4096, 16384]})
    ms = run(pd(prefill(2, 8), decode(16, eplb=32, max_num_seqs=128)), wl=wl)
    tput = [m.throughput_per_gpu for m in ms]
    user = [m.p50_tokens_per_s_per_user for m in ms]
    ttft = [m.p50_ttft_ms for m in ms]
    for a, b in zip(tput, tput[1:]):
        assert b >= a * 0.999
    for a, b in zip(user, user[1:]):
        assert b <= a * 1.001
    assert tput[-1] > 3 * tput[0]
    assert tput[-1] == pytest.approx(tput[-2], rel=0.05)  # saturated
    assert ttft[-1] > 10 * ttft[0]  # the excess waits


def test_aggregated_concurrency_monotonic():
    mixed = RoleConfig(role=Role.MIXED, data_parallel_size=8, enable_expert_parallel=True, max_num_seqs=64,
                       all2all_backend=A.DEEPEP_LOW_LATENCY)
    wl = AGENTIC.model_copy(update={"load_levels": [8, 32, 128, 512, 2048]})
    ms = run(DeploymentConfig(mode=Mode.AGGREGATED, decode=mixed), wl=wl)
    for a, b in zip(ms, ms[1:]):
        assert b.throughput_per_gpu >= a.throughput_per_gpu * 0.999
        assert b.p50_tokens_per_s_per_user <= a.p50_tokens_per_s_per_user * 1.001


def test_more_instances_same_shape_same_per_gpu():
    wl1 = AGENTIC.model_copy(update={"load_levels": [256, 1024]})
    wl2 = AGENTIC.model_copy(update={"load_levels": [512, 2048]})
    one = run(pd(prefill(2, 4), decode(16, 1, eplb=32, max_num_seqs=128)), wl=wl1)
    two = run(pd(prefill(2, 8), decode(16, 2, eplb=32, max_num_seqs=128)), wl=wl2)
    assert two[0].gpus == 2 * one[0].gpus
    for a, b in zip(one, two):
        assert b.throughput_per_gpu == pytest.approx(a.throughput_per_gpu, rel=0.05)
        assert b.p50_tpot_ms == pytest.approx(a.p50_tpot_ms, rel=0.05)


def test_h200_slower_than_gb300():
    cfg = pd(prefill(8, 2), decode(16, max_num_seqs=128))
    wl = AGENTIC.model_copy(update={"isl": LengthDist(mean=2048, range_ratio=0.8), "prefix_reuse": 0.0})
    gb = run(cfg, GB300, DSV3_FP8, wl)
    h = run(cfg, H200, DSV3_FP8, wl)
    for a, b in zip(gb, h):
        assert b.throughput_per_gpu < a.throughput_per_gpu
        assert b.p50_tpot_ms > a.p50_tpot_ms
    p_gb = prefill_step_time(prefill(8), DSV3_FP8, GB300, wl)
    p_h = prefill_step_time(prefill(8), DSV3_FP8, H200, wl)
    assert p_h.total > 1.5 * p_gb.total


def test_step_time_grows_with_batch_and_context():
    r = decode(16, eplb=32)
    t = [decode_step_time(r, DSV3_FP4, GB300, AGENTIC, batch=b).total for b in (1, 8, 64, 256)]
    assert t == sorted(t)
    short = AGENTIC.model_copy(update={"isl": LengthDist(mean=1024, range_ratio=0.8)})
    assert decode_step_time(r, DSV3_FP4, GB300, short, batch=64).attention < \
        decode_step_time(r, DSV3_FP4, GB300, AGENTIC, batch=64).attention


def test_prefix_reuse_cuts_prefill_work():
    cold = AGENTIC.model_copy(update={"prefix_reuse": 0.0})
    warm = prefill_throughput_per_gpu(prefill(2, 4), DSV3_FP4, GB300, AGENTIC, concurrency=256)
    cold_t = prefill_throughput_per_gpu(prefill(2, 4), DSV3_FP4, GB300, cold, concurrency=256)
    assert warm["input_tokens_per_s_per_gpu"] > 1.5 * cold_t["input_tokens_per_s_per_gpu"]


def test_dbo_hides_all_to_all():
    off = prefill_step_time(prefill(8), DSV3_FP4, GB300, AGENTIC)
    on = prefill_step_time(prefill(8, enable_dbo=True), DSV3_FP4, GB300, AGENTIC)
    assert on.exposed_comm < off.exposed_comm
    assert on.total < off.total


def test_scale_out_all_to_all_costs_more_than_nvlink():
    inside = decode_step_time(decode(8), DSV3_FP8, H200, AGENTIC, batch=64)
    across = decode_step_time(decode(16), DSV3_FP8, H200, AGENTIC, batch=64)
    assert across.comm > 2 * inside.comm


def test_expected_max_z():
    assert expected_max_z(1) == 0.0
    assert expected_max_z(2) == pytest.approx(0.564, abs=0.03)
    assert expected_max_z(4) == pytest.approx(1.029, abs=0.03)
    assert expected_max_z(32) == pytest.approx(2.07, abs=0.04)
    assert expected_max_z(8) < expected_max_z(16) < expected_max_z(64)


# ------------------------------------------------------------------ robustness
def test_kv_capacity_caps_the_batch():
    """A 32K-token workload on H200: KV fits ~16 sequences per rank, far below max-num-seqs 512."""
    wl = Workload(isl=LengthDist(mean=32768, range_ratio=0.1), osl=LengthDist(mean=1024, range_ratio=0.1),
                  load_levels=[64, 512, 4096])
    cfg = pd(prefill(8, 3), decode(8, max_num_seqs=512))
    ms = run(cfg, H200, DSV3_FP8, wl)
    cap = ms[0].raw["decode_batch_cap"]
    assert cap < 40
    assert ms[1].raw["decode_batch_per_rank"] == pytest.approx(cap)  # full, not over
    assert ms[0].raw["decode_batch_cap_kv"] == pytest.approx(cap)
    for m in ms:
        assert m.raw["decode_batch_per_rank"] <= cap + 1e-6
        assert math.isfinite(m.throughput_per_gpu) and m.throughput_per_gpu > 0
    assert ms[2].throughput_per_gpu == pytest.approx(ms[1].throughput_per_gpu, rel=0.1)
    assert ms[2].p50_ttft_ms > ms[1].p50_ttft_ms  # capped: the rest waits


def _preset(name: str):
    d = load_preset(name)
    model = model_preset(d["model"]["preset"]).model_copy(update={k: v for k, v in d["model"].items() if k != "preset"})
    return model, ClusterSpec(**d["cluster"]), Workload(**d["workload"]), SearchSpace.model_validate(d["space"])


@pytest.mark.parametrize("name", preset_names())
def test_predict_is_finite_and_complete_on_every_preset(name):
    model, cluster, wl, space = _preset(name)
    rng = random.Random(0)
    valid = [c for _, c in space.enumerate() if rng.random() < 0.05 or name == "cpu-tiny-moe"]
    valid = [c for c in valid if not check(c, model, cluster, wl.max_model_len)][:300]
    assert valid
    numeric = [f for f, info in Measurement.model_fields.items() if info.annotation in ("float | None", float | None)]
    for cfg in valid:
        ms = predict(place(cfg, cluster), model, wl)
        assert [m.concurrency for m in ms] == wl.load_levels
        for m in ms:
            assert m.source == "simulated" and m.gpus == cfg.total_gpus
            assert m.completed == m.num_requests == wl.num_prompts(m.concurrency)
            for f in ("throughput_per_gpu", "output_throughput_per_gpu", "request_throughput",
                      "p50_tokens_per_s_per_user", "p90_tokens_per_s_per_user", "p99_tokens_per_s_per_user",
                      "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
                      "p50_itl_ms", "p90_itl_ms", "p99_itl_ms", "p50_e2el_ms", "p90_e2el_ms", "p99_e2el_ms",
                      "dp_imbalance"):
                v = getattr(m, f)
                assert v is not None and math.isfinite(v) and v > 0, (f, v, cfg.describe())
            for f in numeric:
                v = getattr(m, f)
                assert v is None or (math.isfinite(v) and v >= 0), (f, v)
            assert m.p50_ttft_ms <= m.p90_ttft_ms <= m.p99_ttft_ms
            assert m.p50_tpot_ms <= m.p90_tpot_ms <= m.p99_tpot_ms
            assert m.p50_e2el_ms <= m.p90_e2el_ms <= m.p99_e2el_ms
            assert m.p50_tokens_per_s_per_user >= m.p90_tokens_per_s_per_user >= m.p99_tokens_per_s_per_user
            assert m.p90_tokens_per_s_per_user == pytest.approx(1000 / m.p90_tpot_ms)
            Measurement.model_validate(m.model_dump())  # a real, valid Measurement
            json.dumps(m.raw)


# ------------------------------------------------------------------ params, executor, speed
def test_params_vector_round_trip(tmp_path):
    p = default_params("GB300")
    v = p.to_vector()
    assert len(v) == len(CALIBRATABLE) == len(PerfParams.bounds())
    for x, (lo, hi) in zip(v, PerfParams.bounds()):
        assert lo <= x <= hi
    assert PerfParams.from_vector(v) == p
    q = PerfParams.from_vector([0.3], base=p, names=["mfu_prefill"])
    assert q.mfu_prefill == 0.3 and q.hbm_eff == p.hbm_eff
    path = tmp_path / "params.json"
    q.save(path)
    assert PerfParams.load(path) == q
    with pytest.raises(ValueError):
        PerfParams(mfu_prefill=2.0)
    assert default_params("H200") != default_params("GB300")
    assert default_params("unknown-gpu") == PerfParams()


def test_calibrated_params_change_predictions():
    cfg = pd(prefill(2, 4), decode(16, eplb=32, max_num_seqs=128))
    base = run(cfg)[1]
    slow = predict(place(cfg, GB300), DSV3_FP4, AGENTIC, default_params("GB300").model_copy(
        update={"attn_eff_decode": 0.25}))[1]
    assert slow.p50_tpot_ms > base.p50_tpot_ms


def test_simulated_executor_contract():
    ex = SimulatedExecutor(DSV3_FP4)
    assert ex.kind == "simulated" and ex.engine_version
    topo = place(pd(prefill(2, 4), decode(16, eplb=32)), GB300)
    res = ex.evaluate(topo, AGENTIC)
    assert res.ok and len(res.measurements) == len(AGENTIC.load_levels)
    assert res.resources == {}
    assert all(m.source == "simulated" for m in res.measurements)
    custom = SimulatedExecutor(DSV3_FP4, PerfParams(hbm_eff=0.4)).evaluate(topo, AGENTIC)
    assert custom.measurements[0].p50_tpot_ms > res.measurements[0].p50_tpot_ms
