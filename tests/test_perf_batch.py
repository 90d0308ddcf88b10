"""Many deployments predicted at once (``executors.perf.levels.Batch``, the lockstep knee search
``executors.measuring.loop.search_many``) against each deployment predicted alone (a batch of one, ``search_levels``):
the guide ranks thousands together, a trial is predicted alone, and the answer must not depend on the company a
deployment keeps — the batch mixes modes, pads each decode step grid to the longest, shares role constants and
bisects every level in lockstep.

Same means the same floats: every field of every level (the ``raw`` breakdown included) of a seeded sample of
each preset's valid candidates, under the default parameters and under seeded perturbed ones (other values, other
sides of the model's min/max branches), and the same levels in the same order with the same flags.
"""

from __future__ import annotations

import functools
import random

import pytest

from advisor.proposers.model_rank import predicted_outcome, predicted_outcomes
from advisor.job import job_from_dict
from benchmarks.truths import perturbed
from executors import place
from executors.measuring.loop import MeasurePlan, search_levels, search_many
from executors.perf import Batch, default_params
from executors.simulated.executor import model_levels, model_levels_many
from search_spaces import SLO, Measurement, Workload, check, slo_violation

PRESETS = ["h200-dsv3", "h200-qwen3-235b", "gb300-rack-dsv3", "cpu-tiny-moe"]


@functools.cache
def _every_valid(preset: str, objective: str = "max_under_slo") -> tuple:
    job = job_from_dict({"name": "t", "preset": preset, "objective": {"mode": objective}})
    model, wl = job.model_profile(), job.workload
    return job, tuple(c for _, c in job.space.enumerate() if not check(c, model, job.cluster, wl.max_model_len))


def _valid(preset: str, limit: int | None, seed: int = 0, objective: str = "max_under_slo"):
    job, every = _every_valid(preset, objective)
    cfgs = list(every)
    if limit is not None and len(cfgs) > limit:
        cfgs = random.Random(seed).sample(cfgs, limit)
    return job, cfgs


def _dumps(levels: list[Measurement]) -> list[dict]:
    return [m.model_dump() for m in levels]


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("truth", [None, 3])
def test_many_candidates_at_once_get_each_candidates_levels_alone(preset: str, truth: int | None) -> None:
    job, cfgs = _valid(preset, 400 if truth is None else 150)
    params = default_params(job.cluster.gpu) if truth is None else perturbed(default_params(job.cluster.gpu), truth)
    tops = [place(c, job.cluster) for c in cfgs]
    plan = MeasurePlan(tuple(job.slos))
    model, wl = job.model_profile(), job.workload
    batch = model_levels_many(tops, model, wl, plan, params, tolerance=0.15, max_levels=10)
    assert len(batch) == len(cfgs) > 0
    modes = set()
    for t, got in zip(tops, batch, strict=True):
        want = model_levels(t, model, wl, plan, params, tolerance=0.15, max_levels=10)
        assert _dumps(got) == _dumps(want), t.config.key()
        modes.add(t.config.mode)
    if preset != "cpu-tiny-moe":
        assert len(modes) == 2  # both halves of the batch model were compared


@pytest.mark.parametrize(("preset", "objective"), [("h200-qwen3-235b", "pareto"), ("h200-dsv3", "max_under_slo"),
                                                   ("gb300-rack-dsv3", "max_under_slo")])
def test_the_guides_batch_outcomes_are_its_one_by_one_outcomes(preset: str, objective: str) -> None:
    """The ranking scores lazy levels (built as Measurements only for each candidate's operating point) and judges
    the searches' levels from the batch's columns: the same outcomes, operating point and all."""
    job, cfgs = _valid(preset, 300, seed=1, objective=objective)
    params = perturbed(default_params(job.cluster.gpu), 5)
    got = predicted_outcomes(job, cfgs, params)
    assert any(o.feasible for o in got)
    bare = predicted_outcomes(job, cfgs, params, points=False)  # the guide's: no operating point built
    assert [(o.values, o.violation) for o in bare] == [(o.values, o.violation) for o in got]
    assert all(o.best is None for o in bare)
    for c, o in zip(cfgs, got, strict=True):
        want = predicted_outcome(job, c, params)
        assert (o.values, o.violation) == (want.values, want.violation)
        assert isinstance(o.best, Measurement) and want.best is not None
        assert o.best.model_dump() == want.best.model_dump()


def test_lazy_levels_are_the_levels_and_their_violations_slo_violations() -> None:
    """A lazy level reads each field as its Measurement holds it, is built into that Measurement (purpose and flags
    set through ``model_copy``), and the table's violations are ``slo_violation``'s, missing values included."""
    job, cfgs = _valid("h200-qwen3-235b", 200, seed=4)
    params = perturbed(default_params(job.cluster.gpu), 2)
    batch = Batch([place(c, job.cluster) for c in cfgs], job.model_profile(), job.workload, params)
    asked = [(i, float(c)) for i in range(len(cfgs)) for c in (1, 64, 512, 4096)]
    eager, lazy = batch.predict(asked), batch.predict(asked, lazy=True)
    slos = (*job.slos, SLO(metric="p99_e2el_ms", op="<=", value=30_000.0),
            SLO(metric="p90_tokens_per_s_per_user", op=">=", value=0.0), SLO(metric="error_rate", op="<=", value=0.0))
    met = [slo_violation(slos, m) <= 0 for m in eager]
    assert any(met) and not all(met)
    for m, lv, ok in zip(eager, lazy, met, strict=True):
        assert (lv.load, lv.purpose, lv.p90_ttft_ms, lv.eplb_balancedness) == \
            (m.load, m.purpose, m.p90_ttft_ms, m.eplb_balancedness)
        assert lv.built().model_dump() == m.model_dump()
        assert lv.meets(slos) is ok
        flagged = lv.model_copy(update={"purpose": "knee"}).model_copy(update={"flags": ["bracket-open"]})
        assert flagged.built().model_dump() == m.model_copy(
            update={"purpose": "knee", "flags": ["bracket-open"]}).model_dump()
    # a missing value (NaN in the columns, None in the Measurement) violates by 1, as slo_violation says
    table = batch.predict(asked[:2], lazy=True)[0].table  # a fresh table: nothing read of it yet
    table.columns["p50_ttft_ms"][0] = float("nan")
    slo = (SLO(metric="p50_ttft_ms", op="<=", value=1e9),)
    assert table.violations(slo)[0] == 1.0 == slo_violation(slo, table.built(0, "fixed", ()))
    assert table.violations(slo)[1] == slo_violation(slo, table.built(1, "fixed", ())) < 0


def _noisy_probe(seed: int, i: int):
    """A deployment whose SLO metric is load-driven but not monotone (noise can send a search back), as real
    levels are: the lockstep search must take every branch the one-by-one search takes."""
    knee = random.Random(f"{seed}-{i}").choice([0.5, 3, 17, 60, 250, 1000, 5000])

    def probe(load: float) -> Measurement:
        jitter = random.Random(f"{seed}-{i}-{load}").uniform(0.7, 1.3)
        ok_ms = 1000.0 * jitter * load / knee
        return Measurement(concurrency=max(1, int(load)), source="simulated", gpus=8, num_requests=50, completed=50,
                           p90_ttft_ms=ok_ms, throughput_per_gpu=float(load), error_rate=0.0)
    return probe


@pytest.mark.parametrize("load_by", ["concurrency", "rate"])
@pytest.mark.parametrize("start", [None, 40.0])
def test_the_lockstep_search_is_the_one_by_one_search(load_by: str, start: float | None) -> None:
    slos = (SLO(metric="p90_ttft_ms", op="<=", value=1000.0),)
    wl = Workload(load_levels=[8, 64, 512], load_by=load_by, max_levels=7, knee_tolerance=0.1, max_load=2048)
    plan = MeasurePlan(slos, start)
    probes = [_noisy_probe(7, i) for i in range(120)]
    known = [[probes[i](float(c)).model_copy(update={"purpose": "fixed"}) for c in (8, 64)] if i % 3 else []
             for i in range(len(probes))]
    asked_rounds: list[int] = []

    def together(asked: list[tuple[int, float]]) -> list[Measurement]:
        asked_rounds.append(len(asked))
        assert len({i for i, _ in asked}) == len(asked)  # one load per search per round
        return [probes[i](load) for i, load in asked]

    many = search_many(together, wl, plan, known)
    for i, probe in enumerate(probes):
        one = search_levels(probe, wl, plan, known=known[i] or None)
        assert [(m.load, m.purpose, m.flags) for m in many[i]] == [(m.load, m.purpose, m.flags) for m in one]
    flags = {f for levels in many for m in levels for f in m.flags}
    assert len(flags) >= 2  # the searches ended in different ways
    assert max(asked_rounds) > 1 and len(asked_rounds) < sum(len(x) for x in many)  # they ran together
