"""A trial is placed once: the placement the model predicts on is the one stored with the trial, deployed, and
rendered by every export — the stored one, not what today's ``place`` would give (which may differ after a
change to packing). A trial without one (an older database) is placed at export, and the export says so."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import db
from advisor import api, tune as tune_module
from advisor.errors import BadInput
from advisor.exports import PLACED_NOW
from advisor.job import job_from_dict
from advisor.tune import tune
from db import queries
from executors import Topology, place
from executors.simulated.executor import SimulatedExecutor, default_params

STUDY = "topo"


def _job() -> Any:
    return job_from_dict({"name": STUDY, "preset": "gb300-rack-dsv3", "sampler": {"seed": 7},
                          "budget": {"trials": 6}})


class RecordingSimulator(SimulatedExecutor):
    """The real simulator, keeping the placement of every deployment it was asked for."""

    def __init__(self, job: Any) -> None:
        super().__init__(job.model_profile(), default_params(job.cluster.gpu))
        self.deployed: list[dict] = []

    def deploy(self, topology: Topology) -> Any:
        self.deployed.append(topology.to_dict())
        return super().deploy(topology)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small simulated study, tuned once; each test edits a copy."""
    path = tmp_path_factory.mktemp("topo") / "s.db"
    tune(_job(), storage=f"sqlite:///{path}")
    return path


@pytest.fixture
def url(tuned: Path, tmp_path: Path) -> str:
    path = tmp_path / "s.db"
    src, dst = sqlite3.connect(tuned), sqlite3.connect(path)
    try:
        src.backup(dst)  # the write-ahead log's pages too
    finally:
        src.close()
        dst.close()
    return f"sqlite:///{path}"


def _answer_trial(url: str) -> Any:
    ans = api.answer(url, STUDY)
    assert ans is not None
    database = db.connect(url)
    try:
        t = queries.get_trial(database, STUDY, ans.trial)
    finally:
        database.close()
    assert t is not None and t.config is not None and t.topology
    return t


def _store_topology(url: str, trial_id: int, doc: dict | None) -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as con:
        con.execute("UPDATE advisor_trials SET topology = ? WHERE id = ?",
                    (None if doc is None else json.dumps(doc), trial_id))


def test_a_trial_is_placed_once_and_deployed_as_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def counted(cfg: Any, cluster: Any) -> Topology:
        calls.append(cfg.key())
        return place(cfg, cluster)

    monkeypatch.setattr(tune_module, "place", counted)
    job = _job()
    ex = RecordingSimulator(job)
    url = f"sqlite:///{tmp_path / 's.db'}"
    tune(job, storage=url, executor=ex)
    database = db.connect(url)
    try:
        stored = [t.topology for t in queries.list_trials(database, STUDY) if t.topology]
    finally:
        database.close()
    assert ex.deployed and stored == ex.deployed  # what each trial stored is what it deployed
    assert len(calls) == len(ex.deployed)  # one placement per trial: predicted on, stored, deployed


def test_an_export_renders_the_stored_topology_not_todays_placement(url: str) -> None:
    t = _answer_trial(url)
    nodes = t.topology["cluster"]["nodes"]
    moved = json.loads(json.dumps(t.topology))
    for inst in moved["instances"]:  # another valid placement: the nodes in reverse order
        for s in inst["shards"]:
            s["node"] = nodes - 1 - s["node"]
    assert moved != place(t.config, _job().cluster).to_dict()
    _store_topology(url, t.id, moved)
    doc = json.loads(api.rendered_export(url, STUDY, fmt="json", trial=t.number))
    assert doc["topology"] == moved
    want = {(i["name"], s["node"]) for i in moved["instances"] for s in i["shards"]}
    assert {(c["instance"], c["node"]) for c in doc["commands"]} == want
    assert "topology" not in doc["evidence"]  # stored: nothing to warn of
    script = api.rendered_export(url, STUDY, fmt="vllm", trial=t.number)
    assert PLACED_NOW not in script


def test_a_trial_without_a_stored_topology_is_placed_at_export_and_says_so(url: str) -> None:
    t = _answer_trial(url)
    _store_topology(url, t.id, None)
    doc = json.loads(api.rendered_export(url, STUDY, fmt="json", trial=t.number))
    assert doc["topology"] == place(t.config, _job().cluster).to_dict()
    assert doc["evidence"]["topology"] == PLACED_NOW
    assert f"topology: {PLACED_NOW}" in api.rendered_export(url, STUDY, fmt="vllm", trial=t.number)


def test_a_stored_topology_of_another_configuration_is_refused_in_one_line(url: str) -> None:
    t = _answer_trial(url)
    broken = {**t.topology, "instances": t.topology["instances"][1:]}  # an instance short
    _store_topology(url, t.id, broken)
    with pytest.raises(BadInput, match=rf"^--trial: trial {t.number}'s stored topology is not a placement of "
                                       r"this configuration: [^\n]*$"):
        api.rendered_export(url, STUDY, fmt="json", trial=t.number)
