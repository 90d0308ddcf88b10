"""How long the dashboard's Study page takes: AppTest renders of a 2,000-trial study (goal: < 2 s) and, with
``--browser``, the first chart of a 200-trial study in headless Chromium (goal: <= 2 s, median of 3 loads).

Fills a SQLite database quickly — candidates proposed by an in-memory Optuna study (random sampler) over the
``gb300-rack-dsv3`` space, predicted by the simulated executor (3 load levels each), written through
``db.Database`` (a few invalid and failed trials too) and the Optuna trials copied into the same storage, as
the tuner leaves them — then times Streamlit AppTest runs of the Study page: the first run (cold caches: every
read and figure is computed) and the following runs (warm: what a reader waits for on every interaction and
live refresh), then opening the Parameters tab with importance turned on (a study this big computes it only
when asked).

``--browser`` fills a second database of ``--browser-trials`` trials and, on it and on the real H200 study r7
(``tests/data``), starts ``advisor dashboard`` and ``optuna-dashboard`` on the same database and loads each
study's page ``--browser-loads`` times in headless Chromium, alternating which goes first, each load in a fresh
browser context (nothing cached): from navigation until the first Plotly chart is drawn and until the answer's
text is shown (our headline, optuna-dashboard's best-trial card), measured inside the page from its time origin.
Prints the medians and both answers' texts. The machine's load average is recorded beside the numbers: on a
shared 2-core machine other work slows the browser more than anything on the page.
Prints a table and writes ``benchmarks/results/ui_render.json``.

    python benchmarks/ui_render.py [--trials 2000] [--runs 3] [--db PATH] [--browser] [--browser-trials 200]
        [--browser-loads 5] [--skip-apptest]
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
from executors.simulated.executor import SimulatedExecutor, default_params
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


#: The first chart either dashboard draws: a Plotly figure with its layout (optuna-dashboard's plots, ours), or our
#: headline's static topology picture (an image, inline in the headline's Markdown, or an ``st.image``) once loaded.
_ANY_CHART = ("() => [...document.querySelectorAll('.js-plotly-plot')]"
              ".some(el => el.layout && el.data && el.data.length) || "
              "[...document.querySelectorAll('[class*=st-key-rec_topology] img, [data-testid^=stImage] img')]"
              ".some(i => i.complete && i.naturalWidth)")
#: The answer's text: our headline ("Run trial N …"), optuna-dashboard's best-trial card.
_OUR_ANSWER = ("() => [...document.querySelectorAll('h4')].map(e => e.innerText)"
               ".find(t => t.startsWith('Run trial'))")
_THEIR_ANSWER = """() => { if (!document.body) return undefined; const t = document.body.innerText;
    const m = t.match(/Best Trial \\(number=\\d+\\)\\n[^\\n]+/) || t.match(/Best Trials\\nTrial \\d+\\n+[^\\n]+/);
    return m ? m[0].replace(/\\s+/g, ' ') : undefined; }"""


#: Polls every 10 ms from the page's start and records when the first chart and the answer's text appeared.
_WATCH = """window.__t = {};
const __tick = () => { const t = window.__t;
  try { if (!t.chart && (CHART)()) t.chart = performance.now(); } catch (e) {}
  try { if (!t.answer) { const a = (ANSWER)(); if (a) { t.answer = performance.now(); t.text = a; } } } catch (e) {}
  if (!(t.chart && t.answer)) setTimeout(__tick, 10); };
setTimeout(__tick, 0);"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_up(url: str, deadline_s: float = 90) -> None:
    import urllib.request

    deadline = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _stop(proc: subprocess.Popen[Any], signum: int = signal.SIGINT) -> None:
    """Stop a server started in a process group of its own, by that group."""
    try:
        os.killpg(proc.pid, signum)
        proc.wait(timeout=20)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def _real_study(folder: Path) -> tuple[str, str] | None:
    """The real H200 study r7 (``tests/data``'s copy, as ``tests.r7_study`` unpacks it) in ``folder``; None where
    this checkout has no copy."""
    try:
        sys.path.insert(0, str(ROOT))
        from tests import r7_study
    except ImportError:
        return None
    if not r7_study.DATABASE.exists():
        return None
    out = folder / "ui_render-r7"
    out.mkdir(parents=True, exist_ok=True)
    return r7_study.unpack(out), r7_study.STUDY


def compare_dashboards(url: str, study: str, loads: int = 5) -> dict[str, Any]:
    """Both dashboards on the same database, in one headless Chromium, each load in a fresh context (nothing
    cached), alternating which goes first: seconds from navigation to the first chart drawn and to the answer's
    text shown, and that text, per load; and the medians."""
    from playwright.sync_api import sync_playwright

    ours_port, theirs_port = _free_port(), _free_port()
    ours = subprocess.Popen([sys.executable, "-m", "advisor", "dashboard", "--storage", url, "--host", "127.0.0.1",
                             "--port", str(ours_port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)
    server_group = int(m.group(1)) if (m := re.search(r"process group (\d+)", ours.stdout.readline())) else None
    theirs = subprocess.Popen([str(Path(sys.executable).with_name("optuna-dashboard")), db.normalize_url(url),
                               "--host", "127.0.0.1", "--port", str(theirs_port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        storage = optuna.storages.RDBStorage(db.normalize_url(url))
        study_id = storage.get_study_id_from_name(study)
    pages = {"ours": (f"http://127.0.0.1:{ours_port}/study?study={study}", _OUR_ANSWER),
             "optuna-dashboard": (f"http://127.0.0.1:{theirs_port}/dashboard/studies/{study_id}", _THEIR_ANSWER)}
    out: dict[str, list[dict[str, Any]]] = {k: [] for k in pages}
    try:
        _wait_up(f"http://127.0.0.1:{ours_port}/_stcore/health")
        _wait_up(f"http://127.0.0.1:{theirs_port}/api/meta")
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=[
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run"])
            for k in range(loads):
                for who in (list(pages) if k % 2 == 0 else list(pages)[::-1]):
                    link, answer_js = pages[who]
                    context = browser.new_context(viewport={"width": 1400, "height": 1000})
                    # in the page, from its time origin (the navigation's start): when each first held
                    context.add_init_script(_WATCH.replace("CHART", _ANY_CHART).replace("ANSWER", answer_js))
                    page = context.new_page()
                    page.goto(link)
                    page.wait_for_function("() => window.__t && window.__t.chart && window.__t.answer",
                                           timeout=300_000, polling=50)
                    t = page.evaluate("() => window.__t")
                    out[who].append({"first_chart_s": t["chart"] / 1000, "answer_s": t["answer"] / 1000,
                                     "answer": t["text"], "load_avg_1m": os.getloadavg()[0]})
                    context.close()
            browser.close()
    finally:
        _stop(ours)
        _stop(theirs)
        if server_group is not None:
            try:
                os.killpg(server_group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    med = {who: {"first_chart_s": statistics.median(r["first_chart_s"] for r in rows),
                 "answer_s": statistics.median(r["answer_s"] for r in rows), "answer": rows[-1]["answer"]}
           for who, rows in out.items()}
    return {"url": url, "study": study, "loads": out, "median": med}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--runs", type=int, default=3, help="AppTest runs (the first is cold)")
    ap.add_argument("--db", type=Path, default=ROOT / "runs" / "ui_render.db",
                    help="the SQLite file to fill (reused with --reuse)")
    ap.add_argument("--reuse", action="store_true", help="keep existing databases of the same sizes")
    ap.add_argument("--browser", action="store_true",
                    help="also time page loads of this dashboard and optuna-dashboard in headless Chromium")
    ap.add_argument("--browser-trials", type=int, default=200, help="the study the browser opens")
    ap.add_argument("--browser-loads", type=int, default=5, help="page loads of each dashboard, alternating")
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
    compared: list[dict[str, Any]] = []
    browser_info: dict[str, Any] = {}
    if args.browser:
        small = args.db.with_name(f"{args.db.stem}-{args.browser_trials}{args.db.suffix}")
        burl, browser_info = filled(small, args.browser_trials)
        compared.append(compare_dashboards(burl, STUDY, args.browser_loads))
        real = _real_study(args.db.parent)
        if real is not None:
            compared.append(compare_dashboards(*real, args.browser_loads))
    rows = [(f"AppTest {args.trials:,} trials, cold caches (first render)", cold),
            (f"AppTest {args.trials:,} trials, warm caches (median)", warm),
            ("AppTest, Parameters tab: turning importance on", importance_s)]
    print(f"\nStudy page (goal <= {GOAL_S:g} s)")
    print(f"{'what':56} {'seconds':>8}")
    for what, secs in rows:
        print(f"{what:56} {'–' if secs is None else f'{secs:8.2f}':>8}")
    ok_browser = True
    for c in compared:
        ours, theirs = c["median"]["ours"], c["median"]["optuna-dashboard"]
        n = len(c["loads"]["ours"])
        print(f"\n{c['study']} ({c['url']}), both dashboards, fresh browser context per load, alternating, "
              f"median of {n}:")
        print(f"  first chart: ours {ours['first_chart_s']:.2f} s, optuna-dashboard {theirs['first_chart_s']:.2f} s "
              f"({ours['first_chart_s'] / theirs['first_chart_s']:.2f}×)")
        print(f"  answer text: ours {ours['answer_s']:.2f} s, optuna-dashboard {theirs['answer_s']:.2f} s "
              f"({ours['answer_s'] / theirs['answer_s']:.2f}×)")
        print(f"  ours: {ours['answer']!r}")
        print(f"  optuna-dashboard: {theirs['answer']!r}")
        print("  loads (ours first chart / optuna-dashboard's): " + ", ".join(
            f"{a['first_chart_s']:.2f} / {b['first_chart_s']:.2f}"
            for a, b in zip(c["loads"]["ours"], c["loads"]["optuna-dashboard"], strict=True)))
        ok_browser = ok_browser and ours["first_chart_s"] <= theirs["first_chart_s"]
    ok_apptest = cold is None or (cold < GOAL_S and (warm is None or warm < GOAL_S))
    ok = ok_apptest and ok_browser
    print(f"goal: AppTest first render and warm ones < {GOAL_S:g} s: {'met' if ok_apptest else 'NOT met'}"
          + (f"; first chart no later than optuna-dashboard's: {'met' if ok_browser else 'NOT met'}"
             if compared else ""))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "goal_s": GOAL_S, "goal_met": ok, "trials": args.trials, "preset": PRESET, "fill": info,
        "apptest_runs_s": runs, "apptest_cold_s": cold, "apptest_warm_median_s": warm,
        "apptest_importance_on_s": importance_s,
        "browser_trials": args.browser_trials if compared else None, "browser_fill": browser_info,
        "dashboards": compared,
        "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
