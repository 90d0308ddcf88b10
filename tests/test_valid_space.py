"""The search sees the valid space: counted role by role, steered onto, exhausted with a line (issue 15).

Simulated executor throughout (the search's behaviour, not a deployment's, is under test).
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from advisor.cli import app
from advisor.proposers.guide import DECLINED_ATTR, PROPOSER_ATTR
from advisor.proposers.shape_sample import params_shape
from advisor.job import job_from_dict
from advisor.space_report import space_report
from advisor.study import open_study
from advisor.tune import EXECUTED_ATTR, tune
from advisor.proposers.valid_sampler import ValidSpaceSampler
from advisor.proposers.progress import STALE_PROPOSALS
from search_spaces import check, preset_names
from search_spaces import valid_space as valid_space_mod
from search_spaces.valid_space import params_key

KIMI = Path(__file__).parent / "data" / "kimi-k2-fp8"


def _kimi(trials: int, **over) -> dict:
    """Kimi-K2 (FP8) on 4 × 8 H200, a space a user might write: under 1% of its candidates are valid."""
    role = {"instances": [1, 2, 3, 4], "dp_sizes": [8, 16, 32], "max_num_seqs": [64, 128, 256],
            "max_num_batched_tokens": [4096, 8192, 16384]}
    return {"name": "kimi", "model": {"path": str(KIMI), "weight_bytes": 1.0},
            "cluster": {"gpu": "H200", "nodes": 4, "gpus_per_node": 8},
            "workload": {"isl": {"mean": 2048, "range_ratio": 0.8}, "osl": {"mean": 512, "range_ratio": 0.8},
                         "load_levels": [64, 256]},
            "slos": [{"metric": "p90_tokens_per_s_per_user", "op": ">=", "value": 20}],
            "space": {"modes": ["aggregated", "disaggregated"], "mixed": role, "prefill": {**role, "max_num_seqs": [128]},
                      "decode": {**role, "max_num_batched_tokens": [8192]},
                      "eplb": {"enabled": [False, True], "num_redundant_experts": [0, 32]}},
            "budget": {"trials": trials}, **over}


@pytest.mark.parametrize("preset", ["cpu-tiny-moe", "h200-dsv3", "h200-qwen3-235b"])
def test_role_by_role_count_equals_checking_every_candidate(preset: str) -> None:
    job = job_from_dict({"name": "v", "preset": preset})
    model, wl = job.model_profile(), job.workload
    valid, broken, n = set(), Counter(), 0
    for params, cfg in job.space.enumerate():
        n += 1
        violations = check(cfg, model, job.cluster, wl.max_model_len)
        broken.update({v.rule for v in violations})
        if not violations:
            valid.add(params_key(params))
    vs = job.valid_space()
    assert vs is not None and vs.candidates == n and vs.valid == len(valid)
    assert {params_key(p) for p in vs.iter_valid()} == valid
    assert dict(vs.broken) == dict(broken)
    # the candidates assembled from the role rows are the ones ``build`` makes of the same parameters, in order;
    # shapes read per role row and parameters picked by index agree with the full listing
    every = list(vs.iter_valid())
    built = {params_key(p): c for p, c in job.space.enumerate()}
    assembled = list(vs.iter_valid_configs())
    assert [p for p, _ in assembled] == every
    assert all(c == built[params_key(p)] and c.key() == built[params_key(p)].key() for p, c in assembled)
    assert vs.valid_shapes(params_shape) == [params_shape(p) for p in every]
    picks = sorted(random.Random(1).sample(range(len(every)), min(50, len(every))))
    assert vs.valid_at(picks) == [every[i] for i in picks]


def test_prefix_counts_taken_candidates_and_uniform_sampling() -> None:
    job = job_from_dict({"name": "v", "preset": "h200-dsv3"})
    vs = job.valid_space()
    assert vs is not None
    every = list(vs.iter_valid())
    agg = [p for p in every if p["mode"] == "aggregated"]
    assert vs.count({"mode": "aggregated"}) == len(agg)
    some = {"mode": "disaggregated", "prefill_instances": 2, "decode_dp": 16}
    expect = [p for p in every if all(p.get(k) == v for k, v in some.items())]
    assert vs.count(some) == len(expect) > 0
    taken = {params_key(p) for p in expect[:5]}
    assert vs.count(some, taken) == len(expect) - 5
    rng = random.Random(0)
    draws = [vs.sample(rng, taken) for _ in range(50)]
    assert all(d is not None and params_key(d) in {params_key(p) for p in every} and params_key(d) not in taken
               for d in draws)
    # nothing left under a prefix once every candidate under it is taken
    assert not vs.feasible(some, {params_key(p) for p in expect})
    assert vs.feasible({"mode": "disaggregated"}, {params_key(p) for p in expect})


def test_sparse_space_runs_its_budget_without_an_invalid_or_repeated_trial(tmp_path: Path) -> None:
    """0.9% of the candidates are valid: every trial asked is a new valid candidate (the sampler is steered)."""
    job = job_from_dict(_kimi(40))
    rep = space_report(job)
    assert rep.valid / rep.candidates < 0.02
    url = f"sqlite:///{tmp_path / 'k.db'}"
    summary = tune(job, storage=url)
    study = open_study(job, url, "kimi")
    trials = study.get_trials(deepcopy=False)
    assert summary.executed == 40 and summary.invalid == 0 and summary.repeats == 0
    assert len(trials) == 40  # Optuna trials asked = executed (the goal is ≤ 2×)
    assert len({params_key(t.params) for t in trials}) == 40
    assert isinstance(study.sampler, ValidSpaceSampler)
    assert summary.stopped_because == "budget reached"


def test_budget_beyond_the_valid_space_ends_with_the_exhausted_line(tmp_path: Path) -> None:
    doc = _kimi(300)
    doc["space"] = {**doc["space"], "modes": ["aggregated"],
                    "mixed": {"instances": [1, 2, 3, 4], "dp_sizes": [8, 16, 32], "max_num_seqs": [64, 128]}}
    job = job_from_dict(doc)
    valid = space_report(job).valid
    assert 0 < valid < 300
    url = f"sqlite:///{tmp_path / 'e.db'}"
    summary = tune(job, storage=url)
    assert summary.executed == valid and summary.exhausted
    assert summary.stopped_because.startswith(f"space exhausted: each of its {valid} valid candidates is measured")
    again = tune(job, storage=url)  # a resumed study does not spin: it says so at once
    assert again.executed == 0 and again.exhausted
    assert len(open_study(job, url, "kimi").get_trials(deepcopy=False)) == valid


def test_validate_and_tune_warn_about_a_mostly_invalid_space(tmp_path: Path) -> None:
    import yaml

    path = tmp_path / "kimi.yaml"
    doc = _kimi(5000, storage=f"sqlite:///{tmp_path / 'w.db'}")
    path.write_text(yaml.safe_dump(doc))
    rep = space_report(job_from_dict(doc))
    share = rep.valid / rep.candidates
    assert share < 0.05
    top = max(rep.broken, key=lambda r: rep.broken[r])
    for args in (["validate", str(path)], ["tune", str(path), "--trials", "1"]):
        out = CliRunner().invoke(app, args)
        assert out.exit_code == 0, out.output
        assert f"{rep.valid:,} valid" in out.output
        warn = [line for line in out.output.splitlines() if line.startswith("warning:")]
        assert f"({share:.1%}) are valid; the rules removing the most: {rep.broken[top]:,} × {top}" in warn[0]
        assert ("fewer than the budget of 5,000 trials" in "".join(warn)) is (args[0] == "validate"), warn


def test_a_space_too_large_to_enumerate_still_progresses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the enumerated space (a role with more choices than ``ROLE_LIMIT``), random proposals repeat on
    a 4-candidate space; after ``STALE_PROPOSALS`` repeats in a row the tuner proposes an unmeasured one."""
    monkeypatch.setattr(valid_space_mod, "ROLE_LIMIT", 1)
    job = job_from_dict({"name": "r", "preset": "cpu-tiny-moe", "sampler": {"kind": "random", "seed": 3},
                         "budget": {"trials": 4}})
    assert job.valid_space() is None
    url = f"sqlite:///{tmp_path / 'r.db'}"
    summary = tune(job, storage=url)
    assert summary.executed == 4 and summary.stopped_because == "budget reached"
    trials = open_study(job, url, "r").get_trials(deepcopy=False)
    assert len(trials) < 4 + 4 * STALE_PROPOSALS  # never more than a streak of repeats per new one
    # repeats told at most once each with values; later ones FAIL (the sampler does not learn them again)
    repeat_told = Counter(params_key(t.params) for t in trials
                          if t.state is optuna.trial.TrialState.COMPLETE and not t.user_attrs.get(EXECUTED_ATTR))
    assert all(n == 1 for n in repeat_told.values())
    more = tune(job, storage=url, trials=6)  # all 4 measured: the random draws find nothing, the study ends
    assert more.executed == 0 and more.exhausted


@pytest.mark.parametrize("preset", preset_names())
def test_a_job_without_a_space_gets_one_that_fits(preset: str, tmp_path: Path) -> None:
    """Every preset's model on its cluster, without ``space:``: the derived space validates with valid
    candidates and a study on it finishes."""
    import yaml

    from search_spaces import load_preset

    doc = {k: v for k, v in load_preset(preset).items() if k in ("model", "cluster", "workload", "slos")}
    job = job_from_dict({"name": "d", **doc, "budget": {"trials": 4}})
    rep = space_report(job)
    assert rep.valid > 0
    assert job.space.mixed.dp_sizes  # derived, and stored with the job (a resumed study searches the same)
    assert job.to_document()["space"] == job.space.model_dump(mode="json")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"name": "d", **doc}))
    shown = CliRunner().invoke(app, ["validate", str(path), "--show"])
    assert shown.exit_code == 0 and "# space: each dimension's choices" in shown.output
    summary = tune(job, storage=f"sqlite:///{tmp_path / 'd.db'}")
    assert summary.executed == 4 and summary.stopped_because == "budget reached"


def test_model_turns_are_counted_per_study_across_workers(tmp_path: Path) -> None:
    """Worker B joins the study while worker A runs; A must see B's model turns (guided_trials is the study's)."""
    job = job_from_dict({"name": "w", "preset": "h200-dsv3", "budget": {"trials": 14},
                         "sampler": {"seed": 1, "guided_trials": 4}})
    url = f"sqlite:///{tmp_path / 'w.db'}"
    joined = []

    def worker_a(report) -> None:
        if report.executed and not joined:
            joined.append(True)
            tune(job, storage=url, trials=8)  # worker B, in the middle of A's study

    tune(job, storage=url, on_trial=worker_a)
    trials = open_study(job, url, "w").get_trials(deepcopy=False)
    turns = sum(1 for t in trials if t.user_attrs.get(PROPOSER_ATTR) == "model" or t.user_attrs.get(DECLINED_ATTR))
    assert sum(1 for t in trials if t.user_attrs.get(EXECUTED_ATTR)) == 14
    assert 2 <= turns <= 4
