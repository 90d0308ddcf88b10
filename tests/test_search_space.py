"""The search space: enumeration agrees with suggestion, rules give readable reasons, placement fits."""

from __future__ import annotations

import optuna
import pytest

from executors import place
from search_spaces import (
    All2AllBackend,
    ClusterSpec,
    DeploymentConfig,
    EPLBConfig,
    Mode,
    ModelProfile,
    Role,
    RoleConfig,
    SearchSpace,
    Workload,
    check,
    load_preset,
    model_preset,
    preset_names,
)


def _preset(name: str) -> tuple[SearchSpace, ModelProfile, ClusterSpec, Workload]:
    d = load_preset(name)
    model = model_preset(d["model"]["preset"]).model_copy(update={k: v for k, v in d["model"].items() if k != "preset"})
    return SearchSpace.model_validate(d["space"]), model, ClusterSpec(**d["cluster"]), Workload(**d["workload"])


def test_presets_named_by_the_issue_exist() -> None:
    assert {"gb300-rack-dsv3", "h200-dsv3", "h200-qwen3-235b", "cpu-tiny-moe"} <= set(preset_names())


@pytest.mark.parametrize("name", ["cpu-tiny-moe", "h200-qwen3-235b"])
def test_enumerate_visits_each_candidate_once_and_matches_suggest(name: str) -> None:
    space, *_ = _preset(name)
    assert_enumerate_matches_suggest(space)


def assert_enumerate_matches_suggest(space: SearchSpace) -> None:
    """Each candidate once; replaying (a sample of) each parameter dict through Optuna's suggest gives the same
    candidate."""
    items = list(space.enumerate())
    keys = [cfg.key() for _, cfg in items]
    assert len(keys) == len(set(keys)), "a candidate appears twice"
    study = optuna.create_study()
    for params, cfg in items[:: max(1, len(items) // 40)]:
        study.enqueue_trial(params)
        trial = study.ask()
        assert space.suggest(trial) == cfg
        study.tell(trial, 0.0)


def test_enumerate_counts_the_conditional_tree_by_hand() -> None:
    space = SearchSpace.model_validate({
        "modes": ["aggregated", "disaggregated"],
        "mixed": {"instances": [1, 2], "dp_sizes": [1, 2]},
        "prefill": {"dp_sizes": [2]},
        "decode": {"dp_sizes": [2, 4], "max_num_seqs": [64, 128]},
        "eplb": {"enabled": [False, True], "num_redundant_experts": [0, 8]},
    })
    # aggregated: instances 2 × (dp1 → 1 + dp2 → eplb off 1 + on 2) = 2 × 4 = 8
    # disaggregated: prefill dp2 (eplb 3 ways) × decode dp 2 × seqs 2 × eplb 3 = 3 × 12 = 36
    assert space.size() == 8 + 36


def _role(**kw) -> RoleConfig:
    base = dict(role=Role.DECODE, data_parallel_size=8, enable_expert_parallel=True)
    base.update(kw)
    return RoleConfig(**base)


def _pd(decode: RoleConfig, prefill: RoleConfig | None = None) -> DeploymentConfig:
    prefill = prefill or RoleConfig(role=Role.PREFILL, data_parallel_size=2, enable_expert_parallel=True)
    return DeploymentConfig(mode=Mode.DISAGGREGATED, prefill=prefill, decode=decode)


GB300 = ClusterSpec(gpu="GB300", nodes=18, gpus_per_node=4)
DSV3_FP4 = model_preset("deepseek-v3").model_copy(update={"weight_bytes": 0.5})


@pytest.mark.parametrize(
    ("decode", "rule"),
    [
        (_role(data_parallel_size=48, eplb=EPLBConfig(enabled=True, num_redundant_experts=64)), "ep-divides-experts"),
        (_role(enable_expert_parallel=False, data_parallel_size=1, eplb=EPLBConfig(enabled=True)), "eplb-needs-ep"),
        (_role(eplb=EPLBConfig(enabled=False, num_redundant_experts=32)), "redundant-needs-eplb"),
        (_role(enable_dbo=True), "dbo-needs-deepep"),
        (_role(data_parallel_size=80), "gpus-fit"),
        (_role(data_parallel_size=12, tensor_parallel_size=1, enable_expert_parallel=True), "ep-divides-experts"),
        (_role(data_parallel_size=6, enable_expert_parallel=False), "placement"),
    ],
)
def test_each_rule_names_itself(decode: RoleConfig, rule: str) -> None:
    violations = check(_pd(decode), DSV3_FP4, GB300, max_model_len=16384)
    assert rule in {v.rule for v in violations}, violations
    assert all(v.reason for v in violations)


def test_memory_fit_rejects_a_model_too_big_for_its_gpus() -> None:
    fp8 = model_preset("deepseek-v3")  # 671 GB of FP8 weights cannot sit on 2 × 80 GB
    cfg = _pd(_role(data_parallel_size=8), RoleConfig(role=Role.PREFILL, data_parallel_size=2, enable_expert_parallel=True))
    violations = check(cfg, fp8, ClusterSpec(gpu="H100", nodes=2, gpus_per_node=8), max_model_len=4096)
    assert any(v.rule == "memory-fit" and "prefill" in v.reason for v in violations)


def test_dbo_allowed_with_deepep_and_valid_config_passes() -> None:
    cfg = _pd(_role(data_parallel_size=16, all2all_backend=All2AllBackend.DEEPEP_LOW_LATENCY, enable_dbo=True,
                    eplb=EPLBConfig(enabled=True, num_redundant_experts=32)))
    assert check(cfg, DSV3_FP4, GB300, max_model_len=16384) == []


def test_placement_puts_wide_instances_on_whole_nodes() -> None:
    cfg = _pd(_role(data_parallel_size=16))
    topo = place(cfg, GB300)
    decode = topo.of_role(Role.DECODE)[0]
    assert [s.node for s in decode.shards] == [0, 1, 2, 3]
    assert [s.start_rank for s in decode.shards] == [0, 4, 8, 12]
    prefill = topo.of_role(Role.PREFILL)[0]
    assert len(prefill.shards) == 1 and prefill.shards[0].node == 4
    # no GPU is given twice
    used = [(s.node, g) for i in topo.instances for s in i.shards for g in s.gpus]
    assert len(used) == len(set(used)) == cfg.total_gpus


def test_describe_reads_like_an_operator() -> None:
    cfg = _pd(_role(data_parallel_size=8, eplb=EPLBConfig(enabled=True, num_redundant_experts=32)),
              RoleConfig(role=Role.PREFILL, instances=2, data_parallel_size=2, enable_expert_parallel=True))
    text = cfg.describe()
    assert "prefill 2 × DEP2" in text and "decode EP8" in text and "EPLB 32 redundant" in text
    assert text.endswith("12 GPUs")


def test_every_valid_preset_candidate_places() -> None:
    for name in preset_names():
        space, model, cluster, wl = _preset(name)
        for i, (_, cfg) in enumerate(space.enumerate()):
            if i % 97:
                continue
            if not check(cfg, model, cluster, wl.max_model_len):
                topo = place(cfg, cluster)
                assert sum(len(s.gpus) for inst in topo.instances for s in inst.shards) == cfg.total_gpus
