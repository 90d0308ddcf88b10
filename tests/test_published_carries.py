"""The what-carries diagnostic of ``benchmarks/published.py``: the fit without a family, with the family's own values
of some parameters swapped in, is what predicts that family's rows in each swap."""

from __future__ import annotations

from advisor.reference_fit import ReferenceFit
from benchmarks import published
from executors.perf.params import prior_params


def _fit(**values: float) -> ReferenceFit:
    return ReferenceFit(prior_params("H200").model_copy(update=values), list(values), 1, ["f"], ["H200"])


def test_a_swap_takes_the_named_values_from_the_family_s_own_fit_and_the_rest_from_the_fit_without_it():
    left_out = _fit(mfu_prefill=0.5, request_latency_s=0.001, layer_latency_s=1.2e-4)
    own = _fit(mfu_prefill=0.07, request_latency_s=0.35)
    h200 = published.swapped(left_out, own, ["mfu_prefill"])("H200")
    assert h200.mfu_prefill == 0.07
    assert h200.request_latency_s == 0.001 and h200.layer_latency_s == 1.2e-4
    both = published.swapped(left_out, own, ["mfu_prefill", "request_latency_s"])("H200")
    assert (both.mfu_prefill, both.request_latency_s) == (0.07, 0.35)
    b200 = published.swapped(left_out, own, ["mfu_prefill"])("B200")  # unfitted fields: the kind's own priors
    assert b200.mfu_prefill == 0.07 and b200.attn_eff_prefill == prior_params("B200").attn_eff_prefill
    assert published.swapped(left_out, own, ["mfu_prefill"])("CPU") == prior_params("CPU")


def test_the_table_names_every_swap_and_leaves_missing_errors_blank():
    err = {"tput_per_gpu": 0.63, "median_ttft_ms": None, "median_tpot_ms": 0.19}
    carries = {"fam": {"rows": 2, "left_out_fit": err,
                       "one_at_a_time": {"mfu_prefill": {"left_out": 0.5, "own": 0.07, **err}},
                       "together": [{"swapped": ["mfu_prefill", "request_latency_s"], **err}]}}
    text = published.carries_table(carries)
    assert "| fam | nothing | 63% | – | 19% |" in text
    assert "mfu_prefill 0.5 → 0.07" in text and "mfu_prefill + request_latency_s" in text
