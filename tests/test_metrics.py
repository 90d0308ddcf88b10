"""One registry of metrics (``search_spaces.metrics``): a metric declared in one place is parsed from vLLM's JSON,
stored and read back, bounded by an SLO, ranked by its direction and labelled on the dashboard; and every reader
agrees which way each metric is better."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from db import connect, queries
from db.ranking import RunRow, metric_sign, objective_maximized, rank_deployments
from executors.measuring.bench_result import parse_result
from search_spaces import (
    SLO,
    Measurement,
    Metric,
    TrialState,
    all_metrics,
    higher_is_better,
    maximizable,
    register,
    slo_metrics,
    unregister,
)
from ui import advice, plots

QUEUE = "p90_queue_ms"


@pytest.fixture
def queue_metric() -> Iterator[Metric]:
    """A metric that exists only for this test: time requests waited in the server's queue, lower is better."""
    m = register(Metric(QUEUE, "ms", False, "P90 queue (ms)", "P90 time queued (ms)", percentile=90,
                        bench_key="p90_queue_ms"))
    yield m
    unregister(QUEUE)


def _bench_json(queue_ms: float) -> dict[str, object]:
    return {"completed": 10, "failed": 0, "num_prompts": 10, "duration": 2.0, "total_token_throughput": 800.0,
            "output_throughput": 400.0, "request_throughput": 5.0, "p90_ttft_ms": 120.0, "p90_queue_ms": queue_ms}


def test_a_metric_declared_once_reaches_parser_database_slos_ranking_and_dashboard(queue_metric: Metric) -> None:
    fast, slow = (parse_result(_bench_json(q), concurrency=8, gpus=2) for q in (12.5, 40.0))
    assert getattr(fast, QUEUE) == 12.5 and getattr(slow, QUEUE) == 40.0  # the bench parser read it
    assert fast.throughput_per_gpu == 400.0  # per GPU, as declared

    with connect("sqlite://") as d:
        d.upsert_study("m", {})
        for number, m in enumerate((slow, fast)):
            tid = d.start_trial("m", number, params={})
            d.finish_trial(tid, TrialState.COMPLETE, measurements=[m])
        stored = queries.get_trial(d, "m", 1)
        assert stored is not None and getattr(stored.measurements[0], QUEUE) == 12.5  # stored and read back

        slo = SLO(metric=QUEUE, op="<=", value=20.0)  # an SLO may name it
        assert slo.met(fast) and not slo.met(slow)
        assert QUEUE in slo_metrics() and queries.parse_slos(f"{QUEUE}<=20")[0] == slo
        best = queries.best_under_slo(d, "m", [], metric=QUEUE)  # ranked by its direction: lower is better
        assert best is not None and best.trial.number == 1
        assert [lv.trial_number for lv in queries.pareto_front(d, "m", x="throughput_per_gpu", y=QUEUE)] == [1]

    assert advice.short(QUEUE) == "P90 queue (ms)" and plots.label(QUEUE) == "P90 time queued (ms)"
    assert advice.value_text(QUEUE, 12.5) == "12.5 ms"
    assert advice.level_marks(fast, [slo]) == {f"{QUEUE} <= 20": True}


def test_an_undeclared_extra_is_refused_and_a_declared_one_must_be_a_number(queue_metric: Metric) -> None:
    base = {"concurrency": 1, "source": "simulated", "gpus": 1, "num_requests": 1, "completed": 1}
    with pytest.raises(ValueError, match="p90_qeueu_ms"):
        Measurement(**base, p90_qeueu_ms=1.0)
    with pytest.raises(ValueError, match="must be a number"):
        Measurement(**base, **{QUEUE: "fast"})
    unregister(QUEUE)
    with pytest.raises(ValueError, match=QUEUE):
        Measurement(**base, **{QUEUE: 1.0})
    with pytest.raises(ValueError, match="unknown SLO metric"):
        SLO(metric=QUEUE, op="<=", value=1.0)


def test_every_reader_agrees_the_error_rate_is_better_lower() -> None:
    """SLOs, level ranking and the answer's ranking once disagreed: the ranking's suffix rule (``*_ms``
    minimized, anything else maximized) ranked the deployment with more failures first."""
    assert not higher_is_better("error_rate") and metric_sign("error_rate") == -1
    assert not objective_maximized("error_rate") and not advice.higher("error_rate")
    rows = [RunRow(0, TrialState.COMPLETE.value, {"error_rate": 0.05}, 0.0),
            RunRow(1, TrialState.COMPLETE.value, {"error_rate": 0.01}, 0.0)]
    assert [r.trial for r in rank_deployments(rows, "error_rate")] == [1, 0]
    assert "error_rate" not in maximizable() and "error_rate" in slo_metrics()


def test_every_declared_metric_is_a_measurement_field_and_the_directions_agree() -> None:
    """The built-in declarations describe ``Measurement``'s own fields (the database has a column for each), and
    what an objective may maximize is exactly the declared higher-is-better SLO metrics."""
    assert {m.name for m in all_metrics()} <= set(Measurement.model_fields)
    assert set(maximizable()) == {m.name for m in all_metrics() if m.slo and m.higher_is_better}
    for m in all_metrics():
        assert objective_maximized(m.name) == m.higher_is_better == advice.higher(m.name)
        assert m.slo is (m.name in slo_metrics())
    with pytest.raises(ValueError, match="declared already"):
        register(Metric("error_rate", "share", True, "error rate"))


def test_the_metrics_table_in_the_docs_names_every_declared_metric() -> None:
    doc = (Path(__file__).resolve().parents[1] / "docs" / "measurement.md").read_text()
    for m in all_metrics():
        name = re.sub(r"^p\d+_", "pNN_", m.name)
        assert f"`{name}`" in doc, m.name
