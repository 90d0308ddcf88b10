"""The recorded 30B-MoE study on 1 × H200 (knee search, baseline, repeats) says what docs/benchmarks.md says.

The raw results (the device's database and every `vllm bench serve` JSON) are committed as
``research/results/h200-knee/raw.tar.xz``; this test unpacks them, reads the study back through the
project's own queries and re-derives the figures the docs quote, including the calibration.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

import db
from advisor.calibrate import calibrate, measured_samples
from advisor.job import job_from_dict
from advisor.objectives import operating_point
from db import queries
from research.tests.gpu_records import raw_or_skip, written_record

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "research" / "results" / "h200-knee"
STUDY = "h200-knee-30b"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    out = tmp_path_factory.mktemp("h200-knee")
    with tarfile.open(raw_or_skip(RESULTS / "raw.tar.xz")) as tar:
        tar.extractall(out, filter="data")
    database = db.connect(f"sqlite:///{out / 'raw/da-gpu/results.db'}")
    try:
        study = queries.get_study(database, STUDY)
        trials = [queries.get_trial(database, STUDY, t.number) for t in queries.list_trials(database, STUDY)]
        doc = dict(study.job) if study else {}
        doc["model"] = {"path": str(ROOT / "research/gpu/models/qwen3-moe-30b")}
        job = job_from_dict(doc)
        samples = measured_samples(database, STUDY, job)
    finally:
        database.close()
    docs = written_record()
    return {"trials": {t.number: t for t in trials}, "job": job, "samples": samples, "docs": docs, "dir": out}


def test_trials_levels_and_knees_are_what_the_docs_say(recorded) -> None:
    t, job, docs = recorded["trials"], recorded["job"], recorded["docs"]
    assert [t[n].proposer for n in range(4)] == ["baseline", "model", "repeat", "repeat"]
    assert (t[2].repeat_of, t[3].repeat_of) == (1, 0)
    for n in range(4):
        assert len(t[n].measurements) == 4 and all(m.purpose in ("search", "knee") for m in t[n].measurements)
    for n in (0, 3):  # the defaults: no level met the SLOs
        point, violation = operating_point(job, list(t[n].measurements))
        assert violation > 0 and not any(m.purpose == "knee" for m in t[n].measurements)
        c99 = next(m for m in t[n].measurements if m.concurrency == 99)
        assert c99.p90_ttft_ms < 2000 and c99.p90_tokens_per_s_per_user < 30
        assert f"{c99.p90_tokens_per_s_per_user:.1f}" in docs
    for n in (1, 2):
        knee = next(m for m in t[n].measurements if m.purpose == "knee")
        assert knee.concurrency == 37 and "bracket-open" in knee.flags
        assert f"{knee.throughput_per_gpu:,.0f}" in docs
    ratio = t[1].objectives["throughput_per_gpu"] / t[1].predicted["throughput_per_gpu"]
    assert f"{t[1].predicted['throughput_per_gpu']:,.0f}" in docs and 0.4 < ratio < 0.45  # the model's 138% miss
    assert f"{t[0].deploy_s:.1f}" in docs and f"{t[3].deploy_s:.1f}" in docs


def test_calibration_on_the_recorded_levels_matches_the_docs(recorded) -> None:
    cal = calibrate(recorded["samples"], folds=4)
    before, after = cal.before["held_out"].overall, cal.after["held_out"].overall
    assert cal.before["held_out"].levels == 16
    assert f"{before:.1%}" in recorded["docs"] and f"{after:.1%}" in recorded["docs"]
    assert after < 0.5 * before
