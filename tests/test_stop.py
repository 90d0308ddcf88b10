"""A trial stopped in the middle of its levels (Ctrl-C, SIGTERM as Ctrl-C) keeps what it measured: the levels
before the stop are stored with the trial marked interrupted, teardown ran, and calibration uses those levels.
Fast: the model measures each level; the real stop (SIGTERM to `advisor tune`'s group) is tests/test_stop_real.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from pydantic import BaseModel, model_serializer
from pydantic_core import PydanticSerializationError

import db
from advisor import tune as tune_mod
from advisor.calibrate import measured_samples
from advisor.cli import friendly
from advisor.job import TuningJob, job_from_dict
from db import queries
from executors.base import Deployment
from executors.measuring.loop import MeasurePlan, search_levels
from executors.processes.procs import interrupt_of
from executors.simulated.executor import SimulatedExecutor, default_params
from search_spaces import Measurement, TrialState, Workload

STOP_AT_LEVEL = 3


class StoppedAtThirdLevel(SimulatedExecutor):
    """The model's levels, one by one, with the stop landing while the third one runs."""

    torn_down = 0

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        model = super().measure
        count = [0]

        def probe(load: float) -> Measurement:
            count[0] += 1
            if count[0] == STOP_AT_LEVEL:
                raise KeyboardInterrupt("terminated (SIGTERM)")
            one = workload.model_copy(update={"knee_search": False, "load_levels": [int(load)]})
            return model(deployment, one, plan)[0].model_copy(update={"source": "measured"})

        return search_levels(probe, workload, plan or MeasurePlan())

    def teardown(self, deployment: Deployment) -> None:
        self.torn_down += 1


def _tune_until_stopped(tmp_path: Path, executor: type[StoppedAtThirdLevel],
                        match: str | None = None) -> tuple[TuningJob, str]:
    """A study on ``executor`` whose first trial is stopped at its third level: the stop ends ``tune`` and the
    deployment is torn down once. Returns the job and the storage URL."""
    url = f"sqlite:///{tmp_path / 'stop.db'}"
    job = job_from_dict({"name": "stop", "preset": "gb300-rack-dsv3", "sampler": {"kind": "random", "seed": 3},
                         "budget": {"trials": 3},
                         "workload": {"knee_search": False, "load_levels": [8, 16, 32, 64, 128]}})
    ex = executor(job.model_profile(), default_params(job.cluster.gpu))
    with pytest.raises(KeyboardInterrupt, match=match):
        tune_mod.tune(job, storage=url, executor=ex)
    assert ex.torn_down == 1
    return job, url


def test_a_stop_mid_levels_keeps_the_levels_measured(tmp_path: Path) -> None:
    job, url = _tune_until_stopped(tmp_path, StoppedAtThirdLevel)
    database = db.connect(url)
    try:
        trials = [queries.get_trial(database, "stop", t.number) for t in queries.list_trials(database, "stop")]
        assert [t.state for t in trials] == [TrialState.INTERRUPTED]
        t = trials[0]
        assert t.failure_kind == "interrupted" and t.objectives is None
        assert t.reason == "interrupted (terminated (SIGTERM)); 2 level(s) measured before it kept"
        assert [m.concurrency for m in t.measurements] == [8, 16]
        assert t.teardown_s is not None and t.measure_s is not None
        samples = measured_samples(database, "stop", job)
        assert [(s.number, sorted(s.measured)) for s in samples] == [(t.number, [8, 16])]
    finally:
        database.close()


class _StopInDump(BaseModel):
    """A model whose Python serializer is where the signal lands: pydantic hands the stop on wrapped in a
    ``PydanticSerializationError`` (as it did to a configuration's dump under SIGINT)."""

    x: int = 0

    @model_serializer
    def _dump(self) -> dict[str, int]:
        raise KeyboardInterrupt("terminated (SIGTERM)")


class StoppedInsideADump(StoppedAtThirdLevel):
    """The third level's stop lands inside a pydantic dump instead of the level's own code."""

    def measure(self, deployment: Deployment, workload: Workload,
                plan: MeasurePlan | None = None) -> list[Measurement]:
        model = SimulatedExecutor.measure
        count = [0]

        def probe(load: float) -> Measurement:
            count[0] += 1
            if count[0] == STOP_AT_LEVEL:
                _StopInDump().model_dump()
            one = workload.model_copy(update={"knee_search": False, "load_levels": [int(load)]})
            return model(self, deployment, one, plan)[0].model_copy(update={"source": "measured"})

        return search_levels(probe, workload, plan or MeasurePlan())


def test_a_stop_inside_a_pydantic_dump_is_still_a_stop(tmp_path: Path) -> None:
    with pytest.raises(PydanticSerializationError) as wrapped:
        _StopInDump().model_dump()
    assert interrupt_of(wrapped.value) is not None  # what pydantic does with it, and what finds it again
    # not one trial's error, and the study goes no further
    _, url = _tune_until_stopped(tmp_path, StoppedInsideADump, match="SIGTERM")
    database = db.connect(url)
    try:
        trials = [queries.get_trial(database, "stop", t.number) for t in queries.list_trials(database, "stop")]
        assert [t.state for t in trials] == [TrialState.INTERRUPTED]
        assert [m.concurrency for m in trials[0].measurements] == [8, 16]
    finally:
        database.close()


def test_the_cli_says_a_stop_inside_a_dump_as_a_stop() -> None:
    def tune() -> None:
        _StopInDump().model_dump()

    with pytest.raises(typer.Exit) as ended:
        friendly(tune)()
    assert ended.value.exit_code == 143
