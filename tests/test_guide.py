"""Model-guided proposals (advisor.proposers.guide) in the real tune loop, on the simulated executor.

The ground truth of these tests is the performance model with *different* parameters from the ones the guide
starts from (``benchmarks.truths.perturbed``): the guide must find the truth's optimum by measuring
and re-fitting, not by already knowing it. Labelled: a simulated stand-in for a machine the model does not know.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import db
from advisor.calibrate import SERVED_METRICS
from advisor.proposers.guide import PROPOSER_ATTR, ModelGuide
from advisor.proposers.model_rank import exhaustive
from advisor.job import job_from_dict
from advisor.study import open_study
from advisor.tune import CONFIG_KEY_ATTR, EXECUTED_ATTR, tune
from benchmarks.truths import perturbed
from db import queries
from executors import place
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import TrialState, check


def _job(name: str = "g", **over):
    doc = {"name": name, "preset": "h200-qwen3-235b", "sampler": {"seed": 2}, "budget": {"trials": 8}}
    doc.update(over)
    return job_from_dict(doc)


def _truth(job, seed: int = 0) -> SimulatedExecutor:
    return SimulatedExecutor(job.model_profile(), perturbed(default_params(job.cluster.gpu), seed, 2.0))


def _proposers(url: str, name: str, job) -> list[str]:
    study = open_study(job, url, name)
    done = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get(EXECUTED_ATTR)]
    return [t.user_attrs.get(PROPOSER_ATTR, "sampler") for t in sorted(done, key=lambda t: t.number)]


def test_guided_study_finds_an_unknown_machines_optimum(tmp_path: Path) -> None:
    """Under truth seed 0 the defaults' best candidate (by its knee) reaches only 0.72 of the truth's optimum:
    the guide must measure, re-fit and move to the truth's optimum within a 20-trial budget. (8 trials did it
    before the preset searched TP experts too: each TP shape near the prior's pick now has an EP and a
    TP-experts variant, and the model spends turns on them before the re-fit moves it to DEP4 prefill. 16 did it
    until the prefill slot's wait counted only the other requests' chunks (4 Dec): both the truth's and the
    prior's landscapes moved, and 16 trials then reached 0.962 of the optimum, 20 and 24 the optimum.)"""
    job = _job(budget={"trials": 20})
    truth = _truth(job, seed=0)
    truth_table = exhaustive(job, truth.params)
    opt = max(o.values[0] for o in truth_table.values() if o.feasible)
    prior = exhaustive(job, default_params("H200"))
    default_pick = max((k for k, o in prior.items() if o.feasible), key=lambda k: prior[k].values[0])
    assert truth_table[default_pick].feasible and truth_table[default_pick].values[0] < 0.9 * opt  # the uncalibrated model's best is far from the truth's
    url = f"sqlite:///{tmp_path / 'g.db'}"
    tune(job, storage=url, executor=truth)
    best = _best(url, "g")
    assert best >= 0.98 * opt


def test_model_turns_alternate_never_repeat_and_resume(tmp_path: Path) -> None:
    job = _job(budget={"trials": 9}, sampler={"seed": 2, "guided_trials": 4})
    url = f"sqlite:///{tmp_path / 'g.db'}"
    truth = _truth(job)
    tune(job, storage=url, executor=truth, trials=5)
    first = _proposers(url, "g", job)
    # one model pick per deployment mode, then the sampler; later model turns only on their alternate slots
    # (a turn the model declines — it predicts nothing better than what is measured — goes to the sampler)
    assert first[:3] == ["model", "model", "sampler"]
    assert all(p == "sampler" for i, p in enumerate(first) if i >= 2 and i % 2 == 0)
    database = db.connect(url)
    try:
        trials = [t for t in queries.list_trials(database, "g", states=[TrialState.COMPLETE])]
        assert {t.config.mode.value for t in trials[:2]} == {"aggregated", "disaggregated"}
        # every executed trial carries the model's prediction made before it ran
        assert all(t.predicted for t in trials if t.proposer == "model")
    finally:
        database.close()
    tune(job, storage=url, executor=truth)  # continue to 9: at most guided_trials 4 model turns in all
    every = _proposers(url, "g", job)
    assert len(every) == 9 and every[:5] == first
    assert 2 <= every.count("model") <= 4
    study = open_study(job, url, "g")
    keys = [t.user_attrs[CONFIG_KEY_ATTR] for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(PROPOSER_ATTR) == "model"]
    assert len(keys) == len(set(keys))  # the model never proposes what was measured
    database = db.connect(url)
    try:  # the results database says who proposed each trial, as `advisor trials` and the dashboard show it
        stored = {t.number: t.proposer for t in queries.list_trials(database, "g")}
    finally:
        database.close()
    assert {stored[t.number] for t in study.get_trials(deepcopy=False)
            if t.user_attrs.get(PROPOSER_ATTR) == "model"} == {"model"}
    assert sorted(v for v in stored.values() if v == "model") == ["model"] * every.count("model")
    assert set(stored.values()) == {"model", "sampler"}


def test_the_model_earns_its_turns() -> None:
    """Model turns yield while the model's out-of-sample error exceeds 30%, resume when it is good again, and a
    pick predicted no better than the best measured value is not made."""
    from advisor.proposers.guide import JUDGE_WINDOW, MAX_CV_ERROR

    job = _job()
    guide = ModelGuide(job, default_params("H200"))
    lead = len(job.space.modes)
    assert guide.wants_turn(lead + 1)
    for _ in range(JUDGE_WINDOW):  # predicted 2× what was measured, trial after trial
        guide.judge({"throughput_per_gpu": 2000.0}, {"throughput_per_gpu": 1000.0})
    assert guide.cv_error == 1.0 > MAX_CV_ERROR and not guide.wants_turn(lead + 1)
    for _ in range(JUDGE_WINDOW):  # re-fits that predict within 10%
        guide.judge({"throughput_per_gpu": 1100.0}, {"throughput_per_gpu": 1000.0})
    assert guide.cv_error is not None and guide.cv_error < MAX_CV_ERROR and guide.wants_turn(lead + 1)
    one_per_mode = {c.mode: c.key() for _, c in guide._candidates()}
    # a mode nobody has tried is always proposed, whatever was measured
    assert guide.propose(set(), best_measured=1e12) is not None
    taken = set(one_per_mode.values())  # both modes tried
    assert guide.propose(taken, best_measured=1e12) is None  # nothing it predicts beats the measured best
    assert guide.propose(taken, best_measured=1.0) is not None


def test_unguided_sampler_has_no_model_turns(tmp_path: Path) -> None:
    job = _job(sampler={"seed": 2, "guide": False}, budget={"trials": 4})
    url = f"sqlite:///{tmp_path / 'g.db'}"
    tune(job, storage=url, executor=_truth(job))
    assert _proposers(url, "g", job) == ["sampler"] * 4


def test_refit_moves_the_model_towards_the_measurements() -> None:
    job = _job()
    truth = _truth(job)
    guide = ModelGuide(job, default_params("H200"))
    model, wl = job.model_profile(), job.workload
    cfgs = [c for _, c in job.space.enumerate() if not check(c, model, job.cluster, wl.max_model_len)][::97][:6]

    def miss(params) -> float:
        errs = []
        for c in cfgs:
            topo = place(c, job.cluster)
            want = {m.concurrency: m for m in truth.evaluate(topo, job.workload).measurements}
            got = SimulatedExecutor(job.model_profile(), params).evaluate(topo, job.workload).measurements
            errs += [abs(math.log(getattr(g, k) / getattr(want[g.concurrency], k))) for g in got for k in SERVED_METRICS
                     if getattr(g, k) and getattr(want[g.concurrency], k)]
        return sorted(errs)[len(errs) // 2]

    before = miss(guide.params)
    for c in cfgs:
        guide.observe(c, truth.evaluate(place(c, job.cluster), job.workload).measurements)
    assert miss(guide.params) < 0.5 * before


def test_pareto_turns_spread_along_the_front(tmp_path: Path) -> None:
    """The model as the machine (no perturbation: the guide stays trusted, so every turn is taken); what is under
    test is where the turns go, not the re-fit."""
    job = _job(objective={"mode": "pareto"}, budget={"trials": 8}, sampler={"seed": 3, "guided_trials": 5})
    url = f"sqlite:///{tmp_path / 'g.db'}"
    tune(job, storage=url, executor=SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu)))
    study = open_study(job, url, "g")
    picks = [t.values for t in study.get_trials(deepcopy=False) if t.user_attrs.get(PROPOSER_ATTR) == "model"]
    assert len(picks) == 5
    # random Chebyshev weights: not all picks maximise the same objective
    assert len({round(v[0]) for v in picks}) >= 3 and len({round(v[1]) for v in picks}) >= 3


def _best(url: str, name: str) -> float:
    database = db.connect(url)
    try:
        return max(t.objectives["throughput_per_gpu"] for t in queries.list_trials(database, name,
                   states=[TrialState.COMPLETE]) if t.violation is not None and t.violation <= 0)
    finally:
        database.close()


def test_a_large_space_is_sampled_shape_by_shape() -> None:
    """Past ``EXHAUSTIVE_MAX`` valid candidates the guide ranks a seeded sample: every shape (mode, and per role
    instances × TP × DP × EP) is in it with its share, in the space's own order, the same for the same seed; and
    the hill-climbs start from distinct shapes."""
    from advisor.proposers.guide import EXHAUSTIVE_MAX, SAMPLE
    from advisor.proposers.shape_sample import PER_SHAPE_SAMPLE, best_of_each_shape, params_shape, shape_of
    from advisor.objectives import Outcome

    job = _job(preset="gb300-rack-dsv3")
    valid = job.valid_space()
    assert valid is not None and valid.valid > EXHAUSTIVE_MAX
    every: dict[tuple, int] = {}
    for p in valid.iter_valid():
        every[params_shape(p)] = every.get(params_shape(p), 0) + 1
    guide = ModelGuide(job, default_params(job.cluster.gpu))
    pool = guide._candidates()
    assert len(pool) == SAMPLE and len({c.key() for _, c in pool}) == SAMPLE
    assert all(not check(c, job.model_profile(), job.cluster, job.workload.max_model_len) for _, c in pool)
    per_shape: dict[tuple, int] = {}
    for _, c in pool:
        per_shape[shape_of(c)] = per_shape.get(shape_of(c), 0) + 1
    assert len(per_shape) == len(every) > 1  # every shape, however rare
    assert min(per_shape.values()) >= min(PER_SHAPE_SAMPLE, min(every.values()))
    order = {json.dumps(p, sort_keys=True): i for i, p in enumerate(valid.iter_valid())}
    idx = [order[json.dumps(p, sort_keys=True)] for p, _ in pool]
    assert idx == sorted(idx)  # the space's order: ties among equal predictions break as an exhaustive ranking's
    again = ModelGuide(job, default_params(job.cluster.gpu))._candidates()
    assert [c.key() for _, c in again] == [c.key() for _, c in pool]
    ranked = [(p, c, Outcome([float(i)], 0.0, None)) for i, (p, c) in enumerate(pool)]
    starts = best_of_each_shape(ranked)
    assert len(starts) == len(per_shape) and len({shape_of(c) for _, c, _ in starts}) == len(starts)
    assert starts[0] is ranked[0]


@pytest.mark.parametrize("steps", [1, 2, 50])
def test_lockstep_climbs_are_the_one_at_a_time_climbs(steps: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guide's hill-climbs run in lockstep with each step predicted in one batch; each ends where a climb on
    its own ends, trying one-knob neighbours in order, each predicted alone, and moving to the first that ranks
    higher (the reference below), from the same starts, with some candidates taken and one mode allowed. Cut
    short after one and two moves, every step of the path is compared, not only where it ends."""
    from advisor.proposers import guide as guide_mod
    from advisor.proposers.guide import CLIMB_STARTS
    from advisor.proposers.model_rank import predicted_outcome
    from advisor.proposers.shape_sample import best_of_each_shape

    monkeypatch.setattr(guide_mod, "CLIMB_STEPS", steps)
    job = _job(preset="gb300-rack-dsv3")
    guide = ModelGuide(job, default_params(job.cluster.gpu))
    scored = guide._scored(guide._candidates())
    rank = guide._ranker(1.0, [o for _, _, o in scored])
    starts = best_of_each_shape(sorted(scored, key=lambda t: rank(t[2]), reverse=True))[:CLIMB_STARTS]
    taken = {c.key() for _, c, _ in sorted(scored, key=lambda t: rank(t[2]), reverse=True)[CLIMB_STARTS:40]}

    def alone(p, c, o, modes):
        for _ in range(steps):
            for q in guide._neighbours(p):
                d = guide.config_of(q)
                if d.key() in taken or (modes and d.mode not in modes) or not guide._valid(d):
                    continue
                u = predicted_outcome(job, d, guide.params, guide.plan)
                if rank(u) > rank(o):
                    p, c, o = q, d, u
                    break
            else:
                return p, c, o
        return p, c, o

    for modes in (None, {starts[0][1].mode}):
        got = guide._climbs(starts, rank, taken, modes)
        want = [alone(p, c, o, modes) for p, c, o in starts]
        assert [(c.key(), o.values, o.violation) for _, c, o in got] == \
            [(c.key(), o.values, o.violation) for _, c, o in want]
        assert any(g[1].key() != s[1].key() for g, s in zip(got, starts, strict=True))  # some climb moved
