"""Reading results: the public face of the reads, and the named queries ``advisor query NAME [args]`` may run.

Every function takes a ``Database`` and returns plain rows (``db.rows`` dataclasses and ``search_spaces``
models). The reads live in ``db.trial_queries`` (studies, trials, failures, history) and ``db.level_queries``
(load levels, best under SLOs, Pareto front), the directions in ``db.ranking``; they are re-exported here, so
``queries.get_trial(db, ...)`` is the one way callers read. ``NAMED_QUERIES`` is what ``advisor query`` may run —
named queries only, never SQL.

Which way is better is each metric's declaration (``search_spaces.metrics``): throughput and tokens/s per user
are maximized, latencies and the error rate minimized. "Best" and "Pareto" consider COMPLETE trials only (a trial
that failed at a higher load is not recommended for the load it survived), and only levels that completed a
request.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any

from db.engine import Database
from db.level_queries import best_under_slo, level_table, measurements, pareto_front
from db.models import MEASUREMENT_COLUMNS
from db.ranking import (
    RunRow, Runs, cluster_factor, copies, objective_maximized, pareto_mask, rank_deployments,
)
from db.rows import Best, Level, UnknownStudy
from db.trial_queries import (
    TRIAL_COLUMNS,
    Table,
    failures,
    get_study,
    get_trial,
    history,
    list_studies,
    list_trials,
    trial_table,
)
from search_spaces import DEFAULT_OBJECTIVE, DEFAULT_PARETO_Y, SLO, Measurement, slo_metrics

#: The columns of a load level, in ``Measurement``'s field order (everything but ``raw``).
LEVEL_FIELDS: tuple[str, ...] = tuple(f for f in Measurement.model_fields if f != "raw")


# ---------------------------------------------------------------------------------------------- named queries
class QueryError(ValueError):
    """A named query was asked for wrongly (unknown name, missing or bad argument): one line for the user."""


_SLO_RE = re.compile(r"^\s*([A-Za-z0-9_]+)\s*(<=|>=)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


def parse_slos(text: str) -> list[SLO]:
    """``"p90_ttft_ms<=2000,p90_tokens_per_s_per_user>=20"`` → SLOs. Empty text → no SLOs."""
    out = []
    for part in (p for p in text.split(",") if p.strip()):
        m = _SLO_RE.match(part)
        if not m:
            raise ValueError(f"SLO {part.strip()!r} is not METRIC<=VALUE or METRIC>=VALUE")
        metric, op, value = m.groups()
        if metric not in slo_metrics():
            raise ValueError(f"unknown SLO metric {metric!r}; allowed: {', '.join(slo_metrics())}")
        out.append(SLO(metric=metric, op=op, value=float(value)))
    return out


_REQUIRED: Any = object()


@dataclass(frozen=True)
class QueryArg:
    name: str
    type: type  # str, int or float
    help: str
    default: Any = _REQUIRED

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED


@dataclass(frozen=True)
class NamedQuery:
    """A query the CLI may run: ``advisor query NAME [VALUE | ARG=VALUE ...]`` (values in declared order).

    ``run(db, **typed_args)`` runs it (missing optional arguments take their defaults); ``q(db, ["a", "k=v"])``
    parses strings first. Either raises ``QueryError`` (one line) for what the user got wrong.
    """

    name: str
    help: str
    args: tuple[QueryArg, ...]
    fn: Callable[..., Table]

    def run(self, db: Database, **kwargs: Any) -> Table:
        return self(db, kwargs)

    def parse(self, given: Sequence[str] | Mapping[str, Any] = ()) -> dict[str, Any]:
        """Arguments from ``["study1", "metric=p90_ttft_ms"]`` or a mapping, typed, defaults filled in."""
        by_name = {a.name: a for a in self.args}
        raw: dict[str, Any] = {}
        if isinstance(given, Mapping):
            raw.update(given)
        else:
            positional = iter(self.args)
            for item in given:
                key, sep, value = item.partition("=")
                if sep and key in by_name:
                    raw[key] = value
                    continue
                arg = next((a for a in positional if a.name not in raw), None)
                if arg is None:
                    raise QueryError(f"query {self.name}: unexpected argument {item!r}; it takes: {self.usage()}")
                raw[arg.name] = item
        unknown = sorted(set(raw) - set(by_name))
        if unknown:
            raise QueryError(f"query {self.name}: unknown argument {', '.join(unknown)}; it takes: {self.usage()}")
        out: dict[str, Any] = {}
        for a in self.args:
            if a.name not in raw or raw[a.name] is None:
                if a.required:
                    raise QueryError(f"query {self.name} needs {a.name} ({a.help}); usage: {self.usage()}")
                out[a.name] = a.default
                continue
            try:
                out[a.name] = a.type(raw[a.name])
            except (TypeError, ValueError):
                raise QueryError(
                    f"query {self.name}: {a.name} must be {a.type.__name__}, got {raw[a.name]!r}"
                ) from None
        return out

    def usage(self) -> str:
        parts = [a.name if a.required else f"[{a.name}={a.default!r}]" for a in self.args]
        return f"{self.name} {' '.join(parts)}".strip()

    def __call__(self, db: Database, given: Sequence[str] | Mapping[str, Any] = ()) -> Table:
        kwargs = self.parse(given)
        try:
            return self.fn(db, **kwargs)
        except QueryError:
            raise
        except (UnknownStudy, ValueError) as e:  # unknown study, metric, state or SLO: the user's input
            raise QueryError(f"query {self.name}: {e}") from None


def run_query(db: Database, name: str, given: Sequence[str] | Mapping[str, Any] = ()) -> Table:
    """Run the named query ``name``; ``QueryError`` (one line) for anything the user got wrong."""
    q = NAMED_QUERIES.get(name)
    if q is None:
        raise QueryError(f"unknown query {name!r}; allowed: {', '.join(NAMED_QUERIES)}")
    return q(db, given)


def _cell(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat(timespec="seconds")
    if isinstance(v, Enum):
        return v.value
    if isinstance(v, (dict, list)):
        return json.dumps(v, sort_keys=True)
    return v


def _last_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


def _q_studies(db: Database) -> Table:
    cols = ["name", "description", "executor", "trials", "complete", "failed", "invalid", "running", "interrupted",
            "best_objective", "best", "best_trial", "updated_at"]
    rows = [
        [st.name, st.description, st.executor, st.trials, st.done, st.failed, st.invalid, st.running,
         st.interrupted, st.best_objective, st.best, st.best_trial, st.updated_at]
        for st in list_studies(db)
    ]
    return cols, [[_cell(v) for v in r] for r in rows]


def _q_trials(db: Database, study: str, states: str) -> Table:
    wanted = [p.strip() for p in states.split(",") if p.strip()] or None
    trials = list_trials(db, study, states=wanted)
    objs: list[str] = []
    for t in trials:
        objs += [k for k in (t.objectives or {}) if k not in objs]
    cols = ["trial", "state", "gpus", "config", *objs, "violation", "failure_kind", "reason",
            "deploy_s", "warmup_s", "measure_s", "teardown_s", "worker", "proposer", "repeat_of", "executed",
            "reused_from", "baseline", *[f"predicted_{k}" for k in objs], "started_at", "finished_at"]
    rows = [
        [t.number, t.state, t.gpus, t.config_text, *[(t.objectives or {}).get(k) for k in objs], t.violation,
         t.failure_kind, t.reason, t.deploy_s, t.warmup_s, t.measure_s, t.teardown_s, t.worker, t.proposer,
         t.repeat_of, t.executed, t.reused_from, t.baseline, *[(t.predicted or {}).get(k) for k in objs],
         t.started_at, t.finished_at]
        for t in trials
    ]
    return cols, [[_cell(v) for v in r] for r in rows]


def _level_table(levels: Iterable[Level]) -> Table:
    cols = ["trial", "state", "config", *LEVEL_FIELDS]
    rows = [
        [_cell(v) for v in [lv.trial_number, lv.state, lv.config_text, *(lv.metric(f) for f in LEVEL_FIELDS)]]
        for lv in levels
    ]
    return cols, rows


def _q_measurements(db: Database, study: str) -> Table:
    return _level_table(measurements(db, study))


def _q_trial(db: Database, study: str, number: int) -> Table:
    t = get_trial(db, study, number)
    if t is None:
        raise QueryError(f"study {study!r} has no trial {number}")
    return _level_table(
        Level(t.id, t.number, t.state, t.config_text, t.gpus, m) for m in t.measurements
    )


def _q_best(db: Database, study: str, slo: str, metric: str) -> Table:
    found = best_under_slo(db, study, parse_slos(slo), metric)
    if found is None:
        return _level_table([])
    t, m = found
    return _level_table([Level(t.id, t.number, t.state, t.config_text, t.gpus, m)])


def _q_pareto(db: Database, study: str, x: str, y: str, slo: str) -> Table:
    cols = ["trial", "config", "gpus", "concurrency", x, y]
    rows = [
        [lv.trial_number, lv.config_text, lv.gpus, lv.measurement.concurrency, lv.metric(x), lv.metric(y)]
        for lv in pareto_front(db, study, x, y, parse_slos(slo) or None)
    ]
    return cols, rows


def _q_history(db: Database, study: str, objective: str) -> Table:
    cols = ["trial", "state", "value", "feasible", "best"]
    rows = [[p.number, p.state.value, p.value, p.feasible, p.best] for p in history(db, study, objective or None)]
    return cols, rows


def _q_failures(db: Database, study: str) -> Table:
    cols = ["trial", "state", "failure_kind", "reason", "config", "last_log_line", "finished_at"]
    rows = [
        [_cell(v) for v in [f.number, f.state, f.failure_kind, f.reason, f.config_text, _last_line(f.log_tail),
                            f.finished_at]]
        for f in failures(db, study)
    ]
    return cols, rows


#: The metrics of imported points, in the published rows' names and order (``advisor import``).
EXTERNAL_METRICS: tuple[str, ...] = (
    "tput_per_gpu", "output_tput_per_gpu", "input_tput_per_gpu", "median_ttft_ms", "p90_ttft_ms", "median_tpot_ms",
    "p90_tpot_ms", "tok_s_per_user", "mean_ttft_ms", "mean_tpot_ms")


def _q_external(db: Database, batch: str, model: str, gpu: str) -> Table:
    points = db.external_points(batch=batch or None, model=model or None, gpu=gpu or None)
    extra = sorted({k for p in points for k in p.metrics} - set(EXTERNAL_METRICS))
    names = [*EXTERNAL_METRICS, *extra]
    cols = ["id", "batch", "engine", "model", "precision", "gpu", "total_gpus", "mode", "deployment", "mtp", "isl",
            "osl", "range_ratio", "concurrency", *names, "per_gpu_normalization", "source", "imported_at"]
    rows = [
        [_cell(v) for v in [p.id, p.batch, p.engine, p.model, p.precision, p.gpu, p.total_gpus, p.mode,
                            p.deployment_text, p.mtp, p.isl, p.osl, p.range_ratio, p.concurrency,
                            *(p.metrics.get(k) for k in names), p.per_gpu_normalization, p.source, p.imported_at]]
        for p in points
    ]
    return cols, rows


_STUDY = QueryArg("study", str, "the study's name")
_SLO = QueryArg("slo", str, "comma-separated SLOs, e.g. 'p90_ttft_ms<=2000,p90_tokens_per_s_per_user>=20'", "")

NAMED_QUERIES: dict[str, NamedQuery] = {
    q.name: q
    for q in [
        NamedQuery("studies", "every study with its trials per state and best objective so far", (), _q_studies),
        NamedQuery(
            "trials", "a study's trials: state, GPUs, deployment, objectives, reason, phase timings",
            (_STUDY, QueryArg("states", str, "comma-separated states to keep (default: all)", "")), _q_trials,
        ),
        NamedQuery("trial", "one trial's load levels with every metric",
                   (_STUDY, QueryArg("number", int, "the trial number")), _q_trial),
        NamedQuery("measurements", "every trial × load level with every metric", (_STUDY,), _q_measurements),
        NamedQuery(
            "best", "the trial × load level with the best metric among those meeting every SLO",
            (_STUDY, _SLO, QueryArg("metric", str, "metric to rank by", DEFAULT_OBJECTIVE)), _q_best,
        ),
        NamedQuery(
            "pareto", "non-dominated trial × load levels on two metrics (optionally SLO-meeting only)",
            (_STUDY, QueryArg("x", str, "first metric", DEFAULT_OBJECTIVE),
             QueryArg("y", str, "second metric", DEFAULT_PARETO_Y), _SLO),
            _q_pareto,
        ),
        NamedQuery(
            "history", "per trial: objective value and best so far (convergence)",
            (_STUDY, QueryArg("objective", str, "objective name (default: the study's first)", "")), _q_history,
        ),
        NamedQuery("failures", "failed, invalid and interrupted trials with their reasons", (_STUDY,), _q_failures),
        NamedQuery(
            "external", "imported operating points (advisor import): source, layout, workload, measured metrics",
            (QueryArg("batch", str, "only this import batch's label (default: every batch)", ""),
             QueryArg("model", str, "only this model, as imported (default: every model)", ""),
             QueryArg("gpu", str, "only this GPU kind (default: every kind)", "")),
            _q_external,
        ),
    ]
}

__all__ = [
    "Best", "EXTERNAL_METRICS", "LEVEL_FIELDS", "MEASUREMENT_COLUMNS", "NAMED_QUERIES", "NamedQuery", "QueryArg",
    "QueryError",
    "RunRow", "Runs", "TRIAL_COLUMNS", "Table", "best_under_slo", "cluster_factor", "copies", "failures", "get_study", "get_trial", "history", "level_table",
    "list_studies", "list_trials", "measurements", "objective_maximized", "pareto_front", "pareto_mask",
    "parse_slos", "rank_deployments", "run_query", "trial_table",
]
