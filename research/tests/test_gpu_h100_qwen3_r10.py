"""The lent H100 of 6 Dec, second session (``research/results/h100-qwen3-checks-r2/``): eight more Qwen3-235B-width
stack checks (depths 2, 3, 5, 7, 8 and 9; five batch sizes), each predicted as sent before it deployed by profile #2
(its parameter file, committed in the session before) and by that profile's probes fitted without the two c = 256
decode levels (``explore-c256/refit-as-sent-no256.json``, also committed before) — the lead of the first session
put to levels nobody had seen when it was written. Re-derives the figures with ``research/gpu/stack_checks.py``
(nothing deployed) and holds them to what docs/benchmarks.md says of them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from research.tests.stack_checks_again import assert_as_committed, stack_checks_again

ROOT = Path(__file__).resolve().parents[2]
RES = ROOT / "research/results/h100-qwen3-checks-r2"
PROFILE = ROOT / "research/results/h100-qwen3-profile"
PARAMS = {"profile": PROFILE / "profile-qwen3-235b.json", "no256": PROFILE / "explore-c256/refit-as-sent-no256.json"}


@pytest.fixture(scope="module")
def again(tmp_path_factory) -> dict:
    """stack_checks.py over a copy of the committed checks."""
    return stack_checks_again(tmp_path_factory.mktemp("r10"), list(RES.glob("check-*.json")),
                              {k: str(v) for k, v in PARAMS.items()})


def medians(result: dict, view: str, name: str) -> dict[str, float]:
    return {r["check"]: r["median"] for r in result["errors"] if r["view"] == view and r["set"] == name}


def test_the_checks_predicted_again_are_what_was_committed_and_what_the_device_wrote(again):
    assert_as_committed(again, RES / "stack_checks.json")
    # the device predicted with the fixed as-sent view (first wave left out) and the same files: the same numbers
    for name in PARAMS:
        assert medians(again, "as sent, on the device", name) == pytest.approx(medians(again, "as-sent", name))
    for path in RES.glob("check-*.json"):
        check = json.loads(path.read_text())
        assert check["level_model"] == "as sent" and check["failure"] is None
        assert check["profile"].endswith("h100-qwen3-profile/profile-qwen3-235b.json")
        assert {f"L{check['depth']}", check["config"]} <= set(path.stem.split("-"))


def test_the_profile_and_the_fit_without_c256_on_unseen_deployments(again):
    prof, no256, dflt = (medians(again, "as-sent", n) for n in ("profile", "no256", "defaults"))
    depths = {json.loads(p.read_text())["depth"] for p in RES.glob("check-*.json")}
    assert len(prof) == 8 and depths == {2, 3, 5, 7, 8, 9}
    summary = again["summary"]["as-sent"]
    assert summary["profile"] == pytest.approx(0.103, abs=5e-4) and summary["no256"] == pytest.approx(0.091, abs=5e-4)
    assert summary["defaults"] == pytest.approx(0.236, abs=5e-4)
    # issue 29's bar holds on the median, not on every check: two checks read 25% and 27% with the profile
    assert sorted(prof.values())[-2] > 0.20 and all(prof[c] < dflt[c] for c in prof)
    # the fit without the c = 256 probes: every check within 15%, better on six of eight, in both views
    assert max(no256.values()) < 0.15 and sum(no256[c] < prof[c] for c in prof) == 6
    assert again["summary"]["steady"]["no256"] < again["summary"]["steady"]["profile"] - 0.05
    # where the profile misses: the decode step at the higher load of each check is over-predicted
    for stem, m in again["checks"].items():
        top = max(m["levels"], key=int)
        assert m["predicted"]["as-sent"]["profile"][top]["p50_tpot_ms"] > m["levels"][top]["p50_tpot_ms"], stem


def test_every_level_was_clean():
    stalls = json.loads((RES / "stalls.json").read_text())
    assert stalls["summary"]["levels"] == {**stalls["summary"]["levels"], "stalled": 0, "clean": 16}
    assert stalls["summary"]["levels"]["clean_pause_s_max"] < 0.1
