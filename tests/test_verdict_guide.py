"""The verdict's model line and its "found by" line say where the model guide stood: a guide that yielded to the
search around the measured best (its prediction of vLLM's defaults missed by more than it is held to) is not said
to "go on", a guide that re-entered is judged from where it re-entered, and the dashboard's answer says who found
it in the words ``advisor best`` prints.

Studies are built from real database rows as the tuner writes them (``tests.test_answer``'s Ray-executor job):
vLLM's defaults first (proposer "baseline"), then the search, each trial's prediction stored before it ran.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import db
from advisor import api
from advisor.baseline import baseline_config
from advisor.cli import app
from advisor.objectives import score
from advisor.proposers.names import AROUND_BEST, MODEL_DECLINED, found_by
from executors import place
from search_spaces import TrialState
from tests.test_answer import X, _job, _levels, _search_config
from tests.test_ui_apptest import _run
from ui import common

YIELDED = "yielded"
REENTERED = "reentered"
#: (proposer, predicted tok/s/GPU, knee tok/s/GPU): the model predicted the defaults at 2× what they made.
YIELDED_TRIALS = [("baseline", 30_000.0, 15_000.0), (AROUND_BEST, 16_000.0, 16_500.0),
                  (AROUND_BEST, 17_000.0, 17_500.0)]
#: The same, then the model re-enters (its last two held-out predictions within 30%) and picks trial 3.
REENTERED_TRIALS = [*YIELDED_TRIALS, ("model", 18_000.0, 18_500.0)]
DECLINED = "declined"
#: The same, but the re-entered model's turn found nothing better: the sampler's trial holds its turn.
DECLINED_TRIALS = [*YIELDED_TRIALS, (MODEL_DECLINED, 18_000.0, 18_500.0)]


def _study(url: str, name: str, trials: list[tuple[str, float, float]]) -> None:
    job = _job(name)
    database = db.connect(url)
    try:
        database.upsert_study(name, job.to_document(), executor="ray", hardware=job.cluster.describe())
        for number, (proposer, predicted, knee) in enumerate(trials):
            cfg = baseline_config(job) if proposer == "baseline" else _search_config(job)
            assert cfg is not None
            ms = _levels(cfg.total_gpus, [(32, knee, 35.0, "knee"), (48, knee * 1.1, 20.0, "search")])
            outcome = score(job, ms)
            tid = database.start_trial(name, number, params={}, config=cfg,
                                       topology=place(cfg, job.cluster).to_dict(), proposer=proposer,
                                       predicted={X: predicted}, baseline=proposer == "baseline")
            database.finish_trial(tid, TrialState.COMPLETE, measurements=ms, objectives=outcome.as_dict(job),
                                  violation=outcome.violation, executed=True)
    finally:
        database.close()


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    u = f"sqlite:///{tmp_path_factory.mktemp('guide') / 'advisor.db'}"
    _study(u, YIELDED, YIELDED_TRIALS)
    _study(u, REENTERED, REENTERED_TRIALS)
    _study(u, DECLINED, DECLINED_TRIALS)
    return u


def _best(url: str, study: str) -> str:
    res = CliRunner().invoke(app, ["best", study, "--storage", url], env={"COLUMNS": "400"})
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())  # the console folds long lines at spaces


def test_a_yielded_guide_is_said_to_have_yielded_not_to_go_on(url: str) -> None:
    said = api.verdict_of(url, YIELDED)
    assert "go on" not in said.model, said.model
    assert "model turns yielded to the search around the measured best: the model missed vLLM's defaults by " \
           "100%, more than it is held to, and has not re-entered" in said.model
    assert said.found == found_by(AROUND_BEST)  # trial 2 is the answer, the search around the best's
    out = _best(url, YIELDED)
    assert said.model in out and out.count("found by:") == 1 and said.found in out


def test_a_re_entered_guide_is_judged_from_where_it_re_entered(url: str) -> None:
    """The baseline's 100% miss is not in the window any more: the model's turns go on, and the line says why."""
    said = api.verdict_of(url, REENTERED)
    assert "(model turns go on (the model re-entered after the search around the measured best; judged from " \
           "trial 1); the limit is 30%)" in said.model, said.model
    assert said.model.startswith("performance model: 3% mean error on the last 3 trial(s)"), said.model
    assert said.found == found_by("model")
    declined = api.verdict_of(url, DECLINED)  # a declined turn is the model's turn too: it has re-entered
    assert "(model turns go on (the model re-entered" in declined.model, declined.model
    assert declined.found == found_by(MODEL_DECLINED)


def test_the_dashboard_s_answer_says_who_found_it_as_advisor_best_does(url: str, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADVISOR_STORAGE", url)
    monkeypatch.setenv("ADVISOR_UI_RUN_DIR", str(tmp_path / "runs"))
    at = _run("views/study.py", study=YIELDED)
    found = [ln for m in at.markdown for ln in str(m.value).splitlines() if "found by:" in ln]
    assert found == [f"- {common.plain(found_by(AROUND_BEST))}"], found
    said = api.verdict_of(url, YIELDED)
    assert common.plain(said.model) in [c.value for c in at.caption]
