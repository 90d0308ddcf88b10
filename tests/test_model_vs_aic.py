"""The translation of a deployment between aiconfigurator's terms and ours (benchmarks/model_vs_aic.py): a replica
of aiconfigurator's is one of our deployments with the same GPUs per role, and our operating point becomes its
per-rank batches. The numbers of either tool are not checked here (the benchmark prints them)."""

from __future__ import annotations

import pytest

from benchmarks.model_vs_aic import PROBLEMS, NotExpressible, aic_terms, from_aic, job_of, to_aic
from executors import place
from executors.perf import default_params, predict
from search_spaces import Mode, check

#: Shaped like cli_default's best disaggregated row for DeepSeek-V3 on 32 H200 (aiconfigurator 0.12), trimmed, with
#: its decode switched to expert parallelism so both kinds of expert placement are translated.
DISAGG_ROW = {"concurrency": 288, "(p)bs": 1, "(p)workers": 1, "(p)tp": 1, "(p)dp": 8, "(p)moe_tp": 8, "(p)moe_ep": 1,
              "(d)bs": 36, "(d)workers": 1, "(d)tp": 1, "(d)dp": 8, "(d)moe_tp": 1, "(d)moe_ep": 8}
AGG_ROW = {"concurrency": 120, "bs": 15, "tp": 1, "dp": 8, "moe_tp": 8, "moe_ep": 1}


def _point(cfg, c):
    job = job_of(PROBLEMS["deepseek-v3"])
    return job, predict(place(cfg, job.cluster), job.model_profile(), job.workload,
                        default_params(job.cluster.gpu), [c])[0]


def test_aggregated_round_trip_keeps_the_layout_and_the_batch():
    cfg, c = from_aic("agg", AGG_ROW)
    assert cfg.mode is Mode.AGGREGATED and c == 120
    role = cfg.decode
    # TP-sharded experts over DP8 attention: vLLM without --enable-expert-parallel
    assert (role.tensor_parallel_size, role.data_parallel_size, role.enable_expert_parallel) == (1, 8, False)
    assert role.max_num_batched_tokens == 15 + 4000 + 1500  # aiconfigurator's vLLM rule: batch + ISL + 1500
    job, point = _point(cfg, c)
    assert not check(cfg, job.model_profile(), job.cluster, job.workload.max_model_len)
    kw = to_aic(cfg, point)
    assert {k: kw[k] for k in ("tp_size", "attention_dp_size", "moe_tp_size", "moe_ep_size")} == \
        {"tp_size": 1, "attention_dp_size": 8, "moe_tp_size": 8, "moe_ep_size": 1}
    assert kw["batch_size"] == 15  # 120 users over 8 ranks: the model's batch per rank at that load
    assert kw["ctx_tokens"] == 4000


def test_disaggregated_round_trip_keeps_each_role():
    cfg, c = from_aic("disagg", DISAGG_ROW)
    assert cfg.mode is Mode.DISAGGREGATED and cfg.total_gpus == 16
    assert cfg.prefill.enable_expert_parallel is False and cfg.decode.enable_expert_parallel is True
    assert cfg.prefill.max_num_seqs == 1 and cfg.prefill.max_num_batched_tokens == 5500
    _, point = _point(cfg, c)
    kw = to_aic(cfg, point)
    for side, name in (("p", "prefill"), ("d", "decode")):
        for key in ("tp", "moe_tp", "moe_ep"):
            assert kw[f"{name}_{key}_size"] == DISAGG_ROW[f"({side}){key}"]
        assert kw[f"{name}_attention_dp_size"] == DISAGG_ROW[f"({side})dp"]
        assert kw[f"{name}_num_workers"] == DISAGG_ROW[f"({side})workers"]
    assert kw["prefill_batch_size"] == 1  # 5,500 batched tokens hold one 4,000-token prompt
    assert 1 <= kw["decode_batch_size"] <= 36  # at most 288 users over 8 decode ranks


def test_mixed_expert_sharding_is_not_expressible():
    with pytest.raises(NotExpressible, match="either shards every expert or spreads them"):
        from_aic("agg", {**AGG_ROW, "moe_tp": 2, "moe_ep": 4})


def test_aic_operations_fall_into_our_kernel_families():
    ops = {"context_mla_block": 10.0, "context_moe": 5.0, "context_moe_pre_dispatch": 1.0, "context_shared_ffn2_gemm": 2.0,
           "generation_moe_combine": 0.5, "context_tp_allreduce": 0.25, "context_logits_gemm": 0.125}
    assert aic_terms(ops) == {"dense": 2.125, "attention": 10.0, "experts": 5.0, "comm": 1.75, "overhead": 0.0}
