"""The space a job without ``space:`` gets holds every parallelism vLLM runs, and nothing no candidate can use
(issue 33, part 1).

Models the presets do not know, built as a user would: Kimi-K2-class (384 experts) from an HF-style config
with BF16 weights, Qwen3-235B on 16 H200, with the issue's workload (ISL 4000 / OSL 1000). Cheap: spaces are
counted role by role (``ValidSpace``), rendering is checked against vLLM's own parser, nothing is launched.
"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # the CPU build of vLLM (CI) needs it before import

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.job import TuningJob, job_from_dict
from advisor.space_report import SpaceReport, space_report
from executors import Endpoint, gpu_platform, place, serve_args
from search_spaces import Role, RoleConfig, load_preset, preset_names
from search_spaces.default_space import KV_SEQUENCES
from search_spaces.rules import kv_capacity_tokens
from tests.test_search_space import assert_enumerate_matches_suggest
from tests.vllm_parser import parse_serve_args

KIMI = Path(__file__).parent / "data" / "kimi-k2-fp8"  # Kimi-K2's config.json: 384 routed experts, MLA
KIMI_BF16 = {"path": str(KIMI), "weight_bytes": 2.0}
H200x4 = {"gpu": "H200", "nodes": 4, "gpus_per_node": 8}
H200x2 = {"gpu": "H200", "nodes": 2, "gpus_per_node": 8}
GB300_RACK = {"gpu": "GB300", "nodes": 18, "gpus_per_node": 4}
ISSUE_WL = {"isl": {"mean": 4000}, "osl": {"mean": 1000}, "load_levels": [16]}

#: Jobs without ``space:``: each preset's model, cluster and workload, and the issue's models.
DERIVED: dict[str, dict[str, Any]] = {
    **{p: {k: v for k, v in load_preset(p).items() if k in ("model", "cluster", "workload")} for p in preset_names()},
    "kimi-bf16-32xH200": {"model": KIMI_BF16, "cluster": H200x4, "workload": ISSUE_WL},
    "kimi-bf16-gb300-rack": {"model": KIMI_BF16, "cluster": GB300_RACK, "workload": ISSUE_WL},
    "qwen3-235b-16xH200": {"model": {"preset": "qwen3-moe-235b"}, "cluster": H200x2, "workload": ISSUE_WL},
}


def _job(name: str) -> TuningJob:
    return job_from_dict({"name": name, **DERIVED[name]})


def _valid_roles(job: TuningJob) -> list[RoleConfig]:
    vs = job.valid_space()
    assert vs is not None
    return [r for _, cfg in vs.iter_valid_configs() for r in cfg.roles]


def _layout(r: RoleConfig) -> tuple[int, int, bool]:
    return r.tensor_parallel_size, r.data_parallel_size, r.enable_expert_parallel


def test_kimi_k2_class_on_32_h200_holds_tp2_dp16_ep32_and_it_renders_through_vllms_parser() -> None:
    """aiconfigurator's best for Kimi-K2 on 32 H200 (TP2 × DP16 with EP32) is in the derived space, valid, and
    its command lines are what vLLM's own parser reads as TP2 × DP16 with expert parallelism."""
    job = _job("kimi-bf16-32xH200")
    assert job.space_derived and job.model_profile().n_routed_experts == 384
    vs = job.valid_space()
    assert vs is not None
    cfg = next(c for _, c in vs.iter_valid_configs()
               if c.decode.role is Role.MIXED and _layout(c.decode) == (2, 16, True))
    assert cfg.decode.ep_size == 32 and cfg.decode.shape == "TP2×DP16 EP32"
    topo = place(cfg, job.cluster)
    (inst,) = topo.instances
    assert len(inst.shards) == 4  # 4 nodes × (4 DP ranks × TP2)
    for i, shard in enumerate(inst.shards):
        head = Endpoint(host="10.0.0.1", port=8100, dp_rpc_port=29600, bind_host="0.0.0.0")
        args = serve_args(inst, shard, cfg=cfg, model="moonshotai/Kimi-K2-Instruct", platform=gpu_platform(),
                          head=head, max_model_len=job.workload.max_model_len)
        ns = parse_serve_args(args)
        assert (ns.tensor_parallel_size, ns.data_parallel_size, ns.enable_expert_parallel) == (2, 16, True)
        assert ns.data_parallel_size_local == 4 and bool(ns.headless) == (i > 0)
        assert ns.data_parallel_start_rank == 4 * i or i == 0


def test_the_deepseek_v3_preset_holds_dp_attention_with_tensor_parallel_experts() -> None:
    """aiconfigurator's DeepSeek-V3 winners on H200 are DP8 with TP experts (no --enable-expert-parallel)."""
    job = job_from_dict({"name": "dsv3", "preset": "h200-dsv3"})
    layouts = {(r.role, *_layout(r)) for r in _valid_roles(job)}
    for role in (Role.MIXED, Role.PREFILL, Role.DECODE):
        assert (role, 1, 8, False) in layouts and (role, 1, 8, True) in layouts


@pytest.mark.parametrize("name", list(DERIVED))
def test_no_derived_space_offers_a_choice_that_no_valid_candidate_uses(name: str) -> None:
    """Every choice of every dimension (each width, TP and DP size, instance count, EP on/off, EPLB's
    redundant experts, batch sizes …) is part of some valid candidate; and few candidates need more GPUs
    than the cluster has (the product of two roles' footprints leaves some)."""
    job = _job(name)
    vs = job.valid_space()
    assert vs is not None and vs.valid > 0
    unused = sorted({(k, str(v)) for rows in vs.roles.values() for p in rows.params for k, v in p.items()
                     if vs.count({k: v}) == 0})
    assert unused == []
    assert vs.broken.get("gpus-fit", 0) <= vs.valid // 2, (vs.broken, vs.valid)


def test_widths_that_can_never_divide_the_experts_nor_the_expert_width_are_not_offered() -> None:
    """384 experts (and moe_intermediate_size 2048) on the GB300 rack: no 20-GPU instance (384 % 20, 2048 % 20);
    the EP widths offered divide the experts, the TP-expert widths divide the expert width."""
    job = _job("kimi-bf16-gb300-rack")
    roles = _valid_roles(job)
    widths = {r.gpus_per_instance for r in roles}
    assert 20 not in widths and {12, 16} <= widths
    assert all(384 % r.ep_size == 0 for r in roles if r.enable_expert_parallel)
    assert all(2048 % r.gpus_per_instance == 0 for r in roles if not r.enable_expert_parallel)
    for rs in (job.space.mixed, job.space.prefill, job.space.decode):
        assert all(tp * dp != 20 for tp in rs.tp_sizes for dp in rs.dp_choice("x", tp)[1])


def test_qwen3_235b_on_16_h200_keeps_dp4_prefill() -> None:
    """A prefill instance keeps one chunk's KV, not KV_SEQUENCES whole sequences: DP4 prefill holds fewer than
    four 5,000-token sequences per rank and is searched all the same (as a prefill role only)."""
    job = _job("qwen3-235b-16xH200")
    model, max_len = job.model_profile(), job.workload.max_model_len
    dp4 = [r for r in _valid_roles(job) if r.role is Role.PREFILL and _layout(r) == (1, 4, True)]
    assert dp4
    assert max_len <= kv_capacity_tokens(dp4[0], model, job.cluster) < KV_SEQUENCES * max_len
    assert not any(r.role is not Role.PREFILL and r.gpus_per_instance == 4 and r.data_parallel_size == 4
                   for r in _valid_roles(job))


def test_derived_space_warnings_speak_of_what_the_user_can_change(tmp_path: Path) -> None:
    """A derived space the user never wrote: a low valid share points at writing a space, and a model no
    instance holds names the job's fields that would change that — never "narrow the space"."""
    line = SpaceReport(1000, 10, False, True).warnings(5)[0]
    assert "derived from the model and the cluster" in line and "narrow the space" not in line
    assert "narrow the space" in SpaceReport(1000, 10, False, False).warnings(5)[0]
    path = tmp_path / "kimi.yaml"
    path.write_text(f"name: k\nmodel: {{path: {KIMI}, weight_bytes: 2.0}}\ncluster: {{gpu: H200, nodes: 1}}\n")
    res = CliRunner().invoke(app, ["validate", str(path)])
    assert res.exit_code == 2
    assert "cluster.nodes" in res.output and "model.weight_bytes" in res.output and "space.mixed" not in res.output
    assert space_report(job_from_dict({"name": "d", "preset": "h200-dsv3"})).derived is False


def test_keyed_dp_and_instance_choices_name_their_parameters_and_replay_through_optuna() -> None:
    """``dp_sizes_by_tp`` / ``instances_by_gpus``: one parameter per list of choices (Optuna keeps one list per
    name), and enumeration agrees with ``suggest``."""
    space = _job("kimi-bf16-32xH200").space
    items = list(space.enumerate())
    names = {k for p, _ in items for k in p}
    assert {"mixed_dp", "mixed_tp2_dp", "mixed_instances"} <= names  # 1 or 2 instances of 16 GPUs
    assert "mixed_g32_instances" not in names  # 1 instance of 32 GPUs: a constant, not a parameter
    assert {c.decode.instances for _, c in items if c.decode.gpus_per_instance == 32} == {1}
    assert_enumerate_matches_suggest(space)


@pytest.mark.parametrize(("space", "says"), [
    ({"mixed": {"tp_sizes": [1], "dp_sizes_by_tp": {2: [4]}}},
     "space.mixed: dp_sizes_by_tp: TP2 is not one of tp_sizes [1]"),
    ({"mixed": {"instances_by_gpus": {8: []}}}, "space.mixed: instances_by_gpus: 8: needs distinct sizes ≥ 1"),
    ({"mixed": {"tp_sizes": [1, 2], "dp_sizes_by_tp": {2: [64]}}},
     "space.mixed.dp_sizes_by_tp.2: 64 is wider than the cluster's 32 GPUs"),
])
def test_keyed_choices_refuse_bad_input_in_one_line(space: dict, says: str) -> None:
    from advisor.errors import BadInput

    with pytest.raises(BadInput) as e:
        job_from_dict({"name": "x", "preset": "h200-dsv3", "space": space})
    assert says in str(e.value) and "\n" not in str(e.value)
