"""The knee search as it is now, replayed on a real H200 study's measured levels (``research/knee_replay.py``): the
knee search's aim (``executors/measuring/knee_curve.py``) closes a bracket it missed no later than bisection would."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest

from research import knee_replay
from research.tests.gpu_records import raw_or_skip


@pytest.fixture(scope="module")
def r4_replayed(tmp_path_factory):
    """The real H200 study r4 (4 Dec, ``research/results/h200-study-30b-r4/raw.tar.xz``), its levels re-judged as
    the bench parser judges them now (first wave left out), its eight knee searches replayed with the search as it
    is now (``research/knee_replay.py``)."""
    out = tmp_path_factory.mktemp("r4")
    with tarfile.open(raw_or_skip(knee_replay.ROOT / "research/results/h200-study-30b-r4/raw.tar.xz")) as tar:
        tar.extractall(out, members=[m for m in tar.getmembers()
                                     if m.name == "da-gpu/results.db" or "/bench/c" in m.name], filter="data")
    return knee_replay.replay(str(knee_replay.ROOT / "research/gpu/h200-study-30b.yaml"),
                              str(Path(out) / "da-gpu/results.db"), "h200-study-30b-r4",
                              reparse=str(Path(out) / "da-runs"))


def test_a_bracket_the_aim_missed_closes_no_later_than_bisection(r4_replayed) -> None:
    """Issue 30's ≤ 4 full-length levels per knee, on the real levels: the trials whose replayed search met a failing
    level r4 really measured (1 and 5: the knee lies between measured levels, not in an extrapolation) close
    within four. Trial 1 took five before (70 failed, 42 met, then the aim's 51, 59, 64): inside a bracket that
    bisection closes in two, the aim's guess is held to the loads from which either verdict closes it in one
    (``_Search.no_worse_than_bisection``), so it goes 53, then 61."""
    by = {r["trial"]: r for r in r4_replayed}
    for n in (1, 5):
        assert by[n]["replay_levels"] <= 4, by[n]["replay"]
        assert by[n]["replay_to_bracket"] == 2
        assert by[n]["replay_knee"] is not None
    assert [c for c, _ in by[1]["replay"]] == [70, 42, 53, 61]
    assert max(r["replay_levels"] for r in r4_replayed) <= 5  # 5: trial 3's widening to max_load (no bracket)
