"""GPU evidence that can be re-derived is: ``research/results/h200-knee/`` rebuilt from its committed
``raw.tar.xz`` equals its committed tables; the folders whose raw results were never committed say so."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from research.tests.gpu_records import raw_or_skip

RESULTS = Path(__file__).resolve().parents[2] / "research" / "results"


@pytest.fixture(scope="module")
def knee(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("h200_knee_make_summary", RESULTS / "h200-knee" / "make_summary.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    raw_or_skip(RESULTS / "h200-knee" / "raw.tar.xz")
    return mod, mod.unpack(tmp_path_factory.mktemp("h200-knee"))


def test_knee_tables_rebuild_from_the_raw_results(knee):
    mod, raw = knee
    for name, text in mod.tables(raw).items():
        assert text == (RESULTS / "h200-knee" / name).read_text(), name


def test_knee_summary_derived_parts_rebuild_from_the_raw_results(knee):
    mod, raw = knee
    summary = json.loads((RESULTS / "h200-knee" / "summary.json").read_text())
    part = json.loads(json.dumps(mod.derived(raw)))  # as JSON stores it (int keys become strings)
    assert part["trials"] == summary["trials"]
    for key in ("gain", "deploy_times"):
        assert {k: summary[key][k] for k in part[key]} == part[key], key
    assert part["calls"] == summary["calls"] and part["device_seconds_used"] == summary["device_seconds_used"]


@pytest.mark.parametrize("folder", ["h200", "h200x2"])
def test_folders_without_raw_results_say_so(folder):
    notes = (RESULTS / folder / "NOTES.md").read_text()
    assert "never committed" in notes and "cannot be re-derived" in notes
    assert not list((RESULTS / folder).glob("raw*"))
