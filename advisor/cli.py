"""``advisor``: the headless front end. Every command either works or says in one line what is wrong
(exit code 2), never a traceback. ``advisor tune`` exits 3 when it stopped because the cluster kept failing
(the environment, not the job: fix it and run the same command again), and when the database stayed unreachable
past its retry window (``db.DatabaseOutage``: nothing is lost, run the same command again once it is back). A
command stopped by Ctrl-C exits 130, by SIGTERM 143, after one line saying so and what the stop left."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import typer
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from advisor.cli_output import RowFormat, RowFormatOpt, console, err, print_rows, routing_lines
from advisor.dashboard_server import serve_dashboard
from advisor.errors import BadInput, EnvironmentFailed
from advisor.executor_factory import make_executor
from advisor.job import DEFAULT_STORAGE, MAX_TRIALS, ExecutorKind, TuningJob, check_study_name, load_job
from advisor.space_report import SpaceReport, require_valid_candidates
from db import DatabaseOutage, redact_url
from executors import Executor
from executors.processes.procs import interrupt_of
from search_spaces import TrialState
from search_spaces.workload import routing_label


def _lazy(name: str) -> Any:
    """The module ``name``, executed on first attribute access (``importlib.util.LazyLoader``): ``advisor.api``
    imports Optuna and SQLAlchemy, which a command rejecting its input never needs (about 1.5 s of a CLI start)."""
    import importlib.util

    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.loader is not None, name
    loader = importlib.util.LazyLoader(spec.loader)
    spec.loader = loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    setattr(sys.modules[parent], child, module)  # as an import binds it (``import advisor.api`` reads it there)
    loader.exec_module(module)
    return module


api = _lazy("advisor.api")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Find the best vLLM deployment of a MoE model: search, measure, store, export.")
#: Tables stay readable when piped: Rich would otherwise fold every column to fit 80 characters.
F = TypeVar("F", bound=Callable[..., Any])
#: ``advisor tune`` stopped because the environment kept failing, or the database stayed unreachable (not bad
#: input: 2 is for that).
EXIT_ENVIRONMENT = 3
#: Stopped by Ctrl-C (128 + SIGINT) or by SIGTERM (128 + SIGTERM), as a shell reports a process a signal ended.
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143
#: What a command stopped by a signal leaves, said on its last line.
STOP_HINTS = {
    "tune": "the trial in flight is kept, marked interrupted, with the levels it measured; its processes are "
            "stopped; run the same command again to continue the study",
}

StorageOpt = Annotated[str | None, typer.Option("--storage", help="Database URL (default: $ADVISOR_STORAGE or "
                                                f"{DEFAULT_STORAGE}).", show_default=False)]


def _storage(url: str | None) -> str:
    return _existing_folder(url or os.environ.get("ADVISOR_STORAGE") or DEFAULT_STORAGE)


def _job_storage(url: str | None, job: TuningJob) -> str:
    """``--storage``, else the job file's ``storage``, else ``$ADVISOR_STORAGE``, else the default."""
    return _existing_folder(url or (job.storage if "storage" in job.model_fields_set else _storage(None)))


def _existing_folder(url: str) -> str:
    """``url``, once its SQLite file's folder is known to exist (one line, exit 2, nothing created, when not)."""
    from db import require_folder

    try:
        require_folder(url)
    except ValueError as e:
        raise BadInput(f"storage: {e}") from None
    return url


JobStorageOpt = Annotated[str | None, typer.Option(
    "--storage", help=f"Database URL (default: the job's storage, else $ADVISOR_STORAGE, else {DEFAULT_STORAGE}).",
    show_default=False)]


def friendly(fn: F) -> F:
    """Bad input → one line on stderr and exit 2; a database outage past its retry window, or a profile whose
    deployment failed → one line, exit 3."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except BadInput as e:
            err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except (DatabaseOutage, EnvironmentFailed) as e:
            err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(EXIT_ENVIRONMENT) from None
        except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (``terminate_as_interrupt``), after every teardown ran
            _say_stopped(fn.__name__, e)
        except Exception as e:  # a stop that landed inside a pydantic dump (``interrupt_of``); anything else goes on
            if (stop := interrupt_of(e)) is None:
                raise
            _say_stopped(fn.__name__, stop)

    return wrapper  # type: ignore[return-value]


def _say_stopped(command: str, e: KeyboardInterrupt) -> NoReturn:
    term = "SIGTERM" in str(e)
    hint = f": {STOP_HINTS[command]}" if command in STOP_HINTS else ""
    err.print(f"error: stopped by {'SIGTERM' if term else 'Ctrl-C'}{hint}", markup=False, highlight=False,
              soft_wrap=True)
    raise typer.Exit(EXIT_TERMINATED if term else EXIT_INTERRUPTED) from None


# ----------------------------------------------------------------------------------------------- jobs
def _levels_text(job: Any) -> str:
    wl = job.workload
    fixed = f"{len(wl.load_levels)} fixed load level{'s' if len(wl.load_levels) != 1 else ''}"
    if wl.knee_search and any(s.metric != "error_rate" for s in job.slos):
        return (f"knee search by {wl.load_by} (≤ {wl.max_levels} levels, tolerance {wl.knee_tolerance:.0%}, "
                f"≤ {wl.max_load:g}) + {fixed}")
    return fixed


@app.command()
@friendly
def validate(job_file: Annotated[Path, typer.Argument(help="The job YAML.")],
             show: Annotated[bool, typer.Option("--show", help="Also print the resolved job (preset merged, "
                                                "defaults filled in, passwords redacted) and its search space.")]
             = False) -> None:
    """Check a job file and its search space; write nothing. Exit 2 when no candidate of the space is valid."""
    job = load_job(job_file)
    info = require_valid_candidates(job, str(job_file))
    if show:
        doc = job.to_document()
        sys.stdout.write(f"# {job_file}, resolved: preset merged key by key (nested mappings deeply), defaults "
                         f"filled in\n")
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120,
                                        default_flow_style=None))
        wl = job.workload
        turns = f") × {wl.turns} turns" if wl.dataset.value == "agentic" else ")"
        sys.stdout.write(f"# derived: workload.max_model_len = {wl.max_model_len} "
                         f"(isl.max {wl.isl.max} + osl.max {wl.osl.max}{turns}\n")
        sys.stdout.write("# space: each dimension's choices\n")
        for name, choices in info.dims.items():
            sys.stdout.write(f"#   {name}: {', '.join(map(str, choices))}\n")
        sys.stdout.flush()
    more = " (enumeration stopped there)" if info.truncated else ""
    console.print(f"[green]ok[/] {job_file}: study {job.name!r}, {job.model_profile().name} on "
                  f"{job.cluster.describe()}; {info.candidates:,} candidates{more}, {info.valid:,} valid, "
                  f"{_levels_text(job)}, executor {job.executor.kind.value}")
    for rule, n in sorted(info.broken.items(), key=lambda kv: -kv[1]):
        console.print(f"  {n:>9,} candidates break {rule}")
    _space_warnings(info, job.budget.trials)


def _space_warnings(info: SpaceReport, budget: int) -> None:
    sys.stdout.flush()
    for line in info.warnings(budget):
        err.print(f"warning: {line}", markup=False, highlight=False, soft_wrap=True)


@app.command()
@friendly
def tune(
    job_file: Annotated[Path, typer.Argument(help="The job YAML.")],
    trials: Annotated[int | None, typer.Option(min=1, max=MAX_TRIALS, help="Total executed trials of the study.")]
    = None,
    executor: Annotated[ExecutorKind | None, typer.Option(help="Override the job's executor.")] = None,
    storage: JobStorageOpt = None,
    study: Annotated[str | None, typer.Option(help="Study name (default: the job's name).")] = None,
    ray_address: Annotated[str | None, typer.Option(help="Connect to this Ray cluster.")] = None,
    wall_time: Annotated[float | None, typer.Option(
        min=1, help="End this run by this many seconds: no trial starts that its median trial would not finish in "
                    "time, and a trial still measuring then stops before its next level (its levels kept, marked "
                    "interrupted). A later run continues the study.")] = None,
) -> None:
    """Run (or continue) a tuning study, then print the best deployments."""
    if study is not None:
        check_study_name(study, "--study")
    job = load_job(job_file)
    if wall_time is not None:
        job = job.model_copy(update={"budget": job.budget.model_copy(update={"wall_time_s": wall_time})})
    if executor is not None:
        job = job.model_copy(update={"executor": job.executor.model_copy(update={"kind": executor})})
    info = require_valid_candidates(job, job_file)  # a space with nothing to run: one line, exit 2
    url = _job_storage(storage, job)
    budget = trials or job.budget.trials
    best: dict[str, Any] = {"text": "–"}
    # the executor first: bad executor input, or a Ray cluster that cannot run the job, is one line before any
    # progress bar (and before anything is written)
    ex = make_executor(job, ray_address=ray_address)
    try:
        summary = _tune_with_progress(job, ex, url, study, budget, best, ray_address, info)
    finally:
        ex.close()
    _tune_summary(summary, url)


def _tune_with_progress(job: TuningJob, ex: Executor, url: str, study: str | None, budget: int,
                        best: dict[str, Any], ray_address: str | None, info: SpaceReport) -> api.TuneSummary:
    ran = api.executed_trials(job, url, study)  # the storage answers before anything else is said
    console.print(f"{job.name}: {info.valid:,} valid of {info.candidates:,} candidates", highlight=False)
    if (label := routing_label(job.workload)) and job.executor.kind is ExecutorKind.SIMULATED:
        console.print(f"workload.expert_routing {job.workload.expert_routing}: the performance model does not model "
                      "routing skew; predictions are for the model's own routing", markup=False, highlight=False)
    elif label:
        console.print(f"{label} on every server (vLLM's routing simulator: timings, not valid text)",
                      markup=False, highlight=False)
    _space_warnings(info, budget)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[best]}"), console=console, transient=False) as progress:
        task = progress.add_task(f"tuning {study or job.name}", total=budget, best="")

        def on_trial(r: api.TrialReport) -> None:
            if r.note:  # now, flushed: a trial may run for minutes after it (a retry on a fresh placement)
                progress.console.print(r.note, markup=False, highlight=False, soft_wrap=True)
                sys.stdout.flush()
            if r.state is TrialState.RUNNING:  # the note was all
                return
            if r.state is TrialState.FAILED and r.reason:  # why, now: not only a count in the summary at the end
                reason = " ".join(r.reason.split())
                progress.console.print(f"trial {r.number} failed: {reason[:300]}{'…' if len(reason) > 300 else ''}",
                                       markup=False, highlight=False, soft_wrap=True)
            if r.outcome is not None and r.outcome.feasible and r.outcome.values[0] > best.get("value", -1):
                best["value"] = r.outcome.values[0]
                # the best single run so far, said as such: the answer (repeats, the spread, ties with the
                # defaults) is `advisor best`'s, printed at the end, and may name another trial
                best["text"] = f"best run so far {r.outcome.values[0]:,.0f} {job.objective.metric} (trial {r.number})"
            progress.update(task, completed=min(budget, done[0] + (1 if r.executed else 0)), best=best["text"])
            if r.executed:
                done[0] += 1

        done = [ran]
        progress.update(task, completed=done[0])
        return api.run_tune(job, trials=budget, storage=url, study_name=study, on_trial=on_trial,
                            ray_address=ray_address, executor=ex)


def _tune_summary(summary: api.TuneSummary, url: str) -> None:
    extra = ""
    env = (f", {summary.environment_failed} failed twice for the environment (not counted)"
           if summary.environment_failed else "")
    if summary.baseline is not None:
        extra += f", vLLM's defaults measured as trial {summary.baseline}"
    if summary.repeated:
        extra += f", {len(summary.repeated)} deployment(s) measured again ({', '.join(map(str, summary.repeated))})"
    console.print(f"study {summary.study!r} in {summary.storage}: {summary.executed} trials run this time "
                  f"({summary.failed} failed){env}, {summary.invalid} invalid candidates skipped, {summary.repeats} "
                  f"repeats reused{extra}; {summary.stopped_because}")
    if summary.interrupted_found:
        console.print(f"closed {summary.interrupted_found} trial(s) left running by an earlier tuner")
    if summary.profiled:
        console.print(f"profiled this GPU first: {summary.profiled}", markup=False, highlight=False)
    if summary.model_params:
        console.print(f"model: {summary.model_params} (the knee searches' starts and the guide rest on it)",
                      markup=False, highlight=False)
    _best(summary.study, url, top=10)
    if summary.environment_broken:
        err.print(f"error: {summary.stopped_because}", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_ENVIRONMENT)


# ----------------------------------------------------------------------------------------------- results
@app.command()
@friendly
def studies(storage: StorageOpt = None,
            fmt: RowFormatOpt = RowFormat.TABLE) -> None:
    """Every study in the database with its progress and best result."""
    url = _storage(storage)
    cols, rows = api.query(url, "studies", []) if fmt != "table" else api.studies_table(url)
    print_rows(f"studies in {redact_url(_storage(storage))}", cols, rows, fmt)


@app.command()
@friendly
def trials(study: str, storage: StorageOpt = None,
           state: Annotated[str | None, typer.Option(help="Only this state (complete, failed, invalid…).")] = None,
           fmt: RowFormatOpt = RowFormat.TABLE) -> None:
    """The trials of a study: configuration, state, objective, timings, reason."""
    url = _storage(storage)
    if fmt == "table":
        cols, rows = api.trials_table(url, study, state)
    else:
        cols, rows = api.query(url, "trials", [study, *([f"states={state}"] if state else [])])
    print_rows(f"trials of {study}", cols, rows, fmt)
    if fmt == "table":
        for line in routing_lines(url, study):
            console.print(line, markup=False, highlight=False)
    if fmt == "table" and (text := api.model_error_text(url, study)):
        console.print(text)


def _best(study: str, url: str, top: int) -> None:
    report = api.best_report(url, study, top=top)
    console.print(f"[bold]{report.title}[/]")
    if not report.rows:
        console.print(report.empty_reason)
        return
    print_rows("", report.columns, report.rows)
    if report.best_text:
        console.print(f"[green]best:[/] {report.best_text}")
    for line in routing_lines(url, study):
        console.print(line, markup=False, highlight=False)
    for line in report.notes:
        console.print(line)


@app.command()
@friendly
def best(study: str, storage: StorageOpt = None,
         top: Annotated[int, typer.Option(min=1, help="Rows to show.")] = 10) -> None:
    """The Pareto front (pareto studies) or the best deployment under the SLOs, in words."""
    _best(study, _storage(storage), top)


@app.command()
@friendly
def export(
    study: str,
    fmt: Annotated[str, typer.Option("--format", help="vllm|json|k8s|ray-serve|all")] = "vllm",
    trial: Annotated[int | None, typer.Option(help="Trial number (default: the best).")] = None,
    out: Annotated[Path, typer.Option(help="Folder to write into.")] = Path("export"),
    model: Annotated[str | None, typer.Option(help="Model path or hub id to put in the commands.")] = None,
    image: Annotated[str, typer.Option(help="Container image (k8s).")] = "vllm/vllm-openai:latest",
    router_image: Annotated[str | None, typer.Option(help="Image with vllm-router on PATH (k8s).")] = None,
    hf_token_secret: Annotated[str, typer.Option(help="Kubernetes Secret holding HF_TOKEN (k8s).")] = "hf-token",
    storage: StorageOpt = None,
) -> None:
    """Write the ready-to-run configuration of a trial (launch script, JSON, Kubernetes, Ray Serve)."""
    from advisor.exports import ExportOptions

    opts = ExportOptions(image=image, router_image=router_image, hf_token_secret=hf_token_secret)
    paths = api.export(_storage(storage), study, fmt=fmt, trial=trial, out=out, model=model, options=opts)
    for p in paths:
        console.print(f"wrote {p}")


@app.command()
@friendly
def profile(
    job_file: Annotated[Path, typer.Argument(help="The job YAML (local or ray executor: real vLLM).")],
    depths: Annotated[str | None, typer.Option(help="Comma-separated layer counts to deploy (default: two that "
                                                    "fit one GPU, from the model's size).")] = None,
    out: Annotated[Path | None, typer.Option(help="Also write the fitted parameters here (a parameter file, "
                                                  "with its report beside it).")] = None,
    storage: JobStorageOpt = None,
) -> None:
    """Measure the job's model shape on this machine's GPU (two reduced depths, prefill and decode probes with
    vllm bench serve), fit the performance model to it and store the profile: later studies of the same shape
    on the same GPU kind start from it."""
    from advisor.calibrate import metric_headers
    from advisor.profile import plan_profile

    job = load_job(job_file)
    try:
        ds = [int(d) for d in depths.split(",") if d.strip()] if depths else None
    except ValueError:
        raise BadInput(f"--depths: {depths!r} is not a comma-separated list of layer counts (e.g. 2,8)") from None
    plan = plan_profile(job, ds)
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task("profile", total=plan.levels)

        def step(text: str) -> None:
            bar.update(task, description=f"profile: {text}", advance=0 if text.endswith("deploying") else 1)

        res = api.profile(_job_storage(storage, job), job, depths=ds, out=out, on_level=step)
    cal = res.calibration
    console.print(f"stored {res.profile.label}: {job.model_profile().name} shape {res.profile.shape_key} at "
                  f"depths {', '.join(map(str, plan.depths))}; {res.levels} levels in {res.wall_s:.0f} s "
                  f"(deploy {' + '.join(f'{x:.0f}' for x in res.deploy_s)} s); fitted with each level predicted "
                  f"{res.profile.report.get('level_model', 'steady')}", markup=False, highlight=False)
    if resumed := res.profile.report.get("resumed_from"):
        console.print(f"resumed: {len(resumed)} deployment(s) were measured by an unfinished profile before (their "
                      "deploy and measuring times are theirs)", markup=False, highlight=False)
    rows = [[f"{part.replace('_', ' ')}, {when}", errs[part].levels,
             *(f"{x:.1%}" if x is not None else None for x in errs[part].row())]
            for part in ("in_sample", "held_out") if part in cal.after
            for when, errs in (("default", cal.before), ("profiled", cal.after))]
    print_rows("", ["levels", "n", "all", *metric_headers()], rows)
    print_rows("", ["parameter", "default", "fitted"],
               [[n, f"{a:.4g}", f"{b:.4g}"] for n, (a, b) in cal.changes.items() if abs(b - a) > 1e-3 * abs(a) + 1e-12])
    if out is not None:
        console.print(f"wrote {out} and {out.with_suffix('.report.json')}")


@app.command()
@friendly
def calibrate(
    studies: Annotated[list[str] | None, typer.Argument(help="Studies whose measured trials to fit (one GPU "
                                                             "kind).")] = None,
    external: Annotated[list[str] | None, typer.Option(help="Also fit the points of this import batch "
                                                            "(`advisor import --label`; repeatable).")] = None,
    gpu: Annotated[str | None, typer.Option(help="Only the imported points on this GPU kind.")] = None,
    out: Annotated[Path, typer.Option(help="Where the fitted parameters go (a job's executor.perf_params).")]
    = Path("perf-params.json"),
    folds: Annotated[int | None, typer.Option(min=2, help="Cross-validation folds (default: leave one trial out "
                                                          "up to 10 trials, else 5).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the fold assignment.")] = 0,
    params: Annotated[str | None, typer.Option(help="Comma-separated parameters to fit (default: every one the "
                                                    "data moves).")] = None,
    model: Annotated[list[str] | None, typer.Option(help="A study's model folder on this machine, if the study "
                                                         "ran elsewhere (matched by folder name; repeatable).")] = None,
    storage: StorageOpt = None,
) -> None:
    """Fit the performance model's efficiency parameters to measured trials; report cross-validated error."""
    from advisor.calibrate import metric_headers

    if not studies and not external:
        raise BadInput("calibrate: name the studies to fit, or an imported batch with --external")
    names = [n.strip() for n in params.split(",") if n.strip()] if params else None
    models = {Path(m).name: m for m in model or []}
    with console.status("fitting the performance model to the measured trials"):
        cal = api.calibrate(_storage(storage), studies or [], out=out, folds=folds, seed=seed, names=names,
                            models=models, external=external or [], gpu=gpu)
    what = "measured trials and imported points" if external else "measured trials"
    console.print(f"{len(cal.trials)} {what} on {cal.gpu}; median |predicted / measured − 1| of "
                  f"throughput and P50 latencies (held out: {cal.folds}-fold cross-validation by trial):")
    if cal.left_out:
        console.print(f"{len(cal.left_out)} imported point(s) left out, the model cannot describe them; the first: "
                      f"{cal.left_out[0]}", markup=False, highlight=False, soft_wrap=True)
    rows = [[f"{part.replace('_', ' ')}, {when}", errs[part].levels,
             *(f"{x:.1%}" if x is not None else None for x in errs[part].row()),
             f"{errs[part].rms_log:.3g}" if errs[part].rms_log is not None else None]
            for part in ("in_sample", "held_out") if part in cal.after
            for when, errs in (("default", cal.before), ("calibrated", cal.after))]
    print_rows("", ["levels", "n", "all", *metric_headers(), "rms log (fitted)"], rows)
    print_rows("", ["parameter", "default", "fitted"],
                [[n, f"{a:.4g}", f"{b:.4g}"] for n, (a, b) in cal.changes.items()
                 if abs(b - a) > 1e-3 * abs(a) + 1e-12])
    console.print(f"wrote {out} (use it as executor.perf_params) and {out.with_suffix('.report.json')}")


@app.command("import")
@friendly
def import_(
    files: Annotated[list[Path], typer.Argument(help="Published tables (.csv, the columns of shared/published's) "
                                                     "and `vllm bench serve --save-result` files (.json).")],
    label: Annotated[str | None, typer.Option(help="The import batch's label, what `advisor calibrate --external` "
                                                   "names (default: the first file's name without its suffix).")]
    = None,
    config: Annotated[Path | None, typer.Option(help="The deployment the .json results measured (a DeploymentConfig "
                                                     "YAML or JSON, as `advisor simulate --config` reads).")] = None,
    job: Annotated[Path | None, typer.Option(help="The job that ran them: its model, GPU kind and workload.")]
    = None,
    model: Annotated[str | None, typer.Option(help="Without --job: the model preset (or model folder) they "
                                                   "served.")] = None,
    gpu: Annotated[str | None, typer.Option(help="Without --job: the GPU kind they ran on.")] = None,
    engine_version: Annotated[str, typer.Option(help="The vLLM version that served the .json results.")] = "",
    storage: StorageOpt = None,
) -> None:
    """Import operating points measured elsewhere (published tables, your own `vllm bench serve` results) as
    external measurements with their source: evidence for `advisor calibrate --external`, never trials. Importing
    the same points again adds nothing."""
    from advisor.external import check_batch, read_files

    batch = check_batch(label if label is not None else files[0].stem)
    bench = _bench_deployment(config, job, model, gpu, engine_version) if config or job or model or gpu else None
    read = read_files(files, bench)
    url = _storage(storage)
    added, already = api.import_points(url, read.points, batch)
    console.print(f"batch {batch!r} in {redact_url(url)}: {added} point(s) added, {already} already stored, "
                  f"{len(read.skipped)} row(s) skipped", markup=False, highlight=False)
    for path, skip in read.skipped[:10]:
        console.print(f"  skipped {path.name} line {skip.line}: {skip.reason}", markup=False, highlight=False,
                      soft_wrap=True)
    if len(read.skipped) > 10:
        console.print(f"  … and {len(read.skipped) - 10} more", markup=False, highlight=False)


def _bench_deployment(config: Path | None, job_file: Path | None, model: str | None, gpu: str | None,
                      engine_version: str) -> Any:
    """What produced the .json results: --config with --job, or with --model and --gpu (one line if not)."""
    from advisor.external import BenchDeployment, read_deployment
    from search_spaces import GPU_TABLE, MODEL_PRESETS

    if config is None:
        raise BadInput("--config: the deployment the .json results measured is needed with --job, --model or --gpu")
    cfg = read_deployment(config)
    if job_file is not None:
        if model is not None or gpu is not None:
            raise BadInput("--job names the model and GPU kind; give --model and --gpu only without --job")
        return BenchDeployment.of_job(cfg, load_job(job_file), engine_version)
    if model is None or gpu is None:
        raise BadInput("--model and --gpu: with --config and no --job, name the model preset and the GPU kind")
    if gpu not in GPU_TABLE:
        raise BadInput(f"--gpu: unknown GPU kind {gpu!r}; allowed: {', '.join(GPU_TABLE)}")
    if model not in MODEL_PRESETS:
        folder = Path(model).expanduser().resolve()
        if not (folder.is_file() or (folder / "config.json").is_file()):
            raise BadInput(f"--model: {model!r} is neither a model preset nor a model folder with a config.json; "
                           f"presets: {', '.join(MODEL_PRESETS)}")
        model = str(folder)
    return BenchDeployment(config=cfg, model=model, gpu=gpu, engine_version=engine_version)


@app.command()
@friendly
def cleanup(
    study: str,
    storage: StorageOpt = None,
    stale_after: Annotated[float, typer.Option(min=0, help="Seconds without a heartbeat that make a trial stale.")]
    = 60.0,
    ray_address: Annotated[str | None, typer.Option(
        help="Ray cluster of the trials' nodes and placement groups (default: the one each trial recorded).")]
    = None,
) -> None:
    """Close trials whose tuner died and stop what they left running (process groups on every recorded node,
    their engine processes whose leader died, KV files, placement groups). `advisor tune` does the same when it
    resumes a study."""
    closed = api.cleanup(_storage(storage), study, stale_after_s=stale_after, ray_address=ray_address)
    if not closed:
        console.print(f"study {study!r}: no running trial without a live tuner")
    for number, actions in closed:
        console.print(f"trial {number}: interrupted; "
                      + ("what it left running:" if actions else "nothing left running"))
        for line in actions:  # one a line, each naming its node: which host still needs a look is plain
            console.print(f"  {line}", markup=False, highlight=False, soft_wrap=True)


@app.command()
@friendly
def query(
    name: Annotated[str, typer.Argument(help="A named query (`advisor query list` shows them).")],
    args: Annotated[list[str] | None, typer.Argument(help="VALUE or KEY=VALUE arguments.")] = None,
    storage: StorageOpt = None,
    fmt: RowFormatOpt = RowFormat.TABLE,
) -> None:
    """Run a named query on the results database (named queries only, never raw SQL)."""
    if name == "list":
        print_rows("named queries", ["name", "arguments", "help"], api.query_catalog())
        return
    cols, rows = api.query(_storage(storage), name, args or [])
    print_rows(name, cols, rows, fmt)


@app.command()
@friendly
def simulate(job_file: Path, config: Annotated[Path, typer.Option(help="A DeploymentConfig YAML.")]) -> None:
    """Predict one configuration with the performance model (no database)."""
    from advisor.external import read_deployment

    job = load_job(job_file)
    cfg = read_deployment(config)
    text, cols, rows = api.simulate(job, cfg)
    console.print(text)
    print_rows("predicted", cols, rows)


@app.command()
def presets() -> None:
    """The search-space presets shipped with the project."""
    print_rows("presets", ["name", "description"], api.preset_rows())


@app.command()
@friendly
def dashboard(
    storage: StorageOpt = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to serve on.")] = 8501,
    host: Annotated[str, typer.Option(help="Address to bind; 127.0.0.1 keeps it on this machine.")] = "127.0.0.1",
    allow_new_studies: Annotated[bool, typer.Option(
        "--allow-new-studies", help="Let the dashboard start studies (read-only without).")] = False,
) -> None:
    """Serve the Streamlit dashboard (ui/) on HOST:PORT until Ctrl-C; read-only unless --allow-new-studies."""
    serve_dashboard(_storage(storage), port=port, host=host, allow_new_studies=allow_new_studies,
                    console=console, err=err)

def main() -> None:
    """The console script: Click's usage errors also become one line and exit 2."""
    # Typer vendors Click; its UsageError (BadParameter's base) is not re-exported under a public name.
    usage_error = typer.BadParameter.__mro__[1]
    from executors.processes.procs import terminate_as_interrupt

    terminate_as_interrupt()
    try:
        rv = app(prog_name="advisor", standalone_mode=False)
    except usage_error as e:  # type: ignore[misc]
        ctx = getattr(e, "ctx", None)
        if not e.format_message().strip():  # `advisor` alone: Click printed the help already
            sys.exit(0 if type(e).__name__ == "NoArgsIsHelpError" else 2)
        where = f"advisor {ctx.info_name}" if ctx is not None and ctx.parent is not None else "advisor"
        msg = e.format_message().splitlines()[0]
        err.print(f"error: {msg} (see '{where} --help')", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except typer.Abort:
        err.print("error: aborted", markup=False)
        sys.exit(130)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)
