"""Every read the dashboard makes, through ``db``'s query functions only (never SQL), cached.

Reads are keyed by storage URL + study + a *stamp* — the study's trial counts per state — so a new trial
invalidates the cached tables at once while an idle study costs one small query per rerun. The heavy
tables come back as pandas DataFrames (cheap for ``st.cache_data`` to copy); one trial comes back as the
``db.Trial`` dataclass.

A SQLite file that does not exist is reported as "no database yet" and is not created: opening it with
``db.connect`` would write an empty schema, and a dashboard only looks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

import db
from advisor import api
from advisor.answer import best_text
from advisor.errors import BadInput
from advisor.executor_factory import is_simulated
from advisor.job import ExecutorSpec, Objective, TuningJob, job_from_dict
from advisor.study_counts import Counts
from db import queries, redact_url
from search_spaces import DEFAULT_OBJECTIVE, DEFAULT_PARETO_Y, slo_metrics
from ui import advice, trial_plots
from ui.settings import settings

#: Seconds a cached table may live (the stamp invalidates it sooner when a trial finishes).
TTL_S = 300
#: Seconds the per-study summary (which carries the stamp) may be reused.
STAMP_TTL_S = 2
#: The columns of a load level that the study page's tables and plots use, in display order.
LEVEL_METRICS = [
    "throughput_per_gpu", "output_throughput_per_gpu", "request_throughput",
    "p50_tokens_per_s_per_user", "p90_tokens_per_s_per_user", "p99_tokens_per_s_per_user",
    "p50_ttft_ms", "p90_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p90_tpot_ms", "p99_tpot_ms",
    "p90_itl_ms", "p90_e2el_ms", "dp_imbalance", "eplb_balancedness", "prefix_cache_hit_rate",
    "kv_transfer_tokens", "preemptions", "completed", "failed", "num_requests", "duration_s",
]

Stamp = tuple[tuple[str, int], ...]


class Unavailable(Exception):
    """The database cannot be read; the message is one line, password hidden."""


@dataclass(frozen=True)
class SLOLine:
    metric: str
    op: str
    value: float

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.value:g}"


@dataclass(frozen=True)
class StudyInfo:
    """One study's header: what was asked (from its stored job) and how far it got."""

    name: str
    description: str
    model: str
    cluster: str
    workload: str
    executor: str
    objective_mode: str
    x_metric: str
    y_metric: str
    objectives: list[str]
    slos: list[SLOLine]
    budget: int
    counts: dict[str, int]
    best: float | None
    best_objective: str | None
    best_trial: int | None
    optuna_study_name: str | None
    engine_version: str | None
    updated_at: Any
    job_problem: str | None = None
    stamp: Stamp = field(default_factory=tuple)
    #: Its numbers are the performance model's (``advisor.executor_factory.is_simulated`` of the stored job's
    #: executor section; one that no longer validates: not).
    simulated: bool = False

    @property
    def trials(self) -> int:
        return sum(self.counts.values())

    def count(self, state: str) -> int:
        return self.counts.get(state, 0)

    #: What the budget counts (``db.budget``): search trials that ran; the baseline, repeats, reused
    #: measurements, environment failures, invalid and interrupted trials left out.
    executed: int = 0
    #: Complete trials that reused an earlier trial's measurements (recorded, not run again).
    reused: int = 0
    #: Every count named, as ``advisor studies`` says it (``advisor.study_counts``).
    tally: Counts | None = None
    #: The answer's mean over its runs, as ``advisor studies`` says it (``advisor.answer.best_text``).
    best_text: str | None = None

    @property
    def finished(self) -> int:
        return self.executed

    @property
    def state(self) -> str:
        """``running`` only while a tuner's heartbeat is fresh (``advisor.study_counts.Counts.state``)."""
        if self.tally is not None:
            return self.tally.state()
        return "finished" if self.finished >= self.budget else "stopped"

    @property
    def counts_text(self) -> str:
        return self.tally.text() if self.tally is not None else f"{self.finished} of {self.budget} search trials run"


# ---------------------------------------------------------------------------------------------- opening


def sqlite_file(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` URL (``None`` for other backends and in-memory databases)."""
    if url.startswith("sqlite:///") and ":memory:" not in url:
        return Path(url[len("sqlite:///"):].split("?", 1)[0])
    return None


def exists(url: str) -> bool:
    """False only for a SQLite file that is not there yet (a server database is asked, not guessed)."""
    path = sqlite_file(url)
    return path is None or path.exists()


@st.cache_resource(show_spinner=False)
def _connect(url: str, read_only: bool) -> db.Database:
    return db.connect(url, read_only=read_only)


def database(url: str) -> db.Database:
    """The open database (one engine per URL for the server's life); ``Unavailable`` in one line."""
    if not exists(url):
        raise Unavailable(f"no database at {sqlite_file(url)} yet")
    try:  # read-only: not even a migration (an older SQLite file is read from a migrated copy in memory)
        return _connect(url, not settings().allow_new_studies)
    except db.DatabaseUnavailable as e:
        raise Unavailable(f"cannot open {redact_url(url)}: {e}") from None


def clear() -> None:
    """Forget every cached read (the Refresh button)."""
    st.cache_data.clear()
    _describe_text.cache_clear()


# ---------------------------------------------------------------------------------------------- studies


def _describe_job(doc: dict[str, Any]) -> dict[str, Any]:
    """The job's headline facts; a job that no longer validates is shown from its raw document. Remembered by
    the document's text: validating a job loads its preset (YAML), which every page paid per study per rerun."""
    return dict(_describe_text(json.dumps(doc, sort_keys=True, default=str)))


@lru_cache(maxsize=512)
def _describe_text(text: str) -> dict[str, Any]:
    doc = json.loads(text)
    out: dict[str, Any] = {"problem": None, "simulated": _simulated(doc)}
    job: TuningJob | None = None
    try:
        job = job_from_dict(doc, source="stored job")
    except BadInput as e:
        out["problem"] = str(e)
    if job is not None:
        wl = job.workload
        out.update(
            model=job.model_profile().name, cluster=job.cluster.describe(),
            workload=f"{wl.dataset.value} ISL {wl.isl.mean} / OSL {wl.osl.mean}, "
                     + (f"concurrency {', '.join(map(str, wl.load_levels))}" if wl.load_levels else "knee search"),
            executor=job.executor.kind.value, mode=job.objective.mode.value, x=job.objective.metric,
            y=job.objective.pareto_y, slos=[SLOLine(s.metric, s.op, s.value) for s in job.slos],
            budget=job.budget.trials, description=job.description,
        )
    else:
        obj = doc.get("objective") or {}
        out.update(
            model=str((doc.get("model") or {}).get("preset") or (doc.get("model") or {}).get("path") or "?"),
            cluster=_cluster_words(doc.get("cluster")), workload="?",
            executor=str((doc.get("executor") or {}).get("kind", "?")),
            mode=str(obj.get("mode", Objective().mode.value)), x=str(obj.get("metric", DEFAULT_OBJECTIVE)),
            y=str(obj.get("pareto_y", DEFAULT_PARETO_Y)), slos=_raw_slos(doc.get("slos")),
            budget=int((doc.get("budget") or {}).get("trials", 0) or 0), description=str(doc.get("description", "")),
        )
    return out


def _raw_slos(slos: Any) -> list[SLOLine]:
    """The SLOs of a stored job that no longer validates, as written (those with a metric, op and value)."""
    out = []
    for sl in slos if isinstance(slos, list) else []:
        if isinstance(sl, dict) and isinstance(sl.get("value"), (int, float)) and sl.get("op") in ("<=", ">="):
            out.append(SLOLine(str(sl.get("metric")), str(sl["op"]), float(sl["value"])))
    return out


def _cluster_words(cluster: Any) -> str:
    """A stored job's cluster in the words ``ClusterSpec.describe`` uses (``2 × 8 H200 (16 GPUs)``), also for a
    job that no longer validates; never a raw mapping."""
    if not isinstance(cluster, dict):
        return str(cluster or "?")
    nodes, per, gpu = cluster.get("nodes"), cluster.get("gpus_per_node"), cluster.get("gpu", "?")
    if isinstance(nodes, int) and isinstance(per, int):
        return f"{nodes} × {per} {gpu} ({advice.plural(nodes * per, 'GPU')})"
    return ", ".join(f"{k} {v}" for k, v in cluster.items())


def _simulated(doc: dict[str, Any]) -> bool:
    try:
        spec = ExecutorSpec.model_validate(doc.get("executor") or {})
    except ValueError:
        return False
    return is_simulated(spec)


def _info(s: db.Study) -> StudyInfo:
    j = _describe_job(s.job)
    objectives = [j["x"]] if j["mode"] == "max_under_slo" else [j["x"], j["y"]]
    return StudyInfo(
        name=s.name, description=s.description or j["description"] or "", model=j["model"], cluster=j["cluster"],
        workload=j["workload"], executor=s.executor or j["executor"], objective_mode=j["mode"], x_metric=j["x"],
        y_metric=j["y"], objectives=objectives, slos=j["slos"], budget=j["budget"], counts=dict(s.counts),
        best=s.best, best_objective=s.best_objective, best_trial=s.best_trial, optuna_study_name=s.optuna_study_name,
        engine_version=s.engine_version, updated_at=s.updated_at, job_problem=j["problem"],
        stamp=tuple(sorted(s.counts.items())), executed=s.budget_used, reused=s.reused, simulated=j["simulated"],
        tally=Counts.of(s, j["budget"]), best_text=best_text(s.best, s.best_objective, s.best_runs),
    )


@st.cache_data(ttl=STAMP_TTL_S, show_spinner=False)
def studies(url: str) -> list[StudyInfo]:
    """Every study with its job summary and progress (``[]`` for a database not created yet)."""
    if not exists(url):
        return []
    return [_info(s) for s in queries.list_studies(database(url))]


@st.cache_data(ttl=STAMP_TTL_S, show_spinner=False)
def study(url: str, name: str) -> StudyInfo | None:
    if not exists(url):
        return None
    s = queries.get_study(database(url), name)
    return _info(s) if s is not None else None


def studies_frame(infos: list[StudyInfo]) -> pd.DataFrame:
    """The Studies page's table."""
    rows = [
        {
            "study": i.name, "state": i.state, "model": i.model, "cluster": i.cluster, "executor": i.executor,
            "objective": i.objective_mode, "SLOs": " · ".join(map(advice.slo_text, i.slos)) or "–",
            "trials": i.counts_text, "best": i.best_text, "best trial": i.best_trial, "updated": i.updated_at,
        }
        for i in infos
    ]
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------- one study's tables


def _slos(url: str, name: str) -> list[Any]:
    """The study's SLOs as ``search_spaces.SLO`` objects (their own ``met`` decides), via advisor's API."""
    try:
        return list(api.job_of_study(database(url), name).slos)
    except BadInput:
        return []


@st.cache_data(ttl=TTL_S, show_spinner=False)
def study_slos(url: str, name: str) -> list[Any]:
    """The study's SLOs as ``search_spaces.SLO`` objects (``met`` decides a level), cached."""
    return _slos(url, name)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def verdict(url: str, name: str, stamp: Stamp) -> api.Verdict:
    """What `advisor best` says under its table, by what each sentence says (``advisor.verdict.Verdict``):
    run-to-run spread, gain over vLLM's defaults, ties, the whole cluster, the model's out-of-sample error."""
    d = database(url)
    try:
        job = api.job_of_study(d, name)
    except BadInput:
        return api.Verdict()
    return api.study_verdict(d, name, job)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def levels(url: str, name: str, stamp: Stamp, x: str, y: str) -> pd.DataFrame:
    """Every trial × load level (``queries.level_table``: one column-only read), with ``meets_slo`` and
    ``pareto`` flags.

    ``meets_slo``: the level completed a request and each SLO's own ``met`` holds. ``pareto`` marks, among
    levels of complete trials meeting every SLO, the non-dominated ones by ``queries.pareto_mask`` — the
    front ``queries.pareto_front`` (and ``advisor best``) returns, without reading the levels a second time.
    """
    slos = _slos(url, name)
    metrics = list(dict.fromkeys(["concurrency", *LEVEL_METRICS, x, y, *(s.metric for s in slos), "intervals",
                                  "expert_routing", "purpose", "flags"]))
    cols, rows = queries.level_table(database(url), name, metrics)
    meets = [r.completed > 0 and all(s.met(r) for s in slos) for r in rows]  # SLO.met reads the row's columns
    df = pd.DataFrame(rows, columns=cols).rename(columns={"config_text": "config", "trial_gpus": "gpus"})
    df["config"] = df["config"].fillna("")
    df["meets_slo"] = pd.Series(meets, index=df.index, dtype=bool)
    df["pareto"] = False
    eligible = df[(df["state"] == "complete") & df["meets_slo"] & df[x].notna() & df[y].notna()]
    if not eligible.empty:
        on_front = queries.pareto_mask(eligible[x].tolist(), eligible[y].tolist(), x, y)
        df.loc[eligible.index[on_front], "pareto"] = True
    return df[["trial", "state", "config", "gpus", *metrics, "meets_slo", "pareto"]]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def external(url: str, name: str) -> pd.DataFrame:
    """The imported operating points (``advisor import``) of the study's model and GPU kind, one row each: batch,
    source, engine, deployment, concurrency and the metrics that have a name of ours (``advisor.external``).
    Empty where there are none or the study's job no longer validates."""
    from advisor.external import level_values, of_study

    d = database(url)
    try:
        job = api.job_of_study(d, name)
    except BadInput:
        return pd.DataFrame()
    rows = [{"batch": p.batch, "source": p.source, "engine": p.engine, "deployment": p.deployment_text or "",
             "gpus": p.total_gpus, "concurrency": p.concurrency, **level_values(p)}
            for p in of_study(d.external_points(gpu=job.cluster.gpu), job)]
    return pd.DataFrame(rows)


#: Metrics the Pareto plot may put on an axis: those whose better direction is known (``queries.pareto_mask``).
AXIS_METRICS = [m for m in LEVEL_METRICS if m in slo_metrics()]


def axis_options(levels: pd.DataFrame, *defaults: str) -> list[str]:
    """The stored metrics that have data in this study (and the study's own axes, first)."""
    have = [m for m in AXIS_METRICS if m in levels and levels[m].notna().any()] if not levels.empty else []
    return list(dict.fromkeys([*defaults, *have]))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def chosen(url: str, name: str, stamp: Stamp) -> advice.Chosen | None:
    """The study's answer (``advisor.answer``: what `advisor best` names) as the recommendation takes it; None
    while no trial met the SLOs, or when the study's job cannot be read."""
    try:
        a = api.answer(url, name)
    except BadInput:
        return None
    if a is None:
        return None
    base, equal = a.baseline, a.equal_load
    return advice.Chosen(a.trial, a.point.concurrency, a.is_baseline, base.trial if base is not None else None,
                         a.baseline_point.concurrency if a.baseline_point is not None else None, a.gain,
                         a.runs, equal.concurrency if equal is not None else None,
                         equal.defaults_trial if equal is not None else None)


#: What the trial table reads (``queries.trial_table``): no topology, resources or log tails.
_TRIAL_COLUMNS = ["number", "state", "gpus", "config", "config_text", "objectives", "violation", "failure_kind",
                  "reason", "deploy_s", "warmup_s", "measure_s", "teardown_s", "worker", "started_at",
                  "finished_at", "params", "proposer", "repeat_of", "reused_from"]


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trials(url: str, name: str, stamp: Stamp) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per trial, one row per trial of its Optuna parameters) from one column-only read
    (``queries.trial_table``)."""
    cols, rows = queries.trial_table(database(url), name, _TRIAL_COLUMNS)
    if not rows:
        return pd.DataFrame(), pd.DataFrame()
    t = dict(zip(cols, map(list, zip(*rows))))
    configs, texts = t["config"], t["config_text"]
    df = pd.DataFrame({
        "trial": t["number"], "state": t["state"],
        "by": [f"{p} of {r}" if r is not None else p for p, r in zip(t["proposer"], t["repeat_of"])],  # as the CLI
        "gpus": t["gpus"],
        "deployment": [c.short() if c else (text or "") for c, text in zip(configs, texts)],
        "config": [text or "" for text in texts], "mode": [c.mode.value if c else None for c in configs],
    })
    objectives = pd.DataFrame([o or {} for o in t["objectives"]], index=df.index)
    reason = pd.Series(t["reason"], dtype=object).fillna("")
    violation = pd.Series(t["violation"], dtype=float)
    rest = pd.DataFrame({
        "violation": violation, "feasible": violation.isna() | (violation <= 0), "failure_kind": t["failure_kind"],
        # "repeat_of" is the views' name for it: the trial whose measurements this one reused (not repeat_top)
        "reason": reason, "repeat_of": pd.Series(t["reused_from"], dtype=float),
        "repeats": pd.array(t["repeat_of"], dtype="Int64"),  # the trial a repeat on a fresh deploy measures again
        **{k: pd.Series(t[k], dtype=float) for k in ("deploy_s", "warmup_s", "measure_s", "teardown_s")},
        "worker": t["worker"], "started": t["started_at"], "finished": t["finished_at"],
    }, index=df.index)
    params = pd.DataFrame([p or {} for p in t["params"]], index=df.index)
    params.insert(0, "state", df["state"])
    params.insert(0, "trial", df["trial"])
    return pd.concat([df, objectives, rest], axis=1), params


def _rule(reason: str | None) -> str | None:
    """An invalid trial's reason starts with the rule it broke: ``memory-fit: …``."""
    head = (reason or "").split(":", 1)[0]
    return head if head and " " not in head else None


@st.cache_data(ttl=TTL_S, show_spinner=False)
def failures(url: str, name: str, stamp: Stamp) -> pd.DataFrame:
    rows = [
        {"trial": f.number, "state": f.state.value, "kind": f.failure_kind or _rule(f.reason), "reason": f.reason or "",
         "deployment": f.config_text or "", "log tail": f.log_tail or "", "finished": f.finished_at}
        for f in queries.failures(database(url), name)
    ]
    return pd.DataFrame(rows, columns=["trial", "state", "kind", "reason", "deployment", "log tail", "finished"])


@st.cache_data(ttl=TTL_S, show_spinner=False)
def history(url: str, name: str, stamp: Stamp) -> pd.DataFrame:
    rows = [{"trial": p.number, "state": p.state.value, "value": p.value, "feasible": p.feasible, "best": p.best}
            for p in queries.history(database(url), name)]
    return pd.DataFrame(rows, columns=["trial", "state", "value", "feasible", "best"])


@st.cache_data(ttl=TTL_S, show_spinner=False)
def trial(url: str, name: str, number: int, stamp: Stamp) -> db.Trial | None:
    """One trial with its measurements and exports (``queries.get_trial``)."""
    return queries.get_trial(database(url), name, number)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def topology_picture(url: str, name: str, number: int, stamp: Stamp) -> str | None:
    """A trial's topology as the static SVG the study page's headline shows (``trial_plots.topology_svg``), or
    None when the trial recorded none. Kept: building the figure costs a Plotly figure's validation on every
    load, before the page's first picture."""
    t = trial(url, name, number, stamp)
    if t is None or not t.topology:
        return None
    return trial_plots.topology_svg(trial_plots.topology_figure(t.topology, "router"))


@st.cache_data(ttl=TTL_S, show_spinner=False)
def running(url: str, name: str, stamp: Stamp) -> pd.DataFrame:
    rows = [{"trial": t.number, "deployment": t.config.short() if t.config else (t.config_text or ""),
             "worker": t.worker, "started": t.started_at, "heartbeat": t.heartbeat_at}
            for t in queries.list_trials(database(url), name, states=["running"])]
    return pd.DataFrame(rows, columns=["trial", "deployment", "worker", "started", "heartbeat"])
