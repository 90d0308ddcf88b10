"""TP × DP without expert parallelism — vLLM's "data-parallel attention with tensor-parallel experts".

(a) A space that searches ``expert_parallel: [true, false]`` enumerates TP-expert candidates; the rules
    spread their experts over all TP × DP GPUs (memory), accept them where that fits, refuse them where it
    does not (``memory-fit``), and apply vLLM's own shard rules (``tp-experts-divide-intermediate``,
    ``tp-experts-fp8-block``).
(b) Such a candidate renders without ``--enable-expert-parallel`` (and without ``--all2all-backend``) and
    parses with vLLM's own ``vllm serve`` parser into the TP and DP sizes it meant, on one node and across
    two.
(c) The performance model: finite, positive numbers; no expert imbalance and no EPLB effect; the same
    communication as EP with all-gather/reduce-scatter (so never slower than it, faster where experts are
    compute-bound); more communication than DeepEP high-throughput (it moves every token to every DP
    rank); the narrow-GEMM factor exactly where the per-GPU expert width is below
    ``expert_shard_min_width``. Reasons from docs/performance-model.md §3 "TP experts".
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CPU build of vLLM (CI) needs it before import

import math

import pytest

from executors import Endpoint, gpu_platform, place, serve_args
from executors.perf import (
    PerfParams,
    decode_throughput_per_gpu,
    default_params,
    predict,
    prefill_throughput_per_gpu,
)
from search_spaces import (
    All2AllBackend,
    ClusterSpec,
    DeploymentConfig,
    EPLBConfig,
    Mode,
    Role,
    RoleConfig,
    SearchSpace,
    Workload,
    check,
    model_preset,
    weight_bytes_per_gpu,
)
from tests.vllm_parser import parse_serve_args

H200x2 = ClusterSpec(gpu="H200", nodes=2, gpus_per_node=8)
H200x4 = ClusterSpec(gpu="H200", nodes=4, gpus_per_node=8)
DSV3 = model_preset("deepseek-v3")  # FP8, moe_intermediate_size 2048
QWEN = model_preset("qwen3-moe-235b")  # BF16, moe_intermediate_size 1536
WL = Workload(dataset="random", isl={"mean": 2048, "range_ratio": 0.8}, osl={"mean": 512, "range_ratio": 0.8},
              load_levels=[64, 256])
MAX_LEN = WL.max_model_len

SPACE = SearchSpace.model_validate({
    "modes": ["aggregated"],
    "mixed": {"tp_sizes": [1, 2], "dp_sizes": [1, 4], "expert_parallel": [True, False]},
})


def _agg(role: RoleConfig) -> DeploymentConfig:
    return DeploymentConfig(mode=Mode.AGGREGATED, decode=role.model_copy(update={"role": Role.MIXED}))


def _mixed(**kw) -> RoleConfig:
    return RoleConfig(role=Role.MIXED, **kw)


def _by_shape(space: SearchSpace) -> dict[tuple[int, int, bool], tuple[dict, DeploymentConfig]]:
    out = {}
    for params, cfg in space.enumerate():
        r = cfg.decode
        out[(r.tensor_parallel_size, r.data_parallel_size, r.enable_expert_parallel)] = (params, cfg)
    return out


# --------------------------------------------------------------------------------------------- (a) rules
def test_space_enumerates_tp_experts_and_the_rules_judge_them_by_memory() -> None:
    cands = _by_shape(SPACE)
    # every TP × DP with both answers to the EP question, and no EP question where there is one GPU
    assert set(cands) == {(1, 1, False), (1, 4, True), (1, 4, False), (2, 1, True), (2, 1, False),
                          (2, 4, True), (2, 4, False)}
    params, tp_experts = cands[(2, 4, False)]
    assert params["mixed_ep"] is False and "mixed_all2all" not in params and "mixed_eplb" not in params
    role = tp_experts.decode
    assert role.shape == "TP2×DP4" and role.ep_size == 1
    assert "experts sharded over 8 GPUs" in tp_experts.describe()
    assert cands[(1, 4, False)][1].decode.shape == "DP4 TP-experts"

    # 671 GB of FP8 weights: experts over 8 GPUs (TP2 × DP4) fit an H200 …
    assert check(tp_experts, DSV3, H200x2, MAX_LEN) == []
    # … because the experts are split over TP × DP, exactly as EP splits them (not over TP alone)
    ep = cands[(2, 4, True)][1].decode
    assert weight_bytes_per_gpu(role, DSV3) == pytest.approx(weight_bytes_per_gpu(ep, DSV3))
    tp_only = weight_bytes_per_gpu(cands[(2, 1, False)][1].decode, DSV3)
    dense = DSV3.non_expert_params * DSV3.weight_bytes / 2
    assert weight_bytes_per_gpu(role, DSV3) - dense == pytest.approx((tp_only - dense) / 4)
    # … over 4 GPUs (DP4 TP-experts) they do not, and the rule says which
    small = cands[(1, 4, False)][1]
    rules = {v.rule: v.reason for v in check(small, DSV3, H200x2, MAX_LEN)}
    assert set(rules) == {"memory-fit"} and "GiB of weights per GPU" in rules["memory-fit"]


def test_fp8_block_rule_caps_how_wide_fp8_experts_are_sharded() -> None:
    # DeepSeek-V3 FP8: 2048 / 16 = 128 (one block) is allowed; 2048 / 32 = 64 is not
    assert not {v.rule for v in check(_agg(_mixed(data_parallel_size=16)), DSV3, H200x4, MAX_LEN)}
    rules = {v.rule: v.reason for v in check(_agg(_mixed(data_parallel_size=32)), DSV3, H200x4, MAX_LEN)}
    assert "tp-experts-fp8-block" in rules and "64" in rules["tp-experts-fp8-block"]
    # with expert parallelism the same 32 GPUs hold whole experts: no shard, no block rule
    ep32 = _agg(_mixed(data_parallel_size=32, enable_expert_parallel=True))
    assert "tp-experts-fp8-block" not in {v.rule for v in check(ep32, DSV3, H200x4, MAX_LEN)}
    # vllm-project/vllm#17569: Qwen3-235B-A22B-FP8 with TP8 (1536 / 8 = 192) fails at start-up — plain TP too
    qwen_fp8 = QWEN.model_copy(update={"weight_bytes": 1.0})
    assert "tp-experts-fp8-block" in {v.rule for v in check(_agg(_mixed(tensor_parallel_size=8)), qwen_fp8,
                                                               H200x2, MAX_LEN)}
    # BF16 has no quantisation block: Qwen3-235B over 16 GPUs (96 each) is valid
    assert check(_agg(_mixed(data_parallel_size=16)), QWEN, H200x2, MAX_LEN) == []


def test_intermediate_size_must_divide_over_tp_times_dp() -> None:
    odd = QWEN.model_copy(update={"moe_intermediate_size": 1000})
    rules = {v.rule for v in check(_agg(_mixed(tensor_parallel_size=2, data_parallel_size=8)), odd, H200x2, MAX_LEN)}
    assert "tp-experts-divide-intermediate" in rules
    ep = _agg(_mixed(tensor_parallel_size=2, data_parallel_size=8, enable_expert_parallel=True))
    assert "tp-experts-divide-intermediate" not in {v.rule for v in check(ep, odd, H200x2, MAX_LEN)}


def test_eplb_is_refused_without_expert_parallelism() -> None:
    role = _mixed(data_parallel_size=8, eplb=EPLBConfig(enabled=True, num_redundant_experts=32))
    assert "eplb-needs-ep" in {v.rule for v in check(_agg(role), DSV3, H200x2, MAX_LEN)}


def test_existing_shapes_keep_their_names() -> None:
    assert RoleConfig(role=Role.PREFILL, data_parallel_size=4, enable_expert_parallel=True).shape == "DEP4"
    assert RoleConfig(role=Role.DECODE, data_parallel_size=16, enable_expert_parallel=True).shape == "EP16"
    assert RoleConfig(role=Role.DECODE, tensor_parallel_size=4).shape == "TP4"
    assert RoleConfig(role=Role.DECODE, data_parallel_size=8).shape == "DP8 TP-experts"


# --------------------------------------------------------------------------------------------- (b) render
@pytest.mark.parametrize(("model", "tp", "dp"), [(DSV3, 2, 4), (QWEN, 1, 16)], ids=["TP2xDP4", "DP16-two-nodes"])
def test_tp_experts_render_through_vllms_parser(model, tp: int, dp: int) -> None:
    cfg = _agg(_mixed(tensor_parallel_size=tp, data_parallel_size=dp,
                      all2all_backend=All2AllBackend.DEEPEP_LOW_LATENCY))  # ignored without EP
    assert check(cfg, model, H200x2, MAX_LEN) == []
    topo = place(cfg, H200x2)
    (inst,) = topo.instances
    assert len(inst.shards) == (tp * dp + 7) // 8
    for i, shard in enumerate(inst.shards):
        head = Endpoint(host="10.0.0.1", port=8100, dp_rpc_port=29600, bind_host="0.0.0.0")
        args = serve_args(inst, shard, cfg=cfg, model="deepseek-ai/DeepSeek-V3", platform=gpu_platform(), head=head,
                          max_model_len=MAX_LEN)
        assert "--enable-expert-parallel" not in args and "--all2all-backend" not in args
        assert "--enable-eplb" not in args and "--enable-dbo" not in args
        ns = parse_serve_args(args)
        assert ns.enable_expert_parallel is False
        assert ns.tensor_parallel_size == tp and ns.data_parallel_size == dp
        if len(inst.shards) > 1:
            assert ns.data_parallel_size_local == 8 // tp
            assert bool(ns.headless) == (i > 0)
            if i > 0:
                assert ns.data_parallel_start_rank == i * (8 // tp)


# --------------------------------------------------------------------------------------------- (c) perf model
def _role(**kw) -> RoleConfig:
    return RoleConfig(role=Role.DECODE, **kw)


def test_tp_experts_predict_finite_positive_numbers_without_eplb() -> None:
    _, cfg = _by_shape(SPACE)[(2, 4, False)]
    topo = place(cfg, H200x2)
    for m in predict(topo, DSV3, WL):
        for f in ("throughput_per_gpu", "output_throughput_per_gpu", "p90_ttft_ms", "p90_tpot_ms",
                  "p50_tokens_per_s_per_user"):
            v = getattr(m, f)
            assert v is not None and math.isfinite(v) and v > 0, (f, v)
        assert m.eplb_balancedness is None  # no EP, nothing for EPLB to balance
        assert m.raw["decode_expert_imbalance"] == 1.0 and m.raw["mixed_expert_imbalance"] == 1.0
        assert m.raw["mixed_comm_ms"] > 0  # the all-gather / reduce-scatter around every MoE layer


def test_tp_experts_ignore_expert_skew_and_eplb_parameters() -> None:
    role = _role(data_parallel_size=8)
    base = default_params("H200")
    skewed = base.model_copy(update={"expert_skew_cv": 2.5, "eplb_residual": 1.0, "eplb_redundancy_gain": 0.0})
    for p in (base, skewed):
        d = decode_throughput_per_gpu(role, DSV3, H200x2, WL, p, batch=64)
        assert d["expert_imbalance"] == 1.0
    a = prefill_throughput_per_gpu(role, DSV3, H200x2, WL, base)["new_tokens_per_s_per_gpu"]
    b = prefill_throughput_per_gpu(role, DSV3, H200x2, WL, skewed)["new_tokens_per_s_per_gpu"]
    assert a == b
    # the same skew slows EP, whose hottest GPU carries the popular experts
    ep = _role(data_parallel_size=8, enable_expert_parallel=True)
    assert (prefill_throughput_per_gpu(ep, DSV3, H200x2, WL, skewed)["new_tokens_per_s_per_gpu"]
            < prefill_throughput_per_gpu(ep, DSV3, H200x2, WL, base)["new_tokens_per_s_per_gpu"])


@pytest.mark.parametrize("model", [DSV3, QWEN], ids=["dsv3", "qwen3"])
def test_tp_experts_vs_ep_with_the_same_gather(model) -> None:
    """Same all-gather/reduce-scatter volume as EP with allgather_reducescatter, no expert imbalance: never
    slower, and faster in prefill, where the experts are compute-bound (shard width ≥ 128: η_w = 1)."""
    tpx = _role(data_parallel_size=8)
    ep = _role(data_parallel_size=8, enable_expert_parallel=True,
               all2all_backend=All2AllBackend.ALLGATHER_REDUCESCATTER)
    for batch in (8, 64, 256):
        a = decode_throughput_per_gpu(tpx, model, H200x2, WL, batch=batch)
        b = decode_throughput_per_gpu(ep, model, H200x2, WL, batch=batch)
        assert a["comm_s"] == pytest.approx(b["comm_s"], rel=1e-12)
        assert a["expert_imbalance"] == 1.0 < b["expert_imbalance"]
        assert a["experts_s"] <= b["experts_s"] * (1 + 1e-12)
        assert a["output_tokens_per_s_per_gpu"] >= b["output_tokens_per_s_per_gpu"] * (1 - 1e-12)
    pa = prefill_throughput_per_gpu(tpx, model, H200x2, WL)
    pb = prefill_throughput_per_gpu(ep, model, H200x2, WL)
    assert pa["comm_s"] == pytest.approx(pb["comm_s"], rel=1e-12)
    assert pa["experts_s"] < pb["experts_s"]
    assert pa["new_tokens_per_s_per_gpu"] > pb["new_tokens_per_s_per_gpu"]


def test_tp_experts_gather_moves_more_than_deepep() -> None:
    """DeepEP sends a token only to the GPUs holding its top-k experts; the gather sends it to every DP rank.
    The gap grows with DP and jumps when the DP group leaves the NVLink domain."""
    ht = {dp: prefill_throughput_per_gpu(_role(data_parallel_size=dp, enable_expert_parallel=True,
                                               all2all_backend=All2AllBackend.DEEPEP_HIGH_THROUGHPUT),
                                         DSV3, H200x2, WL) for dp in (8, 16)}
    tpx = {dp: prefill_throughput_per_gpu(_role(data_parallel_size=dp), DSV3, H200x2, WL) for dp in (8, 16)}
    for dp in (8, 16):
        assert tpx[dp]["comm_s"] > ht[dp]["comm_s"]
    assert tpx[16]["comm_s"] / ht[16]["comm_s"] > tpx[8]["comm_s"] / ht[8]["comm_s"]
    # within one node DeepEP HT wins prefill on communication despite EP's expert imbalance
    assert ht[8]["new_tokens_per_s_per_gpu"] > tpx[8]["new_tokens_per_s_per_gpu"]
    # plain TP (one DP rank) has no gather at all: only the TP all-reduces
    tp8 = prefill_throughput_per_gpu(_role(tensor_parallel_size=8), DSV3, H200x2, WL)
    assert tp8["comm_s"] < tpx[8]["comm_s"]


def test_narrow_expert_shards_cost_exactly_the_documented_factor() -> None:
    """η_w = min(1, (moe_intermediate / (tp·dp)) / expert_shard_min_width): Qwen3-235B over 16 GPUs keeps 96
    of 1536 per GPU → compute-bound expert time × 128/96; DeepSeek-V3 over 16 (128 each) is not penalised."""
    base = default_params("H200")
    wide_open = base.model_copy(update={"expert_shard_min_width": 1.0})
    q16 = _role(data_parallel_size=16)
    slow = prefill_throughput_per_gpu(q16, QWEN, H200x2, WL, base)["experts_s"]
    fast = prefill_throughput_per_gpu(q16, QWEN, H200x2, WL, wide_open)["experts_s"]
    assert slow / fast == pytest.approx(128 / 96, rel=1e-9)
    d16 = _role(data_parallel_size=16)
    assert (prefill_throughput_per_gpu(d16, DSV3, H200x2, WL, base)["experts_s"]
            == prefill_throughput_per_gpu(d16, DSV3, H200x2, WL, wide_open)["experts_s"])
    # EP keeps whole experts: the factor never applies to it
    e16 = _role(data_parallel_size=16, enable_expert_parallel=True)
    assert (prefill_throughput_per_gpu(e16, QWEN, H200x2, WL, base)["experts_s"]
            == prefill_throughput_per_gpu(e16, QWEN, H200x2, WL, wide_open)["experts_s"])


def test_new_parameter_is_calibratable_and_bounded() -> None:
    from executors.perf import CALIBRATABLE

    # appended after every earlier field (their vector order, and so seeded perturbed draws, stay as they were); only
    # the API server's per-prompt term and the per-layer step floor came after it
    assert CALIBRATABLE[-3:] == ["expert_shard_min_width", "frontend_per_prompt_token_s", "layer_latency_s"]
    lo, hi = PerfParams.bounds()[-3]
    assert lo <= PerfParams().expert_shard_min_width <= hi
