"""The real executors on the CPU build of vLLM: nothing mocked, the tiny Qwen3-MoE with dummy weights.

Each test starts at most two vLLM servers (≈3 GB RSS and ≈25–40 s to start each on 2 cores). After every
run the process groups the executor recorded must be gone (``os.killpg(pgid, 0)`` → ProcessLookupError).
The local aggregated deployment is the session's shared probe (``tiny_local_probe``, tests/shared_runs.py: the SLO
probe of tests/test_knee_real.py too): ``evaluate`` measures its two levels, and on the same deployment, after them
and before the teardown, the agentic and prefix workloads run (cold starts less).
A deployment that cannot start, and the Ray executor's deploy/measure/teardown and ``close``, are the executor
conformance suite's (tests/test_executor_conformance.py).
Run: ``pytest -m vllm tests/test_executors_real.py`` (about 4–6 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from executors import cpu_platform, place
from executors.vllm import server_standby
from executors.vllm.tiny_model import make_tiny_moe
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
from tests.shared_runs import PROBE_LEVELS

CLUSTER = ClusterSpec(gpu="CPU", nodes=1, gpus_per_node=2)
# the cpu-tiny-moe preset's shape: small ISL/OSL, two load levels
WORKLOAD = Workload(isl=LengthDist(mean=64, range_ratio=0.5), osl=LengthDist(mean=16, range_ratio=0.5),
                    load_levels=[1, 4], prompts_per_concurrency=4, warmups_per_concurrency=1, min_prompts=8)
AGGREGATED = DeploymentConfig(mode=Mode.AGGREGATED,
                              decode=RoleConfig(role=Role.MIXED, max_num_seqs=4, max_num_batched_tokens=512))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_moe(tmp_path_factory.mktemp("model") / "tiny-moe")


def _executor(kind, model, tmp_path, **kw):
    common = dict(platform=cpu_platform(kv_storage_path=str(tmp_path / "kv")), served_model_name="tiny-moe",
                  max_model_len=1024, run_dir=tmp_path / "runs", health_timeout_s=240, bench_timeout_s=300,
                  teardown_timeout_s=30, router_timeout_s=60, **kw)
    if kind == "local":
        from executors.local import LocalExecutor

        return LocalExecutor(model, **common)
    from executors.ray.executor import RayExecutor

    return RayExecutor(model, **common)


def _assert_gone(pgids):
    assert pgids, "the executor recorded no process group"
    for pgid in pgids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)


def _assert_sane(ms, levels):
    assert [m.concurrency for m in ms] == levels
    for m in ms:
        assert m.source == "measured" and m.gpus >= 1
        assert m.completed > 0 and m.failed == 0 and m.completed == m.num_requests
        assert m.throughput_per_gpu and m.throughput_per_gpu > 0
        assert m.p50_ttft_ms is not None and 0 < m.p50_ttft_ms <= m.p99_ttft_ms < 60_000
        assert m.p50_e2el_ms is not None and m.p50_e2el_ms >= m.p50_ttft_ms
        assert m.p90_tokens_per_s_per_user is None or m.p90_tokens_per_s_per_user > 0
        assert m.achieved_concurrency is not None and 0 < m.achieved_concurrency <= m.concurrency + 1e-6
        assert m.dp_imbalance == pytest.approx(1.0)  # one DP rank
        assert m.prefix_cache_hit_rate is not None and m.preemptions is not None
        assert "detailed" in m.raw and "metrics" in m.raw
        e = m.raw["engine"]  # what vLLM's own histograms timed of the level's requests and steps
        assert e["ttft_n"] == e["queue_n"] == e["prefill_n"] == m.completed
        assert 0 < e["prefill_ms"] <= e["ttft_ms"] <= m.p99_ttft_ms
        assert e["queue_ms"] >= 0 and e["steps"] >= 1 and e["tokens_per_step"] > 0


def test_tiny_model_matches_the_preset_and_loads_offline(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    a = make_tiny_moe(tmp_path / "a")
    b = make_tiny_moe(tmp_path / "b")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} is not deterministic"
    mtime = (a / "tokenizer.json").stat().st_mtime_ns
    make_tiny_moe(a)  # idempotent: nothing rewritten
    assert (a / "tokenizer.json").stat().st_mtime_ns == mtime
    from transformers import AutoTokenizer

    from search_spaces import ModelProfile

    tok = AutoTokenizer.from_pretrained(str(a))
    assert len(tok) == model_preset("tiny-moe").vocab_size == 2048
    assert tok.decode(tok("the decode batch")["input_ids"]) == "the decode batch"
    prof = ModelProfile.from_hf_config(a)
    preset = model_preset("tiny-moe")
    for f in ("num_layers", "hidden_size", "vocab_size", "num_heads", "num_kv_heads", "head_dim", "n_routed_experts",
              "top_k", "moe_intermediate_size"):
        assert getattr(prof, f) == getattr(preset, f), f
    assert json.loads((a / "config.json").read_text())["architectures"] == ["Qwen3MoeForCausalLM"]


@pytest.mark.vllm
def test_local_aggregated_two_levels(tiny_local_probe):
    r, wall, runs = tiny_local_probe["run"], tiny_local_probe["wall"], tiny_local_probe["runs"]
    assert r.ok, f"{r.failure}: {r.reason}\n{r.log_tail}"
    _assert_sane(r.measurements, PROBE_LEVELS)
    assert r.measurements[0].kv_transfer_tokens is None  # aggregated: no KV transfer
    assert r.timings.deploy_s > 0 and r.timings.measure_s > 0 and r.timings.teardown_s > 0
    res = r.resources
    assert len(res["pgids"]) == 2 and set(res["log_paths"]) == {"mixed-0", "router"}
    assert all(res["stopped"].values())
    assert json.loads((runs / os.path.basename(res["run_dir"]) / "resources.json").read_text())["pgids"]
    assert not os.path.exists(res["kv_dir"])
    _assert_gone(res["pgids"])
    print(f"\nlocal aggregated: wall {wall:.1f} s (with the agentic and prefix workloads), {r.timings}")


@pytest.mark.vllm
def test_local_pd_transfers_kv_through_the_router(tiny_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "1")  # the GPU hosts' client: started with the servers
    # ExampleConnector hands over whole 128-token blocks of prompt[:-1] (vLLM's CPU block size), so prompts are
    # longer than that; the prefill batch holds a whole level (a chunked prefill makes it save partial KV).
    cfg = DeploymentConfig(
        mode=Mode.DISAGGREGATED,
        prefill=RoleConfig(role=Role.PREFILL, max_num_seqs=4, max_num_batched_tokens=2048),
        decode=RoleConfig(role=Role.DECODE, max_num_seqs=4, max_num_batched_tokens=2048),
    )
    wl = Workload(isl=LengthDist(mean=200, range_ratio=0.25), osl=LengthDist(mean=8), load_levels=[2],
                  prompts_per_concurrency=3, warmups_per_concurrency=0, min_prompts=8)
    ex = _executor("local", tiny_model, tmp_path)
    t0 = time.monotonic()
    r = ex.evaluate(place(cfg, CLUSTER), wl)
    wall = time.monotonic() - t0
    assert r.ok, f"{r.failure}: {r.reason}\n{r.log_tail}"
    (m,) = r.measurements
    assert m.completed == m.num_requests == wl.num_prompts(2) and m.gpus == 2
    assert m.kv_transfer_tokens is not None and m.kv_transfer_tokens > 0
    assert m.raw["metrics"]["decode-0"]["kv_transfer_tokens"] == m.kv_transfer_tokens
    assert "--vllm-pd-disaggregation" in open(r.resources["log_paths"]["router"]).readline()
    _assert_gone(r.resources["pgids"])
    # the zygote (recorded first, at deploy) and the one level's fork (no warm-up), all stopped
    assert len(r.resources["bench_pgids"]) == 2
    _assert_gone(r.resources["bench_pgids"])
    assert not os.path.exists(r.resources["kv_dir"])
    print(f"\nlocal P/D: wall {wall:.1f} s, KV tokens received by decode {m.kv_transfer_tokens:.0f}, {r.timings}")


@pytest.mark.vllm
def test_local_next_server_is_started_while_this_one_is_measured(tiny_model, tmp_path, monkeypatch):
    """The standby (executors/vllm/server_standby.py, on by default only on GPU hosts): after a deploy, the next
    deployment's server imports vLLM and waits; the next deploy of the same shape hands it its flags and it
    serves them; closing the executor stops the one left waiting."""
    monkeypatch.setenv("DEPLOY_ADVISOR_SERVER_STANDBY", "1")
    wl = WORKLOAD.model_copy(update={"load_levels": [2], "warmups_per_concurrency": 0})
    other = AGGREGATED.model_copy(update={"decode": RoleConfig(role=Role.MIXED, max_num_seqs=2,
                                                               max_num_batched_tokens=256)})
    ex = _executor("local", tiny_model, tmp_path)
    try:
        first = ex.evaluate(place(AGGREGATED, CLUSTER), wl)
        assert first.ok, f"{first.failure}: {first.reason}\n{first.log_tail}"
        ((_, ddir, _, _), standby), = ex._next
        assert standby.proc.alive and ddir.name != os.path.basename(first.resources["run_dir"])
        second = ex.evaluate(place(other, CLUSTER), wl)
        assert second.ok, f"{second.failure}: {second.reason}\n{second.log_tail}"
        assert second.resources["run_dir"] == str(ddir) and second.resources["pgids"][0] == standby.proc.pgid
        log = open(second.resources["log_paths"]["mixed-0"]).read()
        assert server_standby.ADOPTED in log and "--max-num-seqs 2" in log
        assert "'max_num_seqs': 2" in log  # vLLM's "non-default args": the engine runs the adopted flags
        _assert_gone(first.resources["pgids"] + second.resources["pgids"])
        ((_, _, _, _), waiting), = ex._next
        assert waiting.proc.alive
    finally:
        ex.close()
    _assert_gone([waiting.proc.pgid])
    assert not ex._next


@pytest.mark.vllm
def test_local_agentic_and_prefix_workloads_hit_the_prefix_cache(tiny_local_probe):
    # the deployment of test_local_aggregated_two_levels, measured with both workloads after its own levels
    side, runs = tiny_local_probe["side"], tiny_local_probe["runs"]
    assert tiny_local_probe["run"].ok, tiny_local_probe["run"].reason
    if "error" in side:
        raise side["error"]
    a, p = side["agentic"], side["prefix"]
    # timings add up over measures on one deployment (a second measure once made measure_s negative)
    assert side["after"][0] >= side["own"][0] and side["after"][1] > side["own"][1] > 0
    assert a.completed == a.num_requests == 12 and a.failed == 0
    assert p.completed == p.num_requests == 8 and p.failed == 0
    assert a.prefix_cache_hit_rate and a.prefix_cache_hit_rate > 0
    assert p.prefix_cache_hit_rate and p.prefix_cache_hit_rate > 0
    lines = [json.loads(x) for x in open(next(runs.glob("*/bench/agentic-c2-*.jsonl")))]
    assert len(lines) == 12 and lines[2]["prompt"].startswith(lines[0]["prompt"])  # turn 2 extends turn 1
    _assert_gone(side["pgids"])
    print(f"\nagentic hit rate {a.prefix_cache_hit_rate:.2f}, prefix hit rate {p.prefix_cache_hit_rate:.2f}")
