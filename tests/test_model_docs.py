"""The performance-model doc and the README quote the model as it is: one truth per fact.

``benchmarks/model_figures.py`` computes every marked block (``<!-- figures:NAME -->…<!-- /figures -->``) from the
code; these tests recompute them and fail when a quoted number is more than 1% off, or a parameter or constant of
the model is missing from the doc. Fix: ``python benchmarks/model_figures.py`` (rewrites the blocks).
"""

from __future__ import annotations

import pytest

from benchmarks.model_figures import BLOCK, DOC, README, blocks, constants, disagreements
from executors.perf import PerfParams


@pytest.fixture(scope="module")
def computed() -> dict[str, str]:
    return blocks()


@pytest.mark.parametrize("path", [DOC, README], ids=["performance-model.md", "README.md"])
def test_quoted_figures_match_the_model(path, computed):
    assert disagreements(path.read_text(), computed) == []


def test_every_figure_is_quoted_once(computed):
    names = [m[1] for p in (DOC, README) for m in BLOCK.finditer(p.read_text())]
    assert sorted(names) == sorted(computed)


def test_every_parameter_and_constant_is_in_the_doc():
    doc = DOC.read_text()
    missing = [n for n in PerfParams.model_fields if f"`{n}`" not in doc]
    assert not missing, f"PerfParams fields missing from {DOC.name}: {missing}"
    consts = constants()
    assert {"MODEL_VERSION", "LL_MAX_TOKENS", "RANDOM_WAIT_UTIL_CAP", "DBO_DECODE_THRESHOLD"} <= {c[0] for c in consts}
    for name, module, _, source in consts:
        assert source, f"{module}.{name} has no '#:' comment saying what it is and where it comes from"
        assert f"`{name}`" in doc, f"{module}.{name} missing from {DOC.name}"


def test_a_stale_number_is_caught(computed):
    text = "x <!-- figures:seed-cpu -->" + computed["seed-cpu"] + "<!-- /figures --> y"
    assert disagreements(text, computed) == []
    stale = text.replace("12,288", "12,600")  # 2.5% off
    assert any("12,600" in d for d in disagreements(stale, computed))
    close = text.replace("12,288", "12,300")  # 0.1% off: within the tolerance
    assert disagreements(close, computed) == []
    assert disagreements(text.replace("streams", "sends"), computed)  # words changed by hand
