"""`advisor calibrate`: the performance model's parameters fitted to measured trials, error cross-validated.

The fit is checked against a known answer: a study whose levels come from the simulator run with *other*
parameters (the "truth") must be fitted back to near-zero held-out error from the defaults. Those levels are
labelled ``simulated``, so the real command refuses them; the test calls the library with
``sources=("simulated",)`` — a labelled stand-in for measurements, nothing else. The real command on a real
(CPU vLLM) study is covered in tests/test_tune_real.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import db
from advisor.calibrate import calibrate, folds_of, measured_samples
from advisor.job import job_from_dict
from advisor.tune import tune
from executors import place
from executors.perf import PerfParams, default_params, predict
from db import queries
from search_spaces import TrialState

TRUTH = {"mfu_prefill": 0.35, "hbm_eff": 0.6, "cpu_step_s": 2e-3, "request_latency_s": 0.03}


#: The studies' sampler: TPE without the model guide's turns. The fit is what is tested, not how the trials were
#: picked, and a guide turn ranks the whole space with the model (a 6-trial study took 100 CPU s with it, 3 without).
SAMPLER = {"seed": 1, "guide": False}


def _study(tmp_path: Path, name: str, params: Path | None, trials: int = 14):
    # the preset's three fixed levels only: this is about the fit, not about where the knee search measures
    doc = {"name": name, "preset": "h200-qwen3-235b", "budget": {"trials": trials}, "sampler": SAMPLER,
           "workload": {"knee_search": False},
           "storage": f"sqlite:///{tmp_path / 'cal.db'}", "executor": {"kind": "simulated"}}
    if params is not None:
        doc["executor"]["perf_params"] = str(params)
    job = job_from_dict(doc)
    tune(job)
    return job


def test_fit_recovers_a_known_truth_and_held_out_error_drops(tmp_path: Path) -> None:
    truth = default_params("H200").model_copy(update=TRUTH)
    truth.save(tmp_path / "truth.json")
    job = _study(tmp_path, "truth", tmp_path / "truth.json")
    database = db.connect(job.storage)
    try:
        assert measured_samples(database, "truth", job) == []  # simulated levels are never "measured"
        samples = measured_samples(database, "truth", job, sources=("simulated",))
    finally:
        database.close()
    assert len(samples) == 14
    cal = calibrate(samples, folds=4)
    before, after = cal.before["held_out"].overall, cal.after["held_out"].overall
    assert before > 0.15, before  # the defaults really are wrong for this truth
    assert after < 0.05, (before, after)  # and four folds, each fitted without its trials, predict them
    assert cal.after["in_sample"].overall <= after + 0.02
    assert {"mfu_prefill", "hbm_eff", "cpu_step_s", "request_latency_s"} <= set(cal.fitted)
    # parameters the data cannot see stay at their defaults (the ridge), and everything stays in bounds
    assert cal.params.mtp_acceptance == default_params("H200").mtp_acceptance
    for (lo, hi), v in zip(PerfParams.bounds(), cal.params.to_vector(), strict=True):
        assert lo <= v <= hi
    assert cal.folds == 4 and sorted(s.key for f in folds_of(samples, 4, 0) for s in f) == sorted(cal.trials)


def test_tune_uses_a_calibrated_profile(tmp_path: Path) -> None:
    fitted = default_params("H200").model_copy(update=TRUTH)
    fitted.save(tmp_path / "fitted.json")
    job = _study(tmp_path, "uses", tmp_path / "fitted.json", trials=3)
    database = db.connect(job.storage)
    try:
        t = next(t for t in queries.list_trials(database, "uses", states=[TrialState.COMPLETE]))
        stored = queries.get_trial(database, "uses", t.number)
    finally:
        database.close()
    topo = place(stored.config, job.cluster)
    want = predict(topo, job.model_profile(), job.workload, fitted)
    default = predict(topo, job.model_profile(), job.workload, default_params("H200"))
    got = {m.concurrency: m.throughput_per_gpu for m in stored.measurements}
    assert got == pytest.approx({m.concurrency: m.throughput_per_gpu for m in want})
    assert got != pytest.approx({m.concurrency: m.throughput_per_gpu for m in default})


def _advisor(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args, says", [
    (["sim"], "no complete trial has measured levels"),
    (["nope"], "is not in"),
    (["sim", "--params", "mfu_prefill,warp_speed"], "unknown parameter(s) warp_speed"),
    (["sim", "--folds", "1"], "--folds"),
])
def test_calibrate_bad_input_is_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    _study(tmp_path, "sim", None, trials=2)
    r = _advisor("calibrate", *args, "--storage", f"sqlite:///{tmp_path / 'cal.db'}", "--out",
                 str(tmp_path / "p.json"), cwd=tmp_path)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "p.json").exists()


def test_fit_reads_the_levels_a_knee_search_measured(tmp_path: Path) -> None:
    """A knee-only job (no fixed levels): the model is compared at each trial's own measured concurrencies.
    (Before, calibrate predicted only the job's fixed levels: here none, so every level was a 10× miss and
    nothing was fitted — what the first 30B run on an H200 showed.)"""
    truth = default_params("H200").model_copy(update=TRUTH)
    truth.save(tmp_path / "truth.json")
    doc = {"name": "knee-only", "preset": "h200-qwen3-235b", "budget": {"trials": 6}, "sampler": SAMPLER,
           "workload": {"load_levels": []}, "storage": f"sqlite:///{tmp_path / 'k.db'}",
           "executor": {"kind": "simulated", "perf_params": str(tmp_path / "truth.json")}}
    job = job_from_dict(doc)
    tune(job)
    database = db.connect(job.storage)
    try:
        samples = measured_samples(database, "knee-only", job, sources=("simulated",))
    finally:
        database.close()
    assert samples and all(len(s.measured) >= 2 for s in samples)
    cal = calibrate(samples, folds=3)
    assert cal.before["in_sample"].overall < 2.0  # every level predicted (a 10× miss each would read 900%)
    assert cal.after["in_sample"].overall < 0.5 * cal.before["in_sample"].overall


def test_a_problems_log_ratios_are_its_samples_one_by_one() -> None:
    """A re-fit's residuals come from each job's samples predicted at once; they are each sample's predicted alone,
    value for value and in the same order — over samples of three jobs (other models; one of two samples), both
    modes, concurrencies off the fixed levels, and other parameters."""
    import random

    from advisor.calibrate import Problem, Sample
    from benchmarks.truths import perturbed

    samples = []
    for name, preset, n in (("a", "h200-qwen3-235b", 12), ("b", "h200-dsv3", 12), ("c", "gb300-rack-dsv3", 2)):
        job = job_from_dict({"name": name, "preset": preset})
        cfgs = [c for _, c in job.valid_space().iter_valid_configs()]
        for i, cfg in enumerate(random.Random(3).sample(cfgs, n)):
            cs = sorted(random.Random(i).sample([1, 3, 17, 64, 100, 256, 1024], 4))
            levels = predict(place(cfg, job.cluster), job.model_profile(), job.workload,
                             perturbed(default_params(job.cluster.gpu), i), cs)
            measured = {m.concurrency: {"throughput_per_gpu": m.throughput_per_gpu, "p50_ttft_ms": m.p50_ttft_ms,
                                        "p50_tpot_ms": m.p50_tpot_ms} for m in levels}
            samples.append(Sample(name, i, cfg, job, measured))
    samples.insert(5, samples.pop(20))  # the jobs' samples interleaved
    samples.insert(3, samples.pop())
    assert len({s.config.mode for s in samples}) == 2
    problem = Problem(samples)
    assert sorted(len(idx) for idx, _ in problem._groups) == [2, 12, 12]  # one batch per job
    for params in (default_params("H200"), perturbed(default_params("H200"), 9, 3.0)):
        got = problem.log_ratios(params)
        want = [r for i in range(len(samples)) for r in problem.sample_log_ratios(i, params)]
        assert got == want and len(got) == 3 * problem.levels


def test_a_bursty_level_is_fitted_by_its_e2e_latency_not_its_delivery() -> None:
    """A level whose tokens reached the client in lumps (``bursty-delivery``: the CPU build on a loaded machine)
    has a TTFT and TPOT of the delivery; the fit compares its E2E latency instead, and so recovers a known step
    term that the lumped TPOT — every token at once, 0.02 ms — would drive to its bound (advisor/calibrate.py,
    ``fitted_values``: what a real CPU profile did before)."""
    from advisor.calibrate import BURSTY_METRICS, SERVED_METRICS, Sample, fitted_values

    job = job_from_dict({"name": "b", "preset": "h200-qwen3-235b"})
    truth = default_params("H200").model_copy(update={"cpu_step_s": 2e-3})
    cfgs = [c for _, c in job.valid_space().iter_valid_configs()][::50][:4]
    samples = []
    for i, cfg in enumerate(cfgs):
        levels = predict(place(cfg, job.cluster), job.model_profile(), job.workload, truth, [1, 8, 64])
        if i == 0:  # its first level delivered in one lump per request
            levels[0] = levels[0].model_copy(update={"flags": ["bursty-delivery"], "p50_tpot_ms": 0.02,
                                                     "p50_ttft_ms": levels[0].p50_e2el_ms})
        samples.append(Sample("b", i, cfg, job, {m.concurrency: fitted_values(m) for m in levels}))
    assert set(samples[0].measured[1]) == set(BURSTY_METRICS)
    assert set(samples[0].measured[8]) == set(samples[1].measured[1]) == set(SERVED_METRICS)
    cal = calibrate(samples, names=["cpu_step_s"])
    assert cal.params.cpu_step_s == pytest.approx(2e-3, rel=0.05), cal.params.cpu_step_s
