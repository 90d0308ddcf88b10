"""advisor's public API: what the CLI and the dashboard call. Reads go through ``db`` queries."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna

import db
from advisor.answer import Answer, best_text, operating_points, study_answer
from advisor.errors import BadInput
from advisor.exports import (
    FORMATS,
    Evidence,
    ExportOptions,
    ModelNeeded,
    Rendered,
    evidence_source,
    model_name,
    render_export,
    write_exports,
)
from advisor.job import ObjectiveMode, TuningJob, check_study_name, job_from_dict
from advisor.objectives import objective_names, operating_point, served_unit
from advisor.optuna_note import write_answer_note
from advisor.study import storage_for
from advisor.study_counts import Counts, budget_of
from advisor.tune import TrialReport, TuneSummary, tune
from advisor.verdict import Verdict, model_error, verdict, verdict_lines
from db import Best, queries, redact_url
from executors import Topology, place
from search_spaces import DeploymentConfig, Measurement, check, load_preset, preset_names

__all__ = [
    "Answer", "BestReport", "ExportProblem", "TrialReport", "TuneSummary", "answer", "best_report", "calibrate",
    "executed_trials", "export", "export_problem", "job_of_study", "preset_rows", "profile", "query",
    "query_catalog", "rendered_export", "run_tune",
    "simulate", "space_summary", "studies_table", "trials_table",
    "Verdict", "study_verdict", "verdict_lines", "verdict_of",
]



def run_tune(job: TuningJob, **kwargs: Any) -> TuneSummary:
    """``advisor.tune.tune``, then the answer written as the study's optuna-dashboard note
    (``advisor.optuna_note``): optuna-dashboard on the same database names the trial ``advisor best`` names."""
    summary = tune(job, **kwargs)
    note_answer(kwargs.get("storage") or job.storage, summary.study)
    return summary


def note_answer(url: str, study: str) -> str | None:
    """Write ``study``'s answer as its optuna-dashboard note; the note (None while there is no answer)."""
    database = _open(url)
    try:
        job = job_of_study(database, study)
        row = queries.get_study(database, study)
        name = row.optuna_study_name if row is not None and row.optuna_study_name else study
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna_study = optuna.load_study(study_name=name, storage=storage_for(url))
        return write_answer_note(database, study, job, optuna_study)
    finally:
        database.close()

#: Columns of the best/Pareto tables.
_METRIC_COLS = ["throughput_per_gpu", "p90_tokens_per_s_per_user", "p90_ttft_ms", "p90_tpot_ms"]


def _open(url: str) -> db.Database:
    """Open an existing results database for reading (a missing SQLite file is an error, not created)."""
    file = url[len("sqlite:///"):].split("?", 1)[0]  # the query (which may hold a secret) is no part of the path
    if url.startswith("sqlite:///") and file != ":memory:" and not Path(file).exists():
        raise BadInput(f"storage: no database at {file} (run `advisor tune` first, or pass --storage)")
    try:
        return db.connect(url)
    except db.DatabaseUnavailable as e:
        raise BadInput(f"storage: cannot open {redact_url(url)}: {e}") from None


def space_summary(job: TuningJob, limit: int = 250_000) -> dict[str, Any]:
    model, wl = job.model_profile(), job.workload
    broken: Counter[str] = Counter()
    n = valid = 0
    for _, cfg in job.space.enumerate():
        n += 1
        v = check(cfg, model, job.cluster, wl.max_model_len)
        if v:
            broken.update({x.rule for x in v})
        else:
            valid += 1
        if n >= limit:
            break
    return {"candidates": n, "valid": valid, "broken_rules": dict(broken), "truncated": n >= limit}


def job_of_study(database: db.Database, study: str) -> TuningJob:
    row = queries.get_study(database, check_study_name(study))
    if row is None:
        names = [s.name for s in queries.list_studies(database)]
        raise BadInput(f"study {study!r} is not in {database.url_for_display}; studies: {', '.join(names) or 'none'}")
    return job_from_dict(row.job, source=f"study {study!r}")


def profile(url: str, job: TuningJob, *, depths: list[int] | None = None, out: Path | None = None,
            on_level: Callable[[str], None] | None = None) -> Any:
    """``advisor profile``: measure the job's model shape on this machine's GPU kind and store the fitted model
    (``advisor.profile``)."""
    from advisor.profile import run_profile

    try:
        database = db.connect(url)  # created when missing: a profile may be the first thing a database holds
    except db.DatabaseUnavailable as e:
        raise BadInput(f"storage: cannot open {redact_url(url)}: {e}") from None
    try:
        return run_profile(job, database, depths=depths, out=out, on_level=on_level)
    finally:
        database.close()


def calibrate(url: str, studies: list[str], *, out: Path, folds: int | None = None, seed: int = 0,
              names: list[str] | None = None, models: dict[str, str] | None = None,
              external: list[str] | None = None, gpu: str | None = None) -> Any:
    """``advisor calibrate``: fit the performance model to the studies' measured trials and to the imported points
    of the batches ``external`` (on GPU kind ``gpu`` where given); write the fitted parameters to ``out`` (what a
    job's ``executor.perf_params`` loads) and the report beside it.

    ``models`` maps a model folder's name to where it is on this machine, for studies measured elsewhere."""
    import json

    from advisor.calibrate import calibrate as fit
    from advisor.calibrate import measured_samples
    from advisor.external import external_samples

    database = _open(url)
    try:
        samples, left = external_samples(database, external or [], gpu) if external else ([], [])
        for study in studies:
            row = queries.get_study(database, check_study_name(study))
            if row is None:
                job_of_study(database, study)  # the one-line error naming the studies there are
            doc = dict(row.job)
            path = (doc.get("model") or {}).get("path")
            if path and models and Path(path).name in models:
                doc["model"] = {**doc["model"], "path": models[Path(path).name]}
            job = job_from_dict(doc, source=f"study {study!r}")
            samples += measured_samples(database, study, job)
        cal = fit(samples, folds=folds, seed=seed, names=names)
        cal.left_out = [f"{p.source} (c={p.concurrency}): {why}" for p, why in left]
    finally:
        database.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    cal.params.save(out)
    out.with_suffix(".report.json").write_text(json.dumps(cal.to_dict(), indent=2) + "\n")
    return cal


def import_points(url: str, points: list[Any], batch: str) -> tuple[int, int]:
    """``advisor import``: store operating points read from files as the external measurements of ``batch``, in one
    transaction: (added, already stored)."""
    from advisor.external import import_points as store

    try:  # created where it does not exist yet: importing may be the first thing a user does
        database = db.connect(url)
    except db.DatabaseUnavailable as e:
        raise BadInput(f"storage: cannot open {redact_url(url)}: {e}") from None
    try:
        return store(database, points, batch)
    finally:
        database.close()


def executed_trials(job: TuningJob, url: str, study: str | None) -> int:
    """Trials of this study the budget counts (``db.budget``; 0 for a new study or database), for the progress bar."""
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):].split("?", 1)[0]).exists():
        try:
            db.require_folder(url)  # a new file is fine, a folder that is not there is a mistyped URL
        except ValueError as e:
            raise BadInput(f"storage: {e}") from None
        return 0
    database = _open(url)
    try:
        name = check_study_name(study, "--study") if study is not None else job.name
        s = queries.get_study(database, name)
        return 0 if s is None else s.budget_used
    finally:
        database.close()


def query_catalog() -> list[list[str]]:
    return [[q.name, q.usage(), q.help] for q in queries.NAMED_QUERIES.values()]


def query(url: str, name: str, args: list[str]) -> tuple[list[str], list[list[Any]]]:
    """Run a named query; arguments are ``VALUE`` (in declared order) or ``KEY=VALUE`` strings."""
    database = _open(url)
    try:
        return queries.run_query(database, name, args)
    except queries.QueryError as e:
        raise BadInput(str(e)) from None
    finally:
        database.close()


def cleanup(url: str, study: str, *, stale_after_s: float, ray_address: str | None) -> list[tuple[int, list[str]]]:
    """``advisor cleanup``: close the study's trials whose tuner died, stopping what they left running.

    (trial number, action lines) per closed trial; the lines are ``cleanup_resources``'s, those about a node
    start with ``node <IP>: ``. Needs the Ray cluster (``ray_address``, else the one each trial recorded) to
    reach the processes of other nodes.
    """
    from advisor.recovery import close_interrupted, tell_closed
    from advisor.study import open_study

    database = _open(url)
    try:
        job = job_of_study(database, study)  # the one-line error for an unknown study
        closed = close_interrupted(database, study, stale_after_s=stale_after_s, ray_address=ray_address)
        tell_closed(job, database, open_study(job, url, study), study)  # Optuna's trials closed too, not RUNNING
        return closed
    finally:
        database.close()


def studies_table(url: str) -> tuple[list[str], list[list[Any]]]:
    """The compact view `advisor studies` prints (the named query `studies` has every column)."""
    database = _open(url)
    try:
        cols = ["study", "executor", "hardware", "state", "trials", "best", "best trial"]
        rows = []
        for s in queries.list_studies(database):
            counts = Counts.of(s, budget_of(s.job))
            rows.append([s.name, s.executor, s.hardware, counts.state(), counts.text(),
                         best_text(s.best, s.best_objective, s.best_runs), s.best_trial])
        return cols, rows
    finally:
        database.close()


def trials_table(url: str, study: str, state: str | None = None) -> tuple[list[str], list[list[Any]]]:
    """The compact view `advisor trials` prints: one line a trial, timings per phase."""
    database = _open(url)
    try:
        job = job_of_study(database, study)
        names = objective_names(job)
        try:
            trials = queries.list_trials(database, study, states=[state] if state else None)
        except ValueError as e:
            raise BadInput(f"--state: {e}") from None
        levels: dict[int, list[Measurement]] = {}
        for lv in queries.measurements(database, study):
            levels.setdefault(lv.trial_number, []).append(lv.measurement)
        cols = ["trial", "state", "by", "gpus", "deployment", "at", "levels", *names, "predicted", "SLO violation",
                "flags", "deploy s", "warm-up s", "measure s", "teardown s", "reason"]
        rows = []
        first = names[0]
        for t in trials:
            obj = t.objectives or {}
            reason = (t.reason or "").replace("\n", " ")
            ms = levels.get(t.number, [])
            point, _ = operating_point(job, ms)
            flags = sorted({f for m in ms for f in m.flags})
            by = f"{t.proposer} of {t.repeat_of}" if t.repeat_of is not None else t.proposer
            state = "failed: environment" if t.failure_kind == "environment" else t.state.value
            rows.append([t.number, state, by, t.gpus, t.config.short() if t.config else t.config_text,
                         point.label() if point is not None and t.objectives else None, len(ms) or None,
                         *(obj.get(n) for n in names), (t.predicted or {}).get(first), t.violation,
                         ", ".join(flags) or None, t.deploy_s, t.warmup_s, t.measure_s,
                         t.teardown_s, reason[:90] + ("…" if len(reason) > 90 else "")])
        return cols, rows
    finally:
        database.close()


def model_error_text(url: str, study: str) -> str | None:
    """The performance model's out-of-sample error on the study, in words (None before any prediction)."""
    database = _open(url)
    try:
        job = job_of_study(database, study)
        err, n = model_error(queries.list_trials(database, study), job)
    finally:
        database.close()
    if err is None:
        return None
    return (f"performance model: {err:.0%} mean |predicted / measured − 1| on the last {n} trial(s), each predicted "
            f"before it ran (column 'predicted'); model turns yield to the sampler above 30%")


@dataclass
class BestReport:
    title: str
    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    best_text: str = ""
    empty_reason: str = ""
    notes: list[str] = field(default_factory=list)  # spread, gain over the baseline, ties, cluster, model error


def best_report(url: str, study: str, top: int = 10) -> BestReport:
    database = _open(url)
    try:
        job = job_of_study(database, study)
        slos = list(job.slos)
        slo_text = ", ".join(map(str, slos)) or "no SLOs"
        cols = ["trial", "level", "tok/s/GPU", "P90 tok/s/user", "P90 TTFT ms", "P90 TPOT ms", "GPUs",
                "deployment"]
        configs: dict[int, DeploymentConfig | None] = {}

        def row(p: Any) -> list[Any]:
            if p.trial_number not in configs:
                t = queries.get_trial(database, study, p.trial_number)
                configs[p.trial_number] = t.config if t else None
            cfg = configs[p.trial_number]
            return [p.trial_number, p.measurement.label(), *(getattr(p, c) for c in _METRIC_COLS), p.gpus,
                    cfg.short() if cfg else p.config_text]

        ans = study_answer(database, study, job)
        if job.objective.mode is ObjectiveMode.PARETO:
            pts = queries.pareto_front(database, study, x=job.objective.metric, y=job.objective.pareto_y, slos=slos)
            rep = BestReport(f"Pareto front of {study} ({job.objective.metric} × {job.objective.pareto_y}, "
                             f"points meeting {slo_text})", cols, [row(p) for p in pts[:top]])
        else:  # the answer at its operating point: the level its objective (and the progress bar) came from
            rep = BestReport(f"best {job.objective.metric} of {study} under {slo_text} (each trial at its "
                             f"operating point)", cols, [row(Best(ans.first, ans.point))] if ans else [])
        if ans is not None:
            who = " (vLLM's defaults, the best measured deployment)" if ans.is_baseline else ""
            rep.best_text = f"trial {ans.trial}{who} at {ans.point.label()}: {ans.first.config_text}"
            if ans.copies > 1:  # the tiled layout: what to run on the whole cluster
                rep.best_text += (f"; run {ans.copies} copies on the cluster's {job.cluster.total_gpus} GPUs" +
                                  (f" ({ans.served:,.0f} {served_unit(objective_names(job)[0])} together at "
                                   f"the SLOs)" if ans.served is not None else ""))
        if not rep.rows:
            rep.empty_reason = f"no measured load level of {study} meets {slo_text} yet"
        rep.notes = study_verdict(database, study, job).lines()
        if ans is not None and ans.equal_load is not None:
            line = ans.equal_load.text(ans.trial, objective_names(job)[0])
            rep.notes += [f"vs vLLM's defaults {line}"] if line else []
        return rep
    finally:
        database.close()


def study_verdict(database: db.Database, study: str, job: TuningJob) -> Verdict:
    """What ``advisor best`` says under its table (``advisor.verdict``), each run with its load: the one source
    of the dashboard's headline too."""
    return verdict(job, queries.list_trials(database, study), operating_points(database, study, job))


def verdict_of(url: str, study: str) -> Verdict:
    """``study_verdict`` of a study in the database at ``url``."""
    database = _open(url)
    try:
        return study_verdict(database, study, job_of_study(database, study))
    finally:
        database.close()


def answer(url: str, study: str) -> Answer | None:
    """The study's answer (``advisor.answer``): what ``advisor best`` and the dashboard recommend."""
    database = _open(url)
    try:
        return study_answer(database, study, job_of_study(database, study))
    finally:
        database.close()


def _trial_topology(database: db.Database, study: str, job: TuningJob, t: db.Trial,
                    cfg: DeploymentConfig) -> tuple[Topology, bool]:
    """Where the trial ran: its stored topology (a reused trial's: that of the trial whose measurements it
    reuses), so an export renders what was measured even where today's ``place`` would pack it otherwise. A
    trial with none (a database from before topologies were stored) is placed now, and the second value says so."""
    doc = t.topology
    if not doc and t.reused_from is not None:
        source = queries.get_trial(database, study, t.reused_from)
        doc = source.topology if source is not None and source.config == cfg else None
    if not doc:
        return place(cfg, job.cluster), True
    try:
        return Topology.from_dict(doc, cfg), False
    except ValueError as e:
        raise BadInput(f"--trial: trial {t.number}'s stored topology is {e}") from None


def _export_subject(database: db.Database, study: str, trial: int | None) -> tuple[TuningJob, Topology,
                                                                                   Evidence, int]:
    """The job, placed configuration (as the trial stored it) and evidence of the trial an export is of
    (``trial``, else the study's answer)."""
    job = job_of_study(database, study)
    if trial is None:
        ans = study_answer(database, study, job)
        if ans is None:
            raise BadInput(f"study {study!r} has no trial meeting its SLOs yet; pass --trial N")
        trial = ans.trial
    t = queries.get_trial(database, study, trial)
    if t is None or t.config is None:
        raise BadInput(f"--trial: study {study!r} has no trial {trial} with a configuration")
    if t.state != "complete":
        raise BadInput(f"--trial: trial {trial} is {t.state}, not complete; export a complete trial")
    topo, placed_now = _trial_topology(database, study, job, t, t.config)
    info = queries.get_study(database, study)
    ev = Evidence(study, trial, evidence_source(job), info.engine_version or "unknown",
                  info.hardware or job.cluster.describe(), list(t.measurements), placed_now=placed_now,
                  slos=tuple(job.slos))
    return job, topo, ev, t.id


def _formats(fmt: str) -> tuple[str, ...]:
    formats = FORMATS if fmt == "all" else (fmt,)
    for f in formats:
        if f not in FORMATS:
            raise BadInput(f"--format: {f!r} is not a format; allowed: {', '.join(FORMATS)}, all")
    return formats


def export(url: str, study: str, *, fmt: str, trial: int | None, out: Path, model: str | None,
           options: ExportOptions | None = None) -> list[Path]:
    """``advisor export``: write the formats under ``out`` and record each export (path and digest)."""
    formats = _formats(fmt)
    database = _open(url)
    try:
        job, topo, ev, trial_id = _export_subject(database, study, trial)
        written = write_exports(job, topo, ev, formats, out, model, options)  # all or nothing, then recorded
        for f, (path, sha) in zip(formats, written, strict=True):
            database.record_export(trial_id, f, str(path), sha)
        return [path for path, _ in written]
    finally:
        database.close()


def rendered_export(url: str, study: str, *, fmt: str, trial: int | None, model: str | None = None,
                    options: ExportOptions | None = None) -> Rendered:
    """One format of a trial's export, in memory: what ``export`` would write, with nothing written or recorded
    (the dashboard's downloads; a read-only dashboard writes nothing)."""
    (f,) = _formats(fmt)
    database = _open(url)
    try:
        job, topo, ev, _ = _export_subject(database, study, trial)
        return render_export(job, topo, ev, f, model, options)
    finally:
        database.close()


@dataclass(frozen=True)
class ExportProblem:
    """Why a trial cannot be exported as asked: the line ``advisor export`` would print, and whether what is
    missing is the model every node loads (``--model``), which the asker can supply."""

    reason: str
    needs_model: bool = False


def export_problem(url: str, study: str, *, trial: int, model: str | None = None) -> ExportProblem | None:
    """What would stop ``rendered_export`` of ``trial`` (None: nothing), found without rendering anything, so a
    page can say it — and ask for the model — before offering a download."""
    try:
        database = _open(url)
    except BadInput as e:
        return ExportProblem(str(e))
    try:
        job, _, _, _ = _export_subject(database, study, trial)
        model_name(job, model)
    except ModelNeeded as e:
        return ExportProblem(str(e), needs_model=True)
    except BadInput as e:
        return ExportProblem(str(e))
    finally:
        database.close()
    return None


def simulate(job: TuningJob, cfg: DeploymentConfig) -> tuple[str, list[str], list[list[Any]]]:
    from executors.simulated.executor import SimulatedExecutor, default_params

    violations = check(cfg, job.model_profile(), job.cluster, job.workload.max_model_len)
    if violations:
        raise BadInput("configuration breaks " + "; ".join(map(str, violations)))
    topo = place(cfg, job.cluster)
    ex = SimulatedExecutor(job.model_profile(), default_params(job.cluster.gpu))
    run = ex.evaluate(topo, job.workload)
    cols = ["concurrency", *_METRIC_COLS, "p50_ttft_ms", "dp_imbalance"]
    rows = [[m.concurrency, *(getattr(m, c) for c in cols[1:])] for m in run.measurements]
    return topo.describe(), cols, rows


def preset_rows() -> list[list[str]]:
    return [[n, load_preset(n).get("description", "")] for n in preset_names()]

