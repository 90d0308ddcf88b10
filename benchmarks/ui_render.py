"""How long the dashboard's Study page takes: AppTest renders of a 2,000-trial study (goal: < 2 s) and, with
``--browser``, the first chart of a 200-trial study in headless Chromium (goal: <= 2 s, median of 3 loads).

Fills a SQLite database quickly — candidates proposed by an in-memory Optuna study (random sampler) over the
``gb300-rack-dsv3`` space, predicted by the simulated executor (3 load levels each), written through
``db.Database`` (a few invalid and failed trials too) and the Optuna trials copied into the same storage, as
the tuner leaves them — then times Streamlit AppTest runs of the Study page: the first run (cold caches: every
read and figure is computed) and the following runs (warm: what a reader waits for on every interaction and
live refresh), then opening the Parameters tab with importance turned on (a study this big computes it only
when asked).

``--browser`` fills a second database of ``--browser-trials`` trials and times real page loads in headless
Chromium against ``advisor dashboard``: from navigation until the first Plotly chart is drawn (the
recommendation's topology) and until the open tab's plot is (Convergence), then from a click on the Pareto tab
until its plot is drawn, ``--browser-loads`` times in one browser (the first load is a fresh browser's: nothing
cached). The machine's load average is recorded beside the numbers:
on a shared 2-core machine other work slows the browser more than anything on the page.
Prints a table and writes ``benchmarks/results/ui_render.json``.

    python benchmarks/ui_render.py [--trials 2000] [--runs 3] [--db PATH] [--browser] [--browser-trials 200]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import optuna

import db
from advisor.job import TuningJob, job_from_dict
from advisor.objectives import INFEASIBLE, objective_names, score, worst
from advisor.tune import CONFIG_KEY_ATTR, EXECUTED_ATTR, STATE_ATTR
from executors import place
from executors.simulated import SimulatedExecutor, default_params
from search_spaces import TrialState, check

GOAL_S = 2.0
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "ui_render.json"
STUDY = "ui-bench"
PRESET = "gb300-rack-dsv3"


def _job(trials: int) -> TuningJob:
    return job_from_dict({"name": STUDY, "preset": PRESET, "budget": {"trials": trials},
                          "objective": {"mode": "pareto"}, "sampler": {"kind": "random", "seed": 0}})


def fill(path: Path, trials: int, seed: int = 0) -> dict[str, Any]:
    """A study of ``trials`` measured trials (plus ~5 % invalid and ~2 % failed) in a new SQLite file."""
    path.unlink(missing_ok=True)
    url = f"sqlite:///{path}"
    job = _job(trials)
    model, cluster, wl = job.model_profile(), job.cluster, job.workload
    executor = SimulatedExecutor(model, default_params(cluster.gpu))
    rng = random.Random(seed)
    t0 = time.perf_counter()
    database = db.connect(url)
    database.upsert_study(STUDY, job.to_document(), description=f"{trials} simulated trials (benchmark)",
                          executor="simulated", engine_version=executor.engine_version,
                          hardware=cluster.describe(), optuna_study_name=STUDY)
    directions = ["maximize"] * len(objective_names(job))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mem = optuna.create_study(directions=directions, sampler=optuna.samplers.RandomSampler(seed=seed))
    seen: set[str] = set()
    executed = invalid = failed = 0
    while executed < trials:
        trial = mem.ask()
        cfg = job.space.suggest(trial)
        violations = check(cfg, model, cluster, wl.max_model_len)
        if violations or cfg.key() in seen:
            if violations and rng.random() < 0.05:  # keep a few invalid ones, as a real study has
                database.record_invalid(STUDY, trial.number, params=trial.params, config=cfg,
                                        reason="; ".join(map(str, violations)))
                _tell(mem, trial, cfg.key(), worst(job).values, INFEASIBLE, TrialState.INVALID, executed=False)
                invalid += 1
            else:
                mem.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        seen.add(cfg.key())
        topo = place(cfg, cluster)
        tid = database.start_trial(STUDY, trial.number, params=trial.params, config=cfg, topology=topo.to_dict(),
                                   worker="bench")
        run = executor.evaluate(topo, wl)
        if rng.random() < 0.02:  # a failed deployment: a reason, a log tail, no measurements
            database.finish_trial(tid, TrialState.FAILED, objectives=None, violation=INFEASIBLE,
                                  failure_kind="deploy_failed", reason="engine core died during start-up (benchmark)",
                                  log_tail="RuntimeError: CUDA error: out of memory\n" * 5)
            _tell(mem, trial, cfg.key(), worst(job).values, INFEASIBLE, TrialState.FAILED)
            failed += 1
        else:
            outcome = score(job, run.measurements)
            database.finish_trial(tid, TrialState.COMPLETE, measurements=run.measurements,
                                  timings={"deploy_s": 40.0, "warmup_s": 5.0, "measure_s": 120.0, "teardown_s": 3.0},
                                  objectives=outcome.as_dict(job), violation=outcome.violation)
            _tell(mem, trial, cfg.key(), outcome.values, outcome.violation, TrialState.COMPLETE)
        executed += 1
    db_s = time.perf_counter() - t0
    kept = [t for t in mem.get_trials(deepcopy=False) if t.state is optuna.trial.TrialState.COMPLETE]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        stored = optuna.create_study(storage=db.normalize_url(url), study_name=STUDY, directions=directions)
        stored.add_trials(kept)
    database.close()
    return {"trials": executed, "invalid": invalid, "failed": failed, "levels": executed * len(wl.load_levels),
            "fill_s": time.perf_counter() - t0, "db_write_s": db_s}


def _tell(study: optuna.Study, trial: optuna.Trial, key: str, values: list[float], violation: float,
          state: TrialState, executed: bool = True) -> None:
    """What the tuner records on the Optuna side (``advisor.tune._tell``), so importance sees the same."""
    trial.set_user_attr(STATE_ATTR, state.value)
    trial.set_user_attr(EXECUTED_ATTR, executed and state in (TrialState.COMPLETE, TrialState.FAILED))
    trial.set_user_attr(CONFIG_KEY_ATTR, key)
    trial.set_constraint("slo", violation)
    study.tell(trial, values)


def time_apptest(url: str, runs: int) -> tuple[list[float], float | None]:
    """Seconds per AppTest run of the Study page — the first run is cold (empty caches) — and then the seconds
    of turning parameter importance on (a 2,000-trial study computes it only when asked: a rerun that loads
    every trial from Optuna's storage; ``None`` when the page shows it at once)."""
    from streamlit.testing.v1 import AppTest

    os.environ["ADVISOR_STORAGE"] = url
    out = []
    at = None
    for _ in range(runs):
        at = AppTest.from_file(str(ROOT / "ui" / "app.py"), default_timeout=300)
        at.switch_page("views/study.py")
        at.query_params["study"] = STUDY
        t0 = time.perf_counter()
        at.run()
        out.append(time.perf_counter() - t0)
        _check(at)
    importance_s = None
    at = AppTest.from_file(str(ROOT / "ui" / "app.py"), default_timeout=300)
    at.switch_page("views/study.py")
    at.query_params["study"] = STUDY
    at.query_params["tab"] = "Parameters"
    at.run()
    _check(at)
    if not at.toggle(key="importance_on").value:
        t0 = time.perf_counter()
        at.toggle(key="importance_on").set_value(True).run()
        importance_s = time.perf_counter() - t0
        _check(at)
        if not any("get_param_importances" in c.value for c in at.caption):
            raise SystemExit("turning importance on did not show it")
    return out, importance_s


def _check(at: Any) -> None:
    if at.exception:
        raise SystemExit(f"the Study page raised: {at.exception[0].message}")


_DRAWN = """m => [...document.querySelectorAll('.js-plotly-plot')].some(el => el.layout && (m === '*' ||
    el.layout.meta === m))"""


def time_browser(url: str, loads: int = 3) -> list[dict[str, float]]:
    """Per page load: seconds from navigation until the first Plotly chart is drawn (``first_chart_s``) and
    until the open tab's plot is (``open_tab_s``: Convergence), then from a click on the Pareto tab until its
    plot is drawn (``pareto_click_s``), in headless Chromium against a real ``advisor dashboard``."""
    from playwright.sync_api import sync_playwright

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ADVISOR_STORAGE": url}
    proc = subprocess.Popen([sys.executable, "-m", "advisor", "dashboard", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    # the CLI names Streamlit's own process group on its first line: stopped below should the CLI die first
    server_group = int(m.group(1)) if (m := re.search(r"process group (\d+)", proc.stdout.readline())) else None
    out = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            deadline = time.monotonic() + 60
            while True:
                try:
                    page.goto(f"http://127.0.0.1:{port}/_stcore/health")
                    break
                except Exception:  # noqa: BLE001 — not listening yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.5)
            for _ in range(loads):
                page.goto("about:blank")
                t0 = time.perf_counter()
                page.goto(f"http://127.0.0.1:{port}/study?study={STUDY}")
                page.wait_for_function(_DRAWN, arg="*", timeout=300_000, polling=20)
                first = time.perf_counter() - t0
                page.wait_for_function(_DRAWN, arg="history", timeout=300_000, polling=20)
                open_tab = time.perf_counter() - t0
                load_avg = os.getloadavg()[0]
                t1 = time.perf_counter()
                page.get_by_role("tab", name="Pareto front").click()
                page.wait_for_function(_DRAWN, arg="pareto", timeout=300_000, polling=20)
                out.append({"first_chart_s": first, "open_tab_s": open_tab,
                            "pareto_click_s": time.perf_counter() - t1, "load_avg_1m": load_avg})
            browser.close()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        if server_group is not None:
            try:
                os.killpg(server_group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3, help="AppTest runs (the first is cold)")
    ap.add_argument("--db", type=Path, default=ROOT / "runs" / "ui_render.db",
                    help="the SQLite file to fill (reused with --reuse)")
    ap.add_argument("--reuse", action="store_true", help="keep existing databases of the same sizes")
    ap.add_argument("--browser", action="store_true", help="also time page loads in headless Chromium")
    ap.add_argument("--browser-trials", type=int, default=200, help="the study the browser opens")
    ap.add_argument("--browser-loads", type=int, default=3, help="page loads (the first in a fresh browser)")
    ap.add_argument("--skip-apptest", action="store_true", help="only the browser figure")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    args.db.parent.mkdir(parents=True, exist_ok=True)

    def filled(path: Path, trials: int) -> tuple[str, dict[str, Any]]:
        if args.reuse and path.exists():
            return f"sqlite:///{path}", {"trials": trials, "reused": True}
        info = fill(path, trials)
        print(f"filled {path}: {info['trials']} trials ({info['invalid']} invalid, {info['failed']} failed), "
              f"{info['levels']} load levels in {info['fill_s']:.1f} s")
        return f"sqlite:///{path}", info

    runs: list[float] = []
    importance_s = cold = warm = None
    info: dict[str, Any] = {}
    if not args.skip_apptest:
        url, info = filled(args.db, args.trials)
        runs, importance_s = time_apptest(url, args.runs)
        cold, warm = runs[0], (statistics.median(runs[1:]) if len(runs) > 1 else None)
    browser: list[dict[str, float]] = []
    browser_info: dict[str, Any] = {}
    if args.browser:
        small = args.db.with_name(f"{args.db.stem}-{args.browser_trials}{args.db.suffix}")
        burl, browser_info = filled(small, args.browser_trials)
        browser = time_browser(burl, args.browser_loads)
    first = [b["first_chart_s"] for b in browser]
    pareto = [b["pareto_click_s"] for b in browser]
    rows = [(f"AppTest {args.trials:,} trials, cold caches (first render)", cold),
            (f"AppTest {args.trials:,} trials, warm caches (median)", warm),
            ("AppTest, Parameters tab: turning importance on", importance_s)]
    if browser:
        rows += [(f"browser {args.browser_trials} trials → first chart (median of {len(first)})",
                  statistics.median(first)),
                 ("browser → first chart, fresh browser (load 1)", first[0]),
                 (f"browser → open tab's plot (median of {len(first)})",
                  statistics.median(b["open_tab_s"] for b in browser)),
                 (f"browser, click on the Pareto tab → its plot (median of {len(pareto)})",
                  statistics.median(pareto))]
    print(f"\nStudy page (goal <= {GOAL_S:g} s)")
    print(f"{'what':56} {'seconds':>8}")
    for what, secs in rows:
        print(f"{what:56} {'–' if secs is None else f'{secs:8.2f}':>8}")
    if browser:
        print("browser loads (first chart / open tab / Pareto after its click / 1-min load average): " + ", ".join(
            f"{b['first_chart_s']:.2f} / {b['open_tab_s']:.2f} / {b['pareto_click_s']:.2f} / {b['load_avg_1m']:.1f}"
            for b in browser))
    ok_apptest = cold is None or (cold < GOAL_S and (warm is None or warm < GOAL_S))
    ok_browser = not first or statistics.median(first) <= GOAL_S
    ok = ok_apptest and ok_browser
    print(f"goal: AppTest first render and warm ones < {GOAL_S:g} s: {'met' if ok_apptest else 'NOT met'}"
          + (f"; browser first chart median <= {GOAL_S:g} s: {'met' if ok_browser else 'NOT met'}" if first else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "goal_s": GOAL_S, "goal_met": ok, "trials": args.trials, "preset": PRESET, "fill": info,
        "apptest_runs_s": runs, "apptest_cold_s": cold, "apptest_warm_median_s": warm,
        "apptest_importance_on_s": importance_s,
        "browser_trials": args.browser_trials if browser else None, "browser_fill": browser_info,
        "browser_loads": browser,
        "browser_first_chart_median_s": statistics.median(first) if first else None,
        "browser_open_tab_median_s": statistics.median(b["open_tab_s"] for b in browser) if browser else None,
        "browser_pareto_click_median_s": statistics.median(pareto) if pareto else None,
        "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
