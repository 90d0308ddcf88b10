"""The hardware profile for real (issue 29): `advisor profile` on the tiny dummy-weight MoE with vLLM's CPU build at
two depths, then studies that start from it without being told. Nothing mocked.

One module fixture profiles once (two cold starts, 8 probe levels; a few minutes on 2 cores); the tests read it:

* the profile is stored whole (GPU kind and count, vLLM's version, the shape, every probe level, the fitted
  parameters and their cross-validated errors) and written as a parameter file; no probe level read another's
  prompts from the prefix cache (each probe has its own seed);
* the fit predicted each probe as the benchmark sent it (``level_model: as sent``), and a real study (the local
  executor, `executor.profile: auto`) finds it instead of profiling again, says so, and starts its knee search
  where the profiled model, predicting levels as sent too, puts the knee;
* a simulated study of the same shape on the same GPU kind predicts with it, and every level says so;
* the profiled model predicts the real study's level — a concurrency (3) and a batch size (max-num-seqs 4; the probes
  ran vLLM's CPU default, 128) and a workload (ISL 192 / OSL 24) no probe measured — closer than the CPU kind's
  default parameters: the RMS of log(predicted / measured) over the values a fit compares
  (``advisor.calibrate.fitted_values``), the loss the profile's fit minimises, the level predicted as it was sent;
* the same profile predicts a level of another shape — twice the width, twice the experts and experts per token, three
  layers (``OTHER_SHAPE``), served from its own folder — closer than the defaults, by the same loss: what a profile
  fits is the hardware and the engine, not the shape (on a 2-core machine shared with other vLLM test runs, c = 3:
  RMS log 0.18 against 0.44 with the probe fit's ridge at 0.05; 0.23 against 0.98 at 0.5, a level delivered in bursts
  whose throughput and E2E latency are compared).

That last clause holds since the model learnt that vLLM's CPU build has no CUDA graphs (``GPUSpec.graphs``): with
decode modelled as graphed, no term grew a decode step with depth, though every probe showed it, and the fit split the
difference between the depths. Why the RMS log and not the median |predicted / measured - 1| of the three values: on
5 Dec (run 1's probes refitted with the change, runs 2-4 fitted with it) the study's deployment ran 0.8-1.2x as fast
as the same-shape probe deployment minutes before it, and the pessimistic defaults gain from a slow one on throughput
and TTFT; the median followed those two (profiled vs defaults 0.11/0.45, 0.33/0.46, 0.33/0.32: a loss in run 3,
0.14/0.47) where the RMS log also weighs the decode step the defaults miss by 1.7-2.4x (0.22/0.59, 0.49/0.58,
0.34/0.44, 0.21/0.63).
It failed once, in CI on 5 Dec (0.47 vs 0.33): the study's level, 24 requests in 1.5 s, ran 1.7x slower than the
profile's probes had measured the shape (P50 TPOT 9.0 ms against 5.4 predicted; the defaults say 13.1). Levels of a
second or less on 2 cores follow the machine's speed of that second, so the probes (``plan_profile``: 24 and 32
requests on the CPU build, 4 and 8 before) and this level (48 requests) are longer now: on a faster machine the same
day, 0.27 vs 1.08 before and 0.16 vs 1.23 after. A machine that stays 1.5x slower for the minute between probes and
study still fails it: the defaults are that pessimistic.
docs/benchmarks.md, "Figures the real tests printed", has every run's figures.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

import db
from advisor.calibrate import Problem, Sample, fitted_values
from advisor.job import job_from_dict, load_job
from executors import place
from executors.measuring.loop import MeasurePlan
from executors.measuring.bench_result import first_wave_left_out
from executors.perf import PerfParams, default_params
from executors.simulated.executor import levels_as_sent, predicted_knee
from search_spaces import DeploymentConfig, Mode, Role, RoleConfig

pytestmark = [pytest.mark.vllm]

SEQS = 4  # the study's batch size: the profile deployed vLLM's CPU default (128)


def advisor(*args: str, cwd: Path, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _job(work: Path, name: str, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": name, "preset": "cpu-tiny-moe", "cluster": {"gpu": "CPU", "nodes": 1, "gpus_per_node": 1},
        "executor": {"kind": "local", "run_dir": str(work / "runs")}, "storage": f"sqlite:///{work / 'results.db'}",
    }
    doc.update(over)
    return doc


@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("profile")
    (work / "profile.yaml").write_text(yaml.safe_dump(_job(work, "prof")))
    r = advisor("profile", "profile.yaml", "--depths", "1,2", "--out", "params.json", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not list((work / "runs" / "profile-models" / "measured").glob("*")), "a stored profile leaves no checkpoint"
    return {"work": work, "out": r.stdout}


def _config() -> DeploymentConfig:
    role = RoleConfig(role=Role.MIXED, data_parallel_size=1, max_num_seqs=SEQS, max_num_batched_tokens=2048)
    return DeploymentConfig(mode=Mode.AGGREGATED, decode=role)


def test_profile_is_stored_whole_and_written_as_a_parameter_file(profiled):
    work = profiled["work"]
    job = load_job(work / "profile.yaml")
    database = db.connect(job.storage)
    try:
        stored = database.profiles(gpu="CPU", shape_key=job.model_profile().shape_key)
    finally:
        database.close()
    assert len(stored) == 1
    p = stored[0]
    assert p.gpu_count == 1 and p.engine_version and "vllm" in p.engine_version
    assert p.shape == job.model_profile().shape and p.report["depths"] == [1, 2]
    assert p.report["level_model"] == "as sent"  # each probe predicted as the benchmark sent it
    assert set(p.report["at_bounds"]) <= set(p.report["fitted"])  # the fitted terms the fit left at a bound, named
    assert f"stored {p.label}" in profiled["out"]
    # every probe level, at both depths, prefill (one output token) and decode
    assert {(lv["depth"], lv["kind"]) for lv in p.probes} == {(1, "prefill"), (1, "decode"), (2, "prefill"),
                                                               (2, "decode")}
    assert len(p.probes) == 8 and all(lv["completed"] and "flags" in lv for lv in p.probes)
    # probes of one deployment never share prompts (each has its own seed): no prefix-cache hits
    assert all((lv["prefix_cache_hit_rate"] or 0.0) <= 0.01 for lv in p.probes), \
        [(lv["kind"], lv["isl"], lv["concurrency"], lv["prefix_cache_hit_rate"]) for lv in p.probes]
    # the fit is cross-validated by probe, and the file is the stored parameters
    assert p.report["error_after"]["held_out"]["levels"] == 8
    assert PerfParams.load(work / "params.json") == PerfParams.model_validate(p.params)
    assert p.params != default_params("CPU").model_dump()


@pytest.fixture(scope="module")
def real_study(profiled) -> dict[str, Any]:
    """A real knee-search study of another batch size, whose SLO puts the profiled model's knee at 3 of 1..8."""
    work = profiled["work"]
    database = db.connect(f"sqlite:///{work / 'results.db'}")
    try:
        params = PerfParams.model_validate(database.profiles(gpu="CPU")[0].params)
    finally:
        database.close()
    # one level: where the search starts is what is asserted (tests/test_knee_real.py follows a search to its end)
    workload = {"dataset": "random", "isl": {"mean": 192, "range_ratio": 0.2}, "osl": {"mean": 24, "range_ratio": 0.2},
                "load_levels": [], "knee_search": True, "max_load": 8, "max_levels": 1, "knee_tolerance": 0.3,
                "prompts_per_concurrency": 16, "min_prompts": 48, "warmups_per_concurrency": 1}
    doc = _job(work, "study", workload=workload,
               space={"modes": ["aggregated"], "mixed": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [SEQS],
                                                         "max_num_batched_tokens": [2048]}},
               sampler={"kind": "grid", "seed": 0}, budget={"trials": 1, "repeat_top": 0})
    doc["executor"]["profile"] = "auto"  # the preset turns it off; a stored profile must be found, not remade
    probe = job_from_dict({**doc, "slos": [], "workload": {**workload, "load_levels": [3, 4]}})  # what it predicts
    topo = place(_config(), probe.cluster)
    e2e = {m.concurrency: m.p50_e2el_ms  # as the trial will predict them: as sent, the profile's view
           for m in levels_as_sent(topo, probe.model_profile(), probe.workload, params, [3, 4])}
    bound = math.sqrt(e2e[3] * e2e[4])
    doc["slos"] = [{"metric": "p50_e2el_ms", "op": "<=", "value": round(bound, 3)}]
    (work / "study.yaml").write_text(yaml.safe_dump(doc))
    r = advisor("tune", "study.yaml", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    job = load_job(work / "study.yaml")
    plan = MeasurePlan(tuple(job.slos))
    return {"work": work, "out": r.stdout, "job": job, "params": params,
            "start": predicted_knee(topo, job.model_profile(), job.workload, plan, params, as_sent=True),
            "start_defaults": predicted_knee(topo, job.model_profile(), job.workload, plan, default_params("CPU"),
                                             as_sent=True)}


def test_real_study_starts_its_knee_search_from_the_profile_and_says_so(real_study):
    job, work = real_study["job"], real_study["work"]
    database = db.connect(job.storage)
    try:
        assert len(database.profiles()) == 1  # found, not made again
        label = database.profiles()[0].label
        trial = db.queries.get_trial(database, "study", 0)
    finally:
        database.close()
    assert f"model: {label}" in real_study["out"]
    assert trial is not None and trial.state == "complete"
    started = [m for m in trial.measurements if "knee_start" in m.raw]
    assert len(started) == 1, [(m.concurrency, m.purpose) for m in trial.measurements]
    assert real_study["start"] == 3.0  # the SLO was placed so
    assert real_study["start_defaults"] != real_study["start"]
    # the search began where the profiled model put the knee, not where the defaults would have
    assert started[0].concurrency == 3 and started[0].raw["knee_start"] == "model"


def test_profile_predicts_the_unmeasured_level_better_than_the_defaults(real_study):
    job = real_study["job"]
    database = db.connect(job.storage)
    try:
        trial = db.queries.get_trial(database, "study", 0)
    finally:
        database.close()
    assert trial is not None and trial.config is not None
    level = next(m for m in trial.measurements if "knee_start" in m.raw)
    measured = fitted_values(level)
    assert len(measured) >= 2, level
    # the level as a fit sample: ``Problem.errors`` predicts it as it was sent and compares, as a profile's fit does
    c = level.concurrency
    wave = frozenset({c}) if first_wave_left_out(level) else frozenset()
    problem = Problem([Sample("study", 0, trial.config, job, {c: measured}, {c: level.completed}, wave)], as_sent=True)
    profiled, defaults = problem.errors(real_study["params"]), problem.errors(default_params("CPU"))
    # the fit's own loss (``Errors.rms_log``): the median of three values followed the noisier two (module docstring)
    assert profiled.rms_log < defaults.rms_log, (profiled, defaults, measured)


def test_simulated_study_of_the_same_shape_predicts_with_the_profile(profiled):
    work = profiled["work"]
    doc = _job(work, "what-if", executor={"kind": "simulated"}, sampler={"kind": "grid", "seed": 0},
               budget={"trials": 1, "repeat_top": 0}, slos=[{"metric": "p90_ttft_ms", "op": "<=", "value": 60000}],
               space={"modes": ["aggregated"], "mixed": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [16],
                                                         "max_num_batched_tokens": [2048]}})
    (work / "what-if.yaml").write_text(yaml.safe_dump(doc))
    r = advisor("tune", "what-if.yaml", cwd=work, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    database = db.connect(doc["storage"])
    try:
        label = database.profiles()[0].label
        trial = db.queries.get_trial(database, "what-if", 0)
    finally:
        database.close()
    assert f"model: {label}" in r.stdout
    assert trial is not None and trial.measurements
    assert {m.raw.get("params") for m in trial.measurements} == {label}
    json.dumps([m.raw for m in trial.measurements])  # what the simulated levels carry is plain data


#: The held-out shape: the tiny MoE twice as wide, with twice the experts, twice the experts per token and three
#: layers — a width, an expert count and a depth the profile (1 and 2 layers of the tiny shape) never deployed.
OTHER_SHAPE = {"hidden_size": 256, "num_attention_heads": 8, "num_experts": 16, "num_experts_per_tok": 4,
               "num_hidden_layers": 3}


@pytest.fixture(scope="module")
def other_shape(profiled) -> dict[str, Any]:
    """One real level of another model shape (``OTHER_SHAPE``), served by vLLM's CPU build as a user's model
    folder, with no profile of its own (``executor.profile: off``)."""
    from advisor.executor_factory import model_path_for
    from executors.vllm.model_folder import write_model_folder

    work = profiled["work"]
    tiny = model_path_for(load_job(work / "profile.yaml"))
    cfg = {**json.loads((tiny / "config.json").read_text()), **OTHER_SHAPE}
    folder = write_model_folder(cfg, work / "other-shape", tokenizer_from=tiny)
    workload = {"dataset": "random", "isl": {"mean": 192, "range_ratio": 0.2}, "osl": {"mean": 24, "range_ratio": 0.2},
                "load_levels": [3], "knee_search": False, "prompts_per_concurrency": 16, "min_prompts": 48,
                "warmups_per_concurrency": 1}
    doc = _job(work, "other-shape", model={"path": str(folder)}, workload=workload,
               slos=[{"metric": "p90_ttft_ms", "op": "<=", "value": 60000}],
               space={"modes": ["aggregated"], "mixed": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [SEQS],
                                                         "max_num_batched_tokens": [2048]}},
               sampler={"kind": "grid", "seed": 0}, budget={"trials": 1, "repeat_top": 0})
    doc["executor"]["profile"] = "off"
    (work / "other-shape.yaml").write_text(yaml.safe_dump(doc))
    r = advisor("tune", "other-shape.yaml", cwd=work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    job = load_job(work / "other-shape.yaml")
    database = db.connect(job.storage)
    try:
        trial = db.queries.get_trial(database, "other-shape", 0)
        params = PerfParams.model_validate(database.profiles(gpu="CPU")[0].params)
    finally:
        database.close()
    return {"job": job, "trial": trial, "params": params}


def test_profile_of_one_shape_predicts_another_shapes_level_better_than_the_defaults(other_shape):
    """A profile's parameters describe the hardware and the engine, not the shape it was measured on: the tiny
    shape's profile predicts a level of a wider, deeper shape with more experts closer than the CPU kind's defaults
    (the RMS log over the level's fitted values, as sent, as the unmeasured-level test above)."""
    job, trial = other_shape["job"], other_shape["trial"]
    assert job.model_profile().shape_key != load_job(job.resolve_path("profile.yaml")).model_profile().shape_key
    assert trial is not None and trial.config is not None and trial.measurements
    level = trial.measurements[0]
    measured = fitted_values(level)
    assert len(measured) >= 2, level
    c = level.concurrency
    wave = frozenset({c}) if first_wave_left_out(level) else frozenset()
    problem = Problem([Sample("other-shape", 0, trial.config, job, {c: measured}, {c: level.completed}, wave)],
                      as_sent=True)
    profiled, defaults = problem.errors(other_shape["params"]), problem.errors(default_params("CPU"))
    print(f"other shape, c = {c}: measured {measured}; profiled {profiled.per_metric} rms_log {profiled.rms_log:.3f}; "
          f"defaults {defaults.per_metric} rms_log {defaults.rms_log:.3f}")
    assert profiled.rms_log < defaults.rms_log, (profiled, defaults, measured)
