"""``--wall-time`` ends a run by the time it names: no trial starts that this run's median trial would not finish
in time, and a trial still measuring at the limit stops before its next level — its levels kept, the trial
marked interrupted, teardown run — while the tuner ends as at a budget (no exception, the reason said).

Stand-in, labelled: the model's levels, each made to take ``LEVEL_S`` of wall time as a real level would
(a real stop's path is tests/test_stop_real.py; the limit is the same ``KeyboardInterrupt`` path, raised between
levels).
"""

from __future__ import annotations

import time
from pathlib import Path

import db
from advisor import tune as tune_mod
from advisor.job import TuningJob, job_from_dict
from db import queries
from executors.base import Deployment
from executors.measuring.loop import MeasurePlan, search_levels
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import Measurement, TrialState, Workload

LEVEL_S = 1.0


class TimedLevels(SimulatedExecutor):
    """The model's levels, one by one, each taking ``level_s`` seconds."""

    torn_down = 0
    level_s = LEVEL_S

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        model = super().measure

        def probe(load: float) -> Measurement:
            time.sleep(self.level_s)
            one = workload.model_copy(update={"knee_search": False, "load_levels": [int(load)]})
            return model(deployment, one, plan)[0].model_copy(update={"source": "measured"})

        return search_levels(probe, workload, plan or MeasurePlan())

    def teardown(self, deployment: Deployment) -> None:
        self.torn_down += 1


def _job(levels: list[int], wall_s: float) -> TuningJob:
    return job_from_dict({"name": "wall", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 3},
                          "budget": {"trials": 3, "wall_time_s": wall_s},
                          "workload": {"knee_search": False, "load_levels": levels}})


def _trials(url: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, "wall", t.number) for t in queries.list_trials(database, "wall")]
    finally:
        database.close()


def test_a_trial_still_measuring_at_the_limit_stops_before_its_next_level(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wall.db'}"
    job = _job([8, 16, 32, 64, 128], wall_s=2.5)  # five levels of 1 s: the limit lands inside the third
    ex = TimedLevels(job.model_profile(), default_params(job.cluster.gpu))
    t0 = time.monotonic()
    summary = tune_mod.tune(job, storage=url, executor=ex)  # no exception: the run ends as at a budget
    assert time.monotonic() - t0 < 2.5 + LEVEL_S + 2.0  # ended within one level of the limit (generous for CI)
    assert ex.torn_down == 1
    (t,) = _trials(url)
    assert t.state is TrialState.INTERRUPTED and t.objectives is None
    kept = [m.concurrency for m in t.measurements]
    assert kept and kept == [8, 16, 32][: len(kept)]
    nxt = [8, 16, 32, 64, 128][len(kept)]
    assert t.reason == (f"interrupted (wall time of 2.5 s reached; stopped before the level at {nxt}); "
                        f"{len(kept)} level(s) measured before it kept")
    assert summary.stopped_because == (
        f"wall time of 2.5 s reached: trial 0 stopped before the level at {nxt} ({len(kept)} measured level(s) "
        "kept, the trial marked interrupted); run the same command again to continue")


def test_no_trial_starts_that_the_runs_median_trial_would_not_finish(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wall.db'}"
    # A trial takes 6 s (two levels of 3 s). The wall time counts from the command's start, so the run's own
    # start (database, migrations, the study: 0.4 s on an idle machine) comes off it too. 11 s lets the first
    # trial finish after up to 5 s of that start -- a loaded 2-core CI machine once took over 3 s, where a 3-s
    # limit with 1-s levels left 1 s -- and leaves less than one trial's 6 s after it, whatever the start took.
    job = _job([8, 16], wall_s=11.0)
    ex = TimedLevels(job.model_profile(), default_params(job.cluster.gpu))
    ex.level_s = 3.0
    summary = tune_mod.tune(job, storage=url, executor=ex)
    (t,) = _trials(url)
    assert t.state is TrialState.COMPLETE and [m.concurrency for m in t.measurements] == [8, 16]
    assert summary.stopped_because.startswith("wall time of 11 s: ")
    assert summary.stopped_because.endswith("s left, less than this run's median trial (6 s): no further trial "
                                            "started")


def test_without_a_wall_time_the_budget_ends_the_run(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wall.db'}"
    job = job_from_dict({"name": "wall", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 3},
                         "budget": {"trials": 2}, "workload": {"knee_search": False, "load_levels": [8]}})
    ex = TimedLevels(job.model_profile(), default_params(job.cluster.gpu))
    summary = tune_mod.tune(job, storage=url, executor=ex)
    assert [t.state for t in _trials(url)] == [TrialState.COMPLETE] * 2
    assert summary.stopped_because == "budget reached"
