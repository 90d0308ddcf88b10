"""The eighth H200 session's DeepSeek-V3-width profile says what docs/benchmarks.md says.

``research/results/h200-profile-dsv3/call6-8-4dec/`` holds the device's database and every bench JSON and server
log (``raw.tar.xz``), the profile's report, the stack check and the refits made here afterwards. This test reads the
stored profile back through the project's own queries, re-derives the figures the docs quote from those files, and
re-measures every level's longest pause from the raw bench JSONs with the project's own detector.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

import db
from research.tests.gpu_records import ROOT, raw_or_skip, written_record

RESULTS = ROOT / "research" / "results" / "h200-profile-dsv3" / "call6-8-4dec"
DOCS = written_record()
SECTION = DOCS[DOCS.index("**Eighth session (4 Dec, evening)"):DOCS.index("**Fourth session: the 30B profile again")]


def _json(name: str) -> dict[str, Any]:
    return json.loads((RESULTS / name).read_text())


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dsv3-r5")
    with tarfile.open(raw_or_skip(RESULTS / "raw.tar.xz")) as tar:
        tar.extractall(out, filter="data")
    return out


def test_the_stored_profile_is_the_report_and_the_docs(raw: Path) -> None:
    database = db.connect(f"sqlite:///{raw / 'da-gpu/results.db'}")
    try:
        [prof] = database.profiles()
    finally:
        database.close()
    report = _json("profile-dsv3.report.json")
    assert prof.id == report["profile"] and len(prof.probes) == report["levels"] == 14
    assert sorted({p["depth"] for p in prof.probes}) == report["depths"] == [1, 5]
    assert f"{round(report['wall_s']):,} s" in SECTION
    deploy = [round(x) for x in report["deploy_s"]]
    assert deploy == [316, 203] and f"| {deploy[0]} s" in SECTION and f"| {deploy[1]} s" in SECTION
    assert f"{round(report['measure_s'][0])} s" in SECTION and f"{round(report['measure_s'][1])} s" in SECTION
    held, before = report["error_after"]["held_out"]["overall"], report["error_before"]["held_out"]["overall"]
    assert f"{_pct(held)} with the profile,\n{_pct(before)} with the defaults" in SECTION
    assert f"(in sample {_pct(report['error_after']['in_sample']['overall'])})" in SECTION
    tpot = {p["depth"]: p["values"]["p50_tpot_ms"] for p in prof.probes if p["kind"] == "decode"
            and p["concurrency"] == 1}
    assert f"P50 TPOT {tpot[1]:.2f} ms at 1 layer and {tpot[5]:.2f} ms at 5" in " ".join(SECTION.split())
    assert tpot[1] > tpot[5]  # more layers, a shorter decode step: no per-layer cost can be read from them


def test_the_refits_and_the_stack_check_are_the_docs() -> None:
    text = " ".join(SECTION.split())
    for name in ("refit-all.report.json", "refit-no-pauses.report.json"):
        r = _json(name)
        assert f"{_pct(r['error_after']['in_sample']['overall'])} in sample" in text
        assert _pct(r["error_after"]["held_out"]["overall"]) in text
        assert _pct(r["error_before"]["in_sample"]["overall"]) in text  # the defaults on the same levels
        assert r["error_after"]["held_out"]["overall"] > r["error_before"]["held_out"]["overall"]  # still loses
    assert _json("refit-no-pauses.report.json")["dropped"] == ["L1/decode/2048/c16", "L1/decode/2048/c256",
                                                               "L5/decode/2048/c256"]
    check = _json("check-dsv3-L3.json")
    assert check["depth"] == 3 and check["failure"] is None
    prof, dflt = check["errors"]["profile"]["median"], check["errors"]["defaults"]["median"]
    assert f"over 10 values {_pct(prof)} with the profile, {_pct(dflt)} with the defaults" in text
    c8 = _json("check-dsv3-L3-c8-refit.json")
    assert list(c8["measured"]) == ["8"]
    m = c8["measured"]["8"]
    assert f"{m['throughput_per_gpu']:,.0f} tok/s/GPU, P50 TTFT {m['p50_ttft_ms']:.0f} ms, P50 TPOT " \
           f"{m['p50_tpot_ms']:.2f} ms" in text
    e = c8["errors"]
    assert (f"{_pct(e['defaults']['median'])}, the profile {_pct(e['profile']['median'])}, the refit without "
            f"paused levels {_pct(e['refit_no_pauses']['median'])}") in text
    assert e["defaults"]["median"] < e["refit_no_pauses"]["median"] < e["profile"]["median"]


def test_the_pauses_are_the_detectors_and_the_docs(raw: Path) -> None:
    """Every measured level's longest pause, re-measured from its raw bench JSON with the detector the executors
    use (``bench_result.stall_of``), is the committed ``stalls-r5.json`` and the docs' figures."""
    from executors.measuring.bench_result import stall_of

    table = json.loads((RESULTS.parent / "stalls-r5.json").read_text())
    text = " ".join(SECTION.split())
    seen = {}
    for row in table["levels"]:
        got = stall_of(json.loads((raw / "da-runs" / row["file"]).read_text()))
        assert got is not None and got["longest_pause_s"] == pytest.approx(row["longest_pause_s"], rel=1e-9)
        assert got["stalled"] == row["stalled"]
        seen[row["file"]] = row
    measured = [r for r in seen.values() if not r["warmup"]]
    stalled = sorted(r["longest_pause_s"] for r in measured if r["stalled"])
    clean = [r["longest_pause_s"] for r in measured if not r["stalled"]]
    assert len(stalled) == 4 and all(f"{x:.2f} s" in text for x in stalled)
    assert f"{min(clean):.2f}–{max(clean):.2f} s in every other level" in text
    assert f"warm-ups up to {max(r['longest_pause_s'] for r in seen.values() if r['warmup']):.2f} s" in text
