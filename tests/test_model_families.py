"""Today's MoE families from their config.json: each validates, has a preset, runs a simulated study on an NVL72 rack
and on 8 × H200 (or is refused there in one line), and the attention and precision terms point the right way.

The configs below are the released config.json files' keys that the tuner reads (the rest of each file — rope
scaling, token ids, norms — is left out), copied from the source named above each. No server is started.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from advisor.errors import BadInput
from advisor.job import job_from_dict
from advisor.space_report import require_valid_candidates
from advisor.tune import tune
from executors.perf import decode_throughput_per_gpu, prefill_throughput_per_gpu
from executors.vllm.model_folder import at_depth, hf_config
from search_spaces import MODEL_PRESETS, ClusterSpec, ModelProfile, RoleConfig, Workload, model_preset
from search_spaces.deployment import Role
from search_spaces.hardware import GPU_TABLE, format_tflops
from search_spaces.model_families import ARCHITECTURES
from search_spaces.rules import kv_capacity_tokens, precision_error
from search_spaces.workload import LengthDist
from tests.cli_run import advisor, one_line

ROOT = Path(__file__).resolve().parents[1]
FP8_BLOCKS = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
_DSV3 = {"hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 3, "vocab_size": 129280,
         "num_attention_heads": 128, "num_key_value_heads": 128, "kv_lora_rank": 512, "q_lora_rank": 1536,
         "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 256,
         "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048, "intermediate_size": 18432,
         "num_nextn_predict_layers": 1}

#: family → (preset it must read as, its config.json as released; the source in the comment).
CONFIGS: dict[str, tuple[str, dict]] = {
    # deepseek-ai/DeepSeek-V3 config.json
    "deepseek-v3": ("deepseek-v3", {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **_DSV3,
                                    "quantization_config": FP8_BLOCKS}),
    # deepseek-ai/DeepSeek-V3.2 config.json: V3 plus the lightning indexer
    "deepseek-v3.2": ("deepseek-v3.2", {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32",
                                        **_DSV3, "index_topk": 2048, "index_n_heads": 64, "index_head_dim": 128,
                                        "quantization_config": FP8_BLOCKS}),
    # deepseek-ai/DeepSeek-V4-Pro: no config.json in reach; the shape sglang's deepseek_v4.py notes name for V4 Pro
    # with the transformers DeepseekV4Config fields, the schedule of layers 0-1 HCA then CSA/HCA alternating
    "deepseek-v4-pro": ("deepseek-v4-pro", {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 7168,
        "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 1, "head_dim": 512,
        "q_lora_rank": 1536, "qk_rope_head_dim": 64, "o_lora_rank": 1024, "o_groups": 16, "vocab_size": 129280,
        "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 3072,
        "sliding_window": 128, "compress_ratios": [128, 128] + [4 if i % 2 == 0 else 128 for i in range(59)] + [0],
        "index_topk": 1024, "index_n_heads": 64, "index_head_dim": 128, "num_nextn_predict_layers": 1,
        "expert_dtype": "fp4", "quantization_config": {**FP8_BLOCKS, "scale_fmt": "ue8m0"}}),
    # deepseek-ai/DeepSeek-V4-Flash: transformers' DeepseekV4Config defaults (documented as V4-Flash-Base), its
    # default compress_ratios schedule; expert_dtype and quantization_config as the V4-Flash-0731 config shows
    "deepseek-v4-flash": ("deepseek-v4-flash", {
        "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4", "hidden_size": 4096,
        "num_hidden_layers": 43, "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
        "q_lora_rank": 1024, "qk_rope_head_dim": 64, "o_lora_rank": 1024, "o_groups": 8, "vocab_size": 129280,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6, "moe_intermediate_size": 2048,
        "sliding_window": 128, "index_topk": 512, "index_n_heads": 64, "index_head_dim": 128,
        "num_nextn_predict_layers": 1, "expert_dtype": "fp4",
        "quantization_config": {**FP8_BLOCKS, "scale_fmt": "ue8m0"}}),
    # moonshotai/Kimi-K2-Instruct config.json (tests/data/kimi-k2-fp8)
    "kimi-k2": ("kimi-k2", json.loads((ROOT / "tests/data/kimi-k2-fp8/config.json").read_text())),
    # zai-org/GLM-4.5 config.json
    "glm-4.5": ("glm-4.5", {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "hidden_size": 5120,
        "num_hidden_layers": 92, "first_k_dense_replace": 3, "num_attention_heads": 96, "num_key_value_heads": 8,
        "head_dim": 128, "n_routed_experts": 160, "n_shared_experts": 1, "num_experts_per_tok": 8,
        "moe_intermediate_size": 1536, "intermediate_size": 12288, "vocab_size": 151552,
        "num_nextn_predict_layers": 1, "partial_rotary_factor": 0.5}),
    # zai-org/GLM-5-FP8: transformers' GlmMoeDsaConfig defaults (documented as zai-org/GLM-5), the indexer of
    # nemo_rl's GLM-5 test config, FP8 blocks as the -FP8 checkpoint
    "glm-5": ("glm-5", {
        "architectures": ["GlmMoeDsaForCausalLM"], "model_type": "glm_moe_dsa", "hidden_size": 6144,
        "num_hidden_layers": 78, "first_k_dense_replace": 3, "num_attention_heads": 64, "num_key_value_heads": 64,
        "q_lora_rank": 2048, "kv_lora_rank": 512, "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
        "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "intermediate_size": 12288, "vocab_size": 154880, "index_topk": 2048, "index_n_heads": 32,
        "index_head_dim": 128, "num_nextn_predict_layers": 1, "quantization_config": FP8_BLOCKS}),
    # Qwen/Qwen3-30B-A3B config.json
    "qwen3-30b": ("qwen3-moe-30b", {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144,
        "vocab_size": 151936, "mlp_only_layers": [], "decoder_sparse_step": 1}),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json
    "qwen3-next": ("qwen3-next-80b", {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "hidden_size": 2048,
        "num_hidden_layers": 48, "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
        "full_attention_interval": 4, "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512,
        "num_experts_per_tok": 10, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
        "intermediate_size": 5120, "vocab_size": 151936, "mlp_only_layers": [], "decoder_sparse_step": 1,
        "partial_rotary_factor": 0.25}),
    # Qwen/Qwen3.5-397B-A17B config.json (a multimodal wrapper: the language model is its text_config)
    "qwen3.5": ("qwen3.5-397b", {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "text_config": {
            "model_type": "qwen3_5_moe_text", "hidden_size": 4096, "num_hidden_layers": 60, "num_attention_heads": 32,
            "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
            "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(60)],
            "linear_num_key_heads": 16, "linear_num_value_heads": 64, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 512, "num_experts_per_tok": 10,
            "moe_intermediate_size": 1024, "shared_expert_intermediate_size": 1024, "vocab_size": 248320,
            "attn_output_gate": True, "mtp_num_hidden_layers": 1}}),
    # MiniMaxAI/MiniMax-M2.5 config.json (the MiniMax-M2 keys; FP8 blocks)
    "minimax-m2.5": ("minimax-m2.5", {
        "architectures": ["MiniMaxM2ForCausalLM"], "model_type": "minimax_m2", "hidden_size": 3072,
        "num_hidden_layers": 62, "num_attention_heads": 48, "num_key_value_heads": 8, "head_dim": 128,
        "intermediate_size": 1536, "num_local_experts": 256, "num_experts_per_tok": 8, "vocab_size": 200064,
        "rotary_dim": 64, "use_mtp": True, "num_mtp_modules": 3, "shared_intermediate_size": 0,
        "quantization_config": {**FP8_BLOCKS, "modules_to_not_convert": ["gate", "e_score_correction_bias",
                                                                         "lm_head"]}}),
    # openai/gpt-oss-120b config.json
    "gpt-oss-120b": ("gpt-oss-120b", {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
        "num_hidden_layers": 36, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
        "vocab_size": 201088, "sliding_window": 128,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(36)],
        "quantization_config": {"quant_method": "mxfp4",
                                "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                           "model.embed_tokens", "lm_head"]}}),
    # openai/gpt-oss-20b config.json
    "gpt-oss-20b": ("gpt-oss-20b", {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
        "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "intermediate_size": 2880, "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
        "sliding_window": 128,
        "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(24)],
        "quantization_config": {"quant_method": "mxfp4"}}),
}
#: nvidia/DeepSeek-R1-FP4 config.json: the DeepSeek-V3 shape with ModelOpt NVFP4 weights — W4A4, Blackwell only.
NVFP4_R1 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", **_DSV3,
            "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "kv_cache_quant_algo": None}}

RACK = {"gpu": "GB300", "nodes": 18, "gpus_per_node": 4}
HGX_H200 = {"gpu": "H200", "nodes": 1, "gpus_per_node": 8}
#: One small space that every family's 8-GPU instance can take (DEP8; TP heads/experts divide by 8).
SPACE = {"modes": ["aggregated"], "mixed": {"instances": [1], "dp_sizes": [8], "expert_parallel": [True],
                                            "max_num_seqs": [128, 256], "max_num_batched_tokens": [8192],
                                            "all2all_backends": ["deepep_low_latency"]}}


def _folder(tmp: Path, name: str, cfg: dict) -> Path:
    folder = tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def _job(folder: Path, cluster: dict, study: str) -> dict:
    return {"name": study, "model": {"path": str(folder)}, "cluster": cluster,
            "workload": {"isl": {"mean": 2048, "range_ratio": 0.5}, "osl": {"mean": 256, "range_ratio": 0.5},
                         "load_levels": [64], "knee_search": False},
            "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 5000}], "executor": {"kind": "simulated"},
            "budget": {"trials": 2}, "space": SPACE, "sampler": {"seed": 1, "guide": False}}


# ----------------------------------------------------------------------------------- every family, read and run
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_config_reads_as_its_preset(family: str, tmp_path: Path) -> None:
    preset, cfg = CONFIGS[family]
    read = ModelProfile.from_hf_config(_folder(tmp_path, family, cfg))
    want = model_preset(preset)
    assert read.shape == want.shape and read.num_layers == want.num_layers, family
    assert (read.num_sliding_layers, read.num_sparse_layers, read.num_csa_layers, read.num_hca_layers,
            read.num_linear_layers) == (want.num_sliding_layers, want.num_sparse_layers, want.num_csa_layers,
                                        want.num_hca_layers, want.num_linear_layers)
    assert read.architecture in ARCHITECTURES


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One database for every family's studies (each study has its own name)."""
    return f"sqlite:///{tmp_path_factory.mktemp('families') / 's.db'}"


#: Families whose weights 8 × H200 cannot hold at vLLM's default memory share (Kimi-K2: 1.03 TB of FP8 weights,
#: 129 GB a GPU of 127 usable): their H200 study runs on two nodes (DEP16), and one node's refusal is checked.
TOO_BIG_FOR_ONE_H200_NODE = {"kimi-k2"}


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_simulated_study_on_a_rack_and_on_eight_h200(family: str, tmp_path: Path, storage: str) -> None:
    folder = _folder(tmp_path, family, CONFIGS[family][1])
    h200 = HGX_H200
    if family in TOO_BIG_FOR_ONE_H200_NODE:
        with pytest.raises(BadInput, match="memory-fit"):
            require_valid_candidates(job_from_dict(_job(folder, h200, f"{family}-one-node")))
        h200 = {**HGX_H200, "nodes": 2}
    for cluster in (RACK, h200):
        doc = _job(folder, cluster, f"{family}-{cluster['gpu']}")
        if cluster["nodes"] == 2:  # one DEP16 instance over both nodes
            doc["space"] = {**SPACE, "mixed": {**SPACE["mixed"], "dp_sizes": [16]}}
        job = job_from_dict(doc)
        assert tune(job, storage=storage).executed == 2, (family, cluster)


def test_every_preset_round_trips_through_its_config_and_a_reduced_depth() -> None:
    """``advisor profile``'s folders: a preset written as its family's config.json reads back as itself, and a
    reduced depth keeps every width and, for hybrid stacks, the layer pattern (full attention kept)."""
    for name, m in MODEL_PRESETS.items():
        cfg = hf_config(m)
        back = ModelProfile.from_hf_dict(cfg, name=name)
        assert back.shape == m.shape and back.num_layers == m.num_layers, name
        deep = ModelProfile.from_hf_dict(at_depth(cfg, 4), name="x")
        assert deep.shape == m.shape and deep.num_layers == 4, name
        if m.num_linear_layers:
            assert (deep.num_linear_layers, deep.num_full_layers) == (3, 1)
        if m.num_sliding_layers and m.attention.value == "GQA":
            assert deep.num_sliding_layers == 2
    assert ModelProfile.from_hf_dict(at_depth(hf_config(model_preset("qwen3-next-80b")), 2), name="x").num_full_layers


def test_shape_keys_of_stored_profiles_are_unchanged() -> None:
    """Profiles stored before the layer kinds existed are found by the same key."""
    assert model_preset("deepseek-v3").shape_key == "8ff01da6db815a24"
    assert model_preset("qwen3-moe-235b").shape_key == "4d169a3f335132bd"


# ----------------------------------------------------------------------------------- refusals, one line each
def test_validate_reads_a_config_path(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "minimax", CONFIGS["minimax-m2.5"][1])
    (tmp_path / "job.yaml").write_text(json.dumps(_job(folder, HGX_H200, "v")))
    p = advisor("validate", "job.yaml", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "ok" in p.stdout


def test_unknown_architecture_is_one_line(tmp_path: Path) -> None:
    cfg = {**CONFIGS["qwen3-30b"][1], "architectures": ["LlamaForCausalLM"]}
    folder = _folder(tmp_path, "llama", cfg)
    (tmp_path / "job.yaml").write_text(json.dumps(_job(folder, HGX_H200, "u")))
    line = one_line(advisor("validate", "job.yaml", cwd=tmp_path))
    assert "model.path" in line and "LlamaForCausalLM" in line and "allowed" in line and "GptOssForCausalLM" in line


def test_the_dense_stand_in_reads_as_its_moe_and_a_dense_model_is_refused(tmp_path: Path) -> None:
    """The CPU build's multi-node stand-in (``make_tiny_moe(dense=True)``: ``Qwen3ForCausalLM`` with the MoE's expert
    keys) is read as the tiny MoE; a dense Qwen3 without them is no family the tuner describes."""
    from executors.vllm.tiny_model import make_tiny_moe

    folder = make_tiny_moe(tmp_path / "tiny-dense", dense=True)
    model = ModelProfile.from_hf_config(folder)
    tiny = model_preset("tiny-moe")
    assert (model.n_routed_experts, model.top_k, model.num_layers) == (tiny.n_routed_experts, tiny.top_k,
                                                                       tiny.num_layers)
    cfg = {k: v for k, v in json.loads((folder / "config.json").read_text()).items() if k != "num_experts"}
    with pytest.raises(ValueError, match="'Qwen3ForCausalLM' is not a model family the tuner describes"):
        ModelProfile.from_hf_dict(cfg, name="dense")


def test_nvfp4_on_hopper_is_refused_in_one_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path, "r1-fp4", NVFP4_R1)
    (tmp_path / "job.yaml").write_text(json.dumps(_job(folder, HGX_H200, "f")))
    line = one_line(advisor("validate", "job.yaml", cwd=tmp_path))
    assert "NVFP4" in line and "H200" in line and "Allowed on H200" in line and "B200" in line
    with pytest.raises(BadInput, match="NVFP4"):  # the job loader, for every Hopper kind and a preset override
        job_from_dict({**_job(folder, {"gpu": "H100", "nodes": 1, "gpus_per_node": 8}, "f")})
    with pytest.raises(BadInput, match="NVFP4"):
        job_from_dict({"name": "o", "preset": "h200-dsv3", "model": {"preset": "deepseek-v3", "weight_bytes": 0.5}})
    # on Blackwell it runs (the NVL72 rack)
    job = job_from_dict(_job(folder, RACK, "f-rack"))
    assert tune(job, storage=f"sqlite:///{tmp_path / 's.db'}").executed == 2


def test_mxfp4_runs_on_hopper_weight_only() -> None:
    """gpt-oss and DeepSeek-V4 keep MXFP4 experts on H200: vLLM's Marlin/Triton W4A16 — half-byte reads, BF16 math."""
    h200, b200 = GPU_TABLE["H200"], GPU_TABLE["B200"]
    for name in ("gpt-oss-120b", "deepseek-v4-pro", "deepseek-v4-flash"):
        assert precision_error(model_preset(name), h200) is None
    assert format_tflops(h200, "mxfp4") == h200.bf16_tflops
    assert format_tflops(b200, "mxfp4") == b200.fp8_tflops and format_tflops(b200, "nvfp4") == b200.fp4_tflops
    assert GPU_TABLE["B300"].fp4_tflops and GPU_TABLE["B300"].memory_gib == 288
    m = model_preset("gpt-oss-120b")
    bf16 = m.model_copy(update={"expert_weight_bytes": None, "expert_format": None})
    c = ClusterSpec(gpu="H200")
    role = RoleConfig(role=Role.DECODE, data_parallel_size=8, enable_expert_parallel=True)
    wl = Workload(isl=LengthDist(mean=2048, range_ratio=0.0), osl=LengthDist(mean=256, range_ratio=0.0))
    fp4_dec = decode_throughput_per_gpu(role, m, c, wl, batch=8)["experts_s"]
    assert fp4_dec < 0.6 * decode_throughput_per_gpu(role, bf16, c, wl, batch=8)["experts_s"]  # half the bytes
    pf = RoleConfig(role=Role.PREFILL, data_parallel_size=8, enable_expert_parallel=True)
    assert prefill_throughput_per_gpu(pf, m, c, wl)["experts_s"] == pytest.approx(
        prefill_throughput_per_gpu(pf, bf16, c, wl)["experts_s"], rel=1e-9)  # the same BF16 math


# ----------------------------------------------------------------------------------- directions of the new terms
def _decode_attention(m: ModelProfile, gpu: str, isl: int, batch: float = 32) -> float:
    role = RoleConfig(role=Role.DECODE, data_parallel_size=8, enable_expert_parallel=True)
    wl = Workload(isl=LengthDist(mean=isl, range_ratio=0.0), osl=LengthDist(mean=256, range_ratio=0.0))
    return decode_throughput_per_gpu(role, m, ClusterSpec(gpu=gpu), wl, batch=batch)["attention_s"]


def test_sliding_window_cheapens_long_context_decode_attention() -> None:
    swa = model_preset("gpt-oss-120b")
    full = swa.model_copy(update={"num_sliding_layers": 0, "sliding_window": 0})
    long_swa, long_full = _decode_attention(swa, "B200", 32768), _decode_attention(full, "B200", 32768)
    assert long_swa < 0.6 * long_full  # half the layers read 128 tokens instead of 33K
    assert swa.kv_bytes_per_token == pytest.approx(full.kv_bytes_per_token / 2)


def test_dsa_is_cheaper_than_mla_at_64k() -> None:
    dsa = model_preset("deepseek-v3.2")
    mla = dsa.model_copy(update={"num_sparse_layers": 0, "index_topk": 0, "index_n_heads": 0, "index_head_dim": 0})
    assert _decode_attention(dsa, "B200", 65536) < 0.2 * _decode_attention(mla, "B200", 65536)
    # the indexer's cost still grows with the context: past index_topk, DSA attention is not flat
    assert _decode_attention(dsa, "B200", 65536) > 1.2 * _decode_attention(dsa, "B200", 8192)


def test_linear_layers_cache_no_kv_and_a_constant_state() -> None:
    hybrid = model_preset("qwen3-next-80b")
    dense = hybrid.model_copy(update={"num_linear_layers": 0})
    full = hybrid.num_layers - hybrid.num_linear_layers
    assert hybrid.kv_bytes_per_token == pytest.approx(dense.kv_bytes_per_token * full / hybrid.num_layers)
    state = hybrid.state_bytes_per_seq
    assert state > 0 and dense.state_bytes_per_seq == 0
    for ctx in (1024.0, 65536.0):  # what a sequence reads beyond its KV is its state, at any length
        assert hybrid.kv_read_bytes(ctx) - ctx * hybrid.kv_bytes_per_token == pytest.approx(
            hybrid.num_linear_layers * hybrid.linear_state_bytes)
    role = RoleConfig(role=Role.DECODE, data_parallel_size=8, enable_expert_parallel=True)
    assert kv_capacity_tokens(role, hybrid, ClusterSpec(gpu="H200")) > kv_capacity_tokens(role, dense,
                                                                                          ClusterSpec(gpu="H200"))


def test_fp4_experts_prefill_faster_than_fp8_on_b200() -> None:
    fp8 = model_preset("deepseek-v3")
    fp4 = fp8.model_copy(update={"expert_weight_bytes": 0.5})
    assert fp4.experts_format.value == "nvfp4" and fp4.body_format.value == "fp8"
    role = RoleConfig(role=Role.PREFILL, data_parallel_size=8, enable_expert_parallel=True)
    wl = Workload(isl=LengthDist(mean=4096, range_ratio=0.0), osl=LengthDist(mean=256, range_ratio=0.0))
    c = ClusterSpec(gpu="B200")
    a, b = prefill_throughput_per_gpu(role, fp4, c, wl), prefill_throughput_per_gpu(role, fp8, c, wl)
    assert a["experts_s"] < 0.6 * b["experts_s"] and a["input_tokens_per_s_per_gpu"] > b["input_tokens_per_s_per_gpu"]
    assert a["dense_s"] == pytest.approx(b["dense_s"])  # attention and dense layers stay FP8


def test_deepseek_v4_pro_against_its_stated_savings() -> None:
    """DeepSeek's V4 release: at 1M tokens of context V4-Pro needs 27% of V3.2's per-token inference FLOPs and 10%
    of its KV cache. The preset's layer kinds (built without a config.json) give the same to a few points."""
    from executors.perf.derived import _md

    v32, v4 = model_preset("deepseek-v3.2"), model_preset("deepseek-v4-pro")
    ctx = float(1 << 20)

    def flops(m: ModelProfile) -> float:
        return 2 * m.active_params + _md(m).fa_dec_l * m.attended(ctx) + m.indexer_flops(ctx)

    assert 0.08 < v4.kv_bytes_per_token / v32.kv_bytes_per_token < 0.14
    assert 0.22 < flops(v4) / flops(v32) < 0.32


def test_each_family_names_its_attention_backend() -> None:
    from search_spaces.model_families import attention_backend

    h200, gb300 = GPU_TABLE["H200"], GPU_TABLE["GB300"]
    assert attention_backend(model_preset("deepseek-v3"), h200) == "FLASHMLA"
    assert attention_backend(model_preset("deepseek-v3.2"), gb300).startswith("FLASHMLA_SPARSE")
    assert attention_backend(model_preset("deepseek-v4-pro"), h200).startswith("FLASHMLA_SPARSE_DSV4")
    assert attention_backend(model_preset("qwen3-next-80b"), gb300).startswith("GDN_ATTN")
    assert attention_backend(model_preset("gpt-oss-120b"), gb300).startswith("FLASHINFER")
    assert attention_backend(model_preset("tiny-moe"), GPU_TABLE["CPU"]) == "CPU_ATTN"
