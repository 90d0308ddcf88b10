"""`advisor import`: operating points measured elsewhere stored as external measurements, and fitted to.

Published rows come from the visible set beside the clone (``../shared/published/visible.csv``; CI has it
read-only there). A user's own ``vllm bench serve`` result is the session's real CPU run (``tiny_local_probe``,
tests/shared_runs.py: the JSONs its c=1 and c=8 levels saved). The calibration is checked against a known answer:
points predicted by the model with other parameters (the "truth", as tests/test_calibrate.py does for studies)
are imported, fitted, and a point left out of the import is then predicted closer to its truth than before.
"""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import db
from advisor.cli import app
from advisor.operating_point import REQUIRED_COLUMNS, job_of, read_published_csv
from executors import place
from executors.perf import PerfParams, default_params, predict

ROOT = Path(__file__).resolve().parents[1]
VISIBLE = ROOT.parent / "shared" / "published" / "visible.csv"
#: Perturbed parameters the imported points are predicted with (tests/test_calibrate.py's truth).
TRUTH = {"mfu_prefill": 0.35, "hbm_eff": 0.6, "cpu_step_s": 2e-3, "request_latency_s": 0.03}


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, list(args))
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise res.exception  # a traceback here is a bug of ours: shown whole, not as an exit code
    return res.exit_code, res.output


def _published(tmp_path: Path, n_vllm: int = 4, n_other: int = 2) -> Path:
    """A small published table: the visible set's header, its first vLLM rows and a few SGLang/TRT-LLM rows."""
    with VISIBLE.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        header, rows = reader.fieldnames, list(reader)
    assert header is not None
    picked = [r for r in rows if r["engine"] == "vllm"][:n_vllm] + [r for r in rows if r["engine"] != "vllm"][:n_other]
    out = tmp_path / "published.csv"
    with out.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=header)
        w.writeheader()
        w.writerows(picked)
    return out


def test_published_rows_are_imported_once_with_their_source(tmp_path: Path) -> None:
    table = _published(tmp_path)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    expected = [p for p in read_published_csv(table) if not hasattr(p, "reason")]
    assert len(expected) == 6
    code, out = _cli("import", str(table), "--label", "inferencex", "--storage", url)
    assert code == 0, out
    assert "6 point(s) added, 0 already stored" in out
    with db.connect(url) as d:
        points = d.external_points(batch="inferencex")
        assert [(p.source, p.concurrency, p.requests, p.metrics) for p in points] == \
            [(e.source, e.concurrency, e.requests, e.measured) for e in expected]  # type: ignore[union-attr]
        first = points[0]
        assert first.engine == "vllm" and first.deployment is not None and first.total_gpus == 8
        assert first.deployment.total_gpus == 8 and first.mode == "agg"
        assert first.metrics["tput_per_gpu"] > 0 and first.per_gpu_normalization
    # the same rows again, under the same or another label: nothing added
    for label in ("inferencex", "again"):
        code, out = _cli("import", str(table), "--label", label, "--storage", url)
        assert code == 0 and "0 point(s) added, 6 already stored" in out, out
    code, out = _cli("query", "external", "batch=inferencex", "--storage", url, "--format", "csv")
    assert code == 0, out
    rows = list(csv.DictReader(out.splitlines()))
    assert len(rows) == 6 and {r["batch"] for r in rows} == {"inferencex"}
    assert rows[0]["source"] == expected[0].source  # type: ignore[union-attr]
    with db.connect(url) as d:
        assert d.external_batches() == [("inferencex", 6)]


def _advisor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def test_bad_input_is_one_line_naming_the_file_and_writes_nothing(tmp_path: Path) -> None:
    good = _published(tmp_path, 2, 0)
    with good.open(newline="") as f:
        rows = list(csv.DictReader(f))
    missing = tmp_path / "no-gpu.csv"
    with missing.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[c for c in rows[0] if c != "gpu"], extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    not_bench = tmp_path / "not-bench.json"
    not_bench.write_text('{"model": "x", "results": [1, 2]}')
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("mode: aggregated\ndecode: {role: mixed, max_num_seqs: 4}\n")
    url = f"sqlite:///{tmp_path / 'a.db'}"
    cases = [
        (["import", str(good), str(missing)], ["no-gpu.csv", "missing column", "gpu"]),
        (["import", str(good), str(not_bench), "--config", str(cfg), "--model", "tiny-moe", "--gpu", "CPU"],
         ["not-bench.json", "not a `vllm bench serve --save-result` result", "completed"]),
        (["import", str(good), str(tmp_path / "absent.csv")], ["absent.csv", "no such file"]),
        (["import", str(not_bench)], ["not-bench.json", "--config"]),
    ]
    for args, words in cases:
        p = _advisor(*args, "--storage", url, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
        assert all(w in lines[0] for w in words), lines[0]
        assert not (tmp_path / "a.db").exists()  # read whole before anything is opened or written
    # a database that cannot be opened: one line, its password never shown
    p = _advisor("import", str(good), "--storage", "postgresql://u:s3cr3t@127.0.0.1:1/x", cwd=tmp_path)
    assert p.returncode == 2 and "s3cr3t" not in p.stdout + p.stderr and "***" in p.stderr, p.stderr
    assert len([ln for ln in p.stderr.splitlines() if ln.strip()]) == 1, p.stderr


def _row(cfg_tp: int, concurrency: int, metrics: dict[str, float]) -> dict[str, str]:
    row = dict.fromkeys(REQUIRED_COLUMNS, "")
    row.update({"source": f"truth#c={concurrency}", "engine": "vllm", "model": "DeepSeek-V3", "precision": "fp8",
                "gpu": "H200", "total_gpus": str(cfg_tp), "mode": "agg", "decode_instances": "1",
                "decode_tp": str(cfg_tp), "decode_dp": "1", "decode_ep": "1", "isl": "1024", "osl": "256",
                "concurrency": str(concurrency)})
    row.update({k: f"{v:.6g}" for k, v in metrics.items()})
    return row


def _write(path: Path, rows: list[dict[str, str]]) -> Path:
    cols = [*REQUIRED_COLUMNS, "tput_per_gpu", "median_ttft_ms", "median_tpot_ms"]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def test_calibration_on_imported_points_moves_a_held_out_point_toward_its_measurement(tmp_path: Path) -> None:
    """One deployment (TP8 DeepSeek-V3 on 8 × H200) at six concurrencies, measured by a model with other parameters;
    five are imported and fitted, the sixth predicted before and after."""
    truth = default_params("H200").model_copy(update=TRUTH)
    levels, held_out = [2, 8, 16, 64, 128], 32
    blank = _write(tmp_path / "blank.csv", [_row(8, c, {}) for c in [*levels, held_out]])
    points = {p.concurrency: p for p in read_published_csv(blank)}  # type: ignore[union-attr]
    job = job_of(points[held_out])
    assert not isinstance(job, str), job

    def at(params: PerfParams, c: int) -> dict[str, float]:
        (m,) = predict(place(points[c].config, job.cluster), job.model_profile(), job.workload, params, [c])
        return {"tput_per_gpu": m.throughput_per_gpu, "median_ttft_ms": m.p50_ttft_ms,
                "median_tpot_ms": m.p50_tpot_ms}

    table = _write(tmp_path / "truth.csv", [_row(8, c, at(truth, c)) for c in levels])
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert _cli("import", str(table), "--label", "truth", "--storage", url)[0] == 0
    code, out = _cli("calibrate", "--external", "truth", "--out", str(tmp_path / "p.json"), "--storage", url)
    assert code == 0, out
    assert "5 measured trials and imported points on H200" in out
    fitted = PerfParams.load(tmp_path / "p.json")
    measured, before, after = at(truth, held_out), at(default_params("H200"), held_out), at(fitted, held_out)

    def miss(pred: dict[str, float]) -> float:
        return math.sqrt(sum(math.log(pred[k] / measured[k]) ** 2 for k in measured) / len(measured))

    assert miss(before) > 0.1, (before, measured)  # the defaults really are wrong here
    assert miss(after) < 0.5 * miss(before), (before, after, measured)
    assert abs(math.log(after["tput_per_gpu"] / measured["tput_per_gpu"])) < \
        abs(math.log(before["tput_per_gpu"] / measured["tput_per_gpu"]))


def test_calibrate_names_an_unknown_batch(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    assert _cli("import", str(_published(tmp_path, 1, 0)), "--label", "one", "--storage", url)[0] == 0
    code, out = _cli("calibrate", "--external", "two", "--storage", url, "--out", str(tmp_path / "p.json"))
    assert code == 2 and "no imported batch 'two'" in out and "'one' (1)" in out, out
    code, out = _cli("calibrate", "--storage", url, "--out", str(tmp_path / "p.json"))
    assert code == 2 and "name the studies to fit, or an imported batch with --external" in out, out
    assert not (tmp_path / "p.json").exists()


@pytest.mark.vllm
def test_a_real_bench_json_is_imported_with_its_deployment(tiny_local_probe, tmp_path: Path) -> None:
    """The JSONs the session's real CPU run saved (``vllm bench serve --save-result``), with the probe's job and
    deployment: each becomes one point whose numbers are the stored level's, again added only once."""
    run, runs = tiny_local_probe["run"], Path(tiny_local_probe["runs"])
    assert run.ok, run.reason
    files = sorted(runs.glob("*/bench/c[0-9]*.json"))
    by_name = {f.stem: f for f in files}
    assert {"c1", "c8"} <= set(by_name), files
    job_file = tmp_path / "job.yaml"
    import yaml

    from tests.shared_runs import PROBE_JOB, PROBE_SEQS

    job_file.write_text(yaml.safe_dump(PROBE_JOB))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"mode": "aggregated", "decode": {"role": "mixed", "max_num_seqs": PROBE_SEQS,
                                                                     "max_num_batched_tokens": 2048}}))
    url = f"sqlite:///{tmp_path / 'a.db'}"
    args = ["import", str(by_name["c1"]), str(by_name["c8"]), "--job", str(job_file), "--config", str(cfg),
            "--label", "cpu-probe", "--engine-version", "vllm-cpu", "--storage", url]
    code, out = _cli(*args)
    assert code == 0 and "2 point(s) added" in out, out
    code, out = _cli(*args)
    assert code == 0 and "0 point(s) added, 2 already stored" in out, out
    with db.connect(url) as d:
        points = d.external_points(batch="cpu-probe")
    assert [p.concurrency for p in points] == [1, 8]
    stored = {m.concurrency: m for m in run.measurements}
    for p in points:
        assert p.model == "tiny-moe" and p.gpu == "CPU" and p.total_gpus == 1 and p.engine == "vllm"
        assert p.source.startswith(f"c{p.concurrency}.json#sha256=") and p.engine_version == "vllm-cpu"
        assert p.isl == 256 and p.osl == 32  # the job's workload
        assert p.deployment is not None and p.deployment.decode.max_num_seqs == PROBE_SEQS
        assert p.metrics["tput_per_gpu"] > 0 and p.metrics["median_ttft_ms"] > 0
        runs_of_level = [f for f in files if f.stem.split("-")[0] == f"c{p.concurrency}"]
        if len(runs_of_level) == 1:  # parsed by the same parser as the trial's level: the same numbers (a level
            m = stored[p.concurrency]  # measured again, or two runs pooled, is not one JSON's)
            assert p.metrics["tput_per_gpu"] == pytest.approx(m.throughput_per_gpu)
            assert p.metrics["median_ttft_ms"] == pytest.approx(m.p50_ttft_ms)


def test_a_studys_pareto_plot_draws_the_imported_points_of_its_model_and_gpu(tmp_path: Path) -> None:
    """The dashboard's overlay: points of the study's model preset and GPU kind only, as their own trace, their
    text escaped (a batch label or source is whatever a file said)."""
    import pandas as pd

    from advisor.external import level_values, of_study
    from advisor.job import job_from_dict
    from ui.plots import external_trace, pareto_figure

    with VISIBLE.open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    mine = [r for r in rows if r["gpu"] == "H200" and r["model"].startswith("DeepSeek-R1")][:3]
    other = [r for r in rows if r["gpu"] == "B200"][:2]
    table = tmp_path / "t.csv"
    with table.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(mine + other)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    label = "<b>bold</b> & co"
    code, out = _cli("import", str(table), "--label", label, "--storage", url)
    assert code == 0, out
    job = job_from_dict({"name": "s", "preset": "h200-dsv3", "executor": {"kind": "simulated"}})
    with db.connect(url, read_only=True) as d:
        points = of_study(d.external_points(), job)
    assert len(points) == len(mine) and {p.gpu for p in points} == {"H200"}
    frame = pd.DataFrame([{"batch": p.batch, "source": p.source, "engine": p.engine, "deployment": p.deployment_text,
                           "gpus": p.total_gpus, "concurrency": p.concurrency, **level_values(p)} for p in points])
    x, y = "throughput_per_gpu", "p50_ttft_ms"
    trace = external_trace(frame, x, y)
    assert trace is not None and trace.meta == "external" and len(trace.x) == len(mine)
    assert "<b>bold" not in trace.name and "&lt;b&gt;bold&lt;/b&gt; &amp; co" in trace.name
    assert all("<b>" not in c[0] for c in trace.customdata)
    levels = pd.DataFrame(columns=["trial", "concurrency", "config", "p90_ttft_ms", x, y, "meets_slo", "pareto"])
    fig = pareto_figure(levels.astype({"meets_slo": bool, "pareto": bool}), x, y, external=frame)
    assert [t.meta for t in fig.data].count("external") == 1
    assert external_trace(frame, x, "p99_itl_ms") is None  # no published column of that metric: nothing drawn


def test_the_study_page_draws_imported_points_read_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The study page with imported points of its model and GPU: no exception, the caption counts them, the
    database file unchanged by the read-only dashboard."""
    from streamlit.testing.v1 import AppTest

    from advisor.job import job_from_dict
    from advisor.tune import tune

    url = f"sqlite:///{tmp_path / 'a.db'}"
    tune(job_from_dict({"name": "ui-ext", "preset": "h200-qwen3-235b", "budget": {"trials": 3}, "storage": url,
                        "sampler": {"seed": 1, "guide": False}, "workload": {"knee_search": False},
                        "executor": {"kind": "simulated"}}))
    rows = []
    for c, tput, tpot in ((16, 900.0, 20.0), (64, 2100.0, 35.0)):
        row = _row(8, c, {"tput_per_gpu": tput, "median_tpot_ms": tpot})
        row.update({"model": "Qwen3-235B-A22B <i>FP8</i>", "source": f"https://example.org/<script>#{c}",
                    "p90_tpot_ms": str(tpot * 1.2)})
        rows.append(row)
    cols = [*REQUIRED_COLUMNS, "tput_per_gpu", "median_tpot_ms", "p90_tpot_ms"]
    table = tmp_path / "q.csv"
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, restval="")
        w.writeheader()
        w.writerows(rows)
    assert _cli("import", str(table), "--label", "blog", "--storage", url)[0] == 0
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    monkeypatch.delenv("ADVISOR_ALLOW_NEW_STUDIES", raising=False)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path / "runs"))
    before = (tmp_path / "a.db").read_bytes()
    at = AppTest.from_file(str(ROOT / "ui" / "app.py"), default_timeout=120)
    at.switch_page("views/study.py")
    at.query_params["study"] = "ui-ext"
    at.query_params["tab"] = "Pareto front"
    at.run()
    assert not at.exception, [e.message for e in at.exception]
    captions = "\n".join(str(c.value) for c in at.caption)
    assert "2 imported operating point(s) of this model and GPU kind" in captions, captions
    assert (tmp_path / "a.db").read_bytes() == before
