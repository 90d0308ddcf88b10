"""The space a job without ``space:`` gets on one node: on one GPU the batch knobs and the one-GPU serving knobs,
nothing that means nothing there; on a node of several GPUs the layouts published runs compare (TP, TEP, DEP,
narrower instances, several instances) with the batch knobs. Counted, not launched.

The model is the DeepSeek-V2-Lite shape the GPU runs use (``tests/data/deepseek-v2-lite``, the GPU runs' config: MLA, 64
routed experts, 16 heads), and a GQA shape (``qwen3-moe-30b``) where an FP8 KV cache applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from advisor.job import TuningJob, job_from_dict
from search_spaces import Mode, Role, RoleConfig
from search_spaces.default_space import UNMODELLED, UNMODELLED_COVER, WIDTHS, one_gpu_knobs
from tests.cli_run import advisor

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "tests" / "data"  # the GPU runs' model folders, their config.json alone
WORKLOAD = {"isl": {"mean": 2048, "range_ratio": 0.2}, "osl": {"mean": 256, "range_ratio": 0.2}, "load_levels": []}


def _doc(gpus: int, model: str = "deepseek-v2-lite", nodes: int = 1, trials: int = 8) -> dict[str, Any]:
    return {"name": "one-node", "model": {"path": str(MODELS / model)},
            "cluster": {"gpu": "H100", "nodes": nodes, "gpus_per_node": gpus}, "workload": WORKLOAD,
            "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000}], "budget": {"trials": trials}}


def _roles(job: TuningJob) -> list[tuple[Mode, RoleConfig]]:
    vs = job.valid_space()
    assert vs is not None
    return [(cfg.mode, r) for _, cfg in vs.iter_valid_configs() for r in cfg.roles]


def _kind(r: RoleConfig) -> str:
    """The layout's name as published runs write it: TP8, TEP8 (TP with experts spread), DEP8, 2×TP4, DP2 TP-experts."""
    tp, dp, ep = r.tensor_parallel_size, r.data_parallel_size, r.enable_expert_parallel
    name = (f"TEP{tp}" if ep else f"TP{tp}") if dp == 1 else (f"DEP{dp}" if ep and tp == 1 else f"TP{tp}×DP{dp}")
    return name if r.instances == 1 else f"{r.instances}×{name}"


def test_one_gpu_validate_show_lists_batched_tokens_and_nothing_that_means_nothing_on_one_gpu(tmp_path: Path) -> None:
    job_file = tmp_path / "one.yaml"
    job_file.write_text(yaml.safe_dump(_doc(1)))
    p = advisor("validate", "--show", str(job_file), cwd=ROOT)
    assert p.returncode == 0, p.stderr
    dims = {line.split(":")[0].strip("# ").strip(): line.split(":", 1)[1].split(",")
            for line in p.stdout.splitlines() if line.startswith("#   ")}
    assert len(dims["mixed_max_num_batched_tokens"]) >= 3 and len(dims["mixed_max_num_seqs"]) >= 3
    assert not any(k.endswith(("_ep", "_all2all", "_eplb", "_dbo", "_tp", "_dp")) for k in dims), dims
    resolved = yaml.safe_load(p.stdout.split("# derived:")[0])
    for role in ("mixed", "prefill", "decode"):  # no role of a one-GPU space spreads experts
        assert resolved["space"][role]["expert_parallel"] == [False]
    job = job_from_dict(_doc(1))
    vs = job.valid_space()
    assert vs is not None and vs.valid >= 20
    roles = _roles(job)
    assert {r.gpus_per_instance for _, r in roles} == {1}
    tokens = {r.max_num_batched_tokens for _, r in roles}
    seqs = {r.max_num_seqs for _, r in roles}
    assert len(tokens) >= 3 and len(seqs) >= 3 and len({(r.max_num_seqs, r.max_num_batched_tokens)
                                                        for _, r in roles}) == len(tokens) * len(seqs)
    # vLLM's own defaults on an H100 (1024 / 8192) are among the candidates, with room on both sides
    assert min(seqs) < 1024 < max(seqs) and min(tokens) < 8192 < max(tokens)


def test_one_gpu_serving_knobs_join_by_model_term_and_budget() -> None:
    """An FP8 KV cache (a model term: KV capacity) for a GQA model, never for MLA; a knob without a model term only
    where the budget covers ``UNMODELLED_COVER`` of the candidates it makes."""
    mla = job_from_dict(_doc(1))
    gqa = job_from_dict(_doc(1, "qwen3-moe-30b"))
    assert mla.space.mixed.kv_cache_dtype == ["auto"] and gqa.space.mixed.kv_cache_dtype == ["auto", "fp8"]
    assert {r.kv_cache_dtype for _, r in _roles(gqa)} == {"auto", "fp8"}
    size = len(mla.space.mixed.max_num_seqs) * len(mla.space.mixed.max_num_batched_tokens)
    first, values = UNMODELLED[0]
    enough = int(UNMODELLED_COVER * size * len(values) + 0.999)
    assert first not in one_gpu_knobs(mla.model_profile(), mla.cluster, enough - 1)
    rich = job_from_dict(_doc(1, trials=enough))
    assert getattr(rich.space.mixed, first) == list(values)
    vs = rich.valid_space()
    assert vs is not None and vs.valid == size * len(values)
    cpu = job_from_dict({**_doc(1), "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1}, "budget": {
        "trials": 10 * enough}})  # the CPU build: no GPU-only knob, nothing left to the sampler alone
    assert cpu.space.mixed.kv_cache_dtype == ["auto"] and getattr(cpu.space.mixed, first) == [values[0]]


def test_an_eight_gpu_node_lists_tp_tep_dep_and_narrower_multi_instance_layouts() -> None:
    job = job_from_dict(_doc(8))
    mixed = [r for mode, r in _roles(job) if mode is Mode.AGGREGATED]
    kinds = {_kind(r) for r in mixed}
    assert {"TP8", "TEP8", "DEP8"} <= kinds  # the full node, three ways
    assert {"2×TP4", "2×TEP4", "2×DEP4", "4×TP2", "8×TP1"} <= kinds  # several narrower instances
    assert any(r.data_parallel_size > 1 and r.tensor_parallel_size > 1 for r in mixed)  # TP inside DP ranks
    widths = {r.gpus_per_instance for r in mixed}
    assert widths == {1, 2, 4, 8}
    assert {r.instances * r.gpus_per_instance for r in mixed} >= {8}  # every width can fill the node
    assert len({r.max_num_batched_tokens for r in mixed}) >= 2 and len({r.max_num_seqs for r in mixed}) >= 3
    # each layout kind comes with the batch knobs, not one batch setting per layout
    per_kind: dict[str, set[tuple[int, int]]] = {}
    for r in mixed:
        per_kind.setdefault(_kind(r), set()).add((r.max_num_seqs, r.max_num_batched_tokens))
    assert min(len(v) for v in per_kind.values()) >= 6
    assert any(r.role is Role.PREFILL for _, r in _roles(job))  # P/D stays searched where both roles fit


@pytest.mark.parametrize("gpus", [2, 4])
def test_smaller_nodes_search_the_whole_node_too(gpus: int) -> None:
    job = job_from_dict(_doc(gpus))
    kinds = {_kind(r) for mode, r in _roles(job) if mode is Mode.AGGREGATED}
    assert {f"TP{gpus}", f"TEP{gpus}", f"DEP{gpus}", f"2×TP{gpus // 2}", f"{gpus}×TP1"} <= kinds


def test_several_nodes_keep_the_narrowest_widths() -> None:
    """Past one node the derived space keeps the narrowest ``WIDTHS`` widths that hold a role, as before."""
    job = job_from_dict(_doc(8, nodes=2))
    widths = {r.gpus_per_instance for mode, r in _roles(job) if mode is Mode.AGGREGATED}
    assert len(widths) <= WIDTHS and 16 not in widths
