"""The measurement protocol on real deployments (CPU build of vLLM, the tiny dummy-weight MoE, vllm-router,
`vllm bench serve`, the local executor): knee search, warm-up, fresh prompts, intervals, the baseline of vLLM's
defaults, repeats, and a Pareto front made only of measured points. Nothing mocked.

The SLO is chosen from the deployment itself so that the knee lies between the two initial levels on any
machine: one deployment (max-num-seqs 4) is first measured at concurrency 1 and 8 — beyond 4 requests queue,
so the median E2E latency about doubles — and the SLO bound is the geometric mean of the two medians. That probe
(``evaluate_probe``, tests/shared_runs.py) runs right before the study, not earlier in the session: the speed of
a 2-core machine drifts, and in one CI run (4 Dec) the session's probe read 73 ms at c=1 and the study, minutes
later, 165 ms — every level missed the bound. One study then runs (about 7 minutes on 2 cores in CI): the
baseline, the search's one candidate, and both measured again; each trial is its knee search alone (no fixed
levels).

Why E2E and not TTFT: on this 2-core machine some CPU deployments deliver each response's tokens in one burst
for a minute or more (a level's TTFT then equals its E2E latency: ~80 ms at c=1 where ~10 ms is usual; see
docs/measurement.md, "Bursty delivery", and benchmarks/bench_client_bursts.py). In
one CI run (2 Dec) the c=1 median TTFT was 9.9 ms in the probe and 78 ms in the study, so a TTFT bound taken
from the probe failed every level of the study. Over 13 deployments measured here on 2 Dec, bursty or not,
the c=1 median E2E latency stayed within 74-86 ms and the c=8 one within 165-203 ms.

Every level's client is forked from one imported vLLM (``executors/bench_zygote.py``, the GPU platforms' client,
turned on here by ``DEPLOY_ADVISOR_BENCH_ZYGOTE=1``) for the probe and the study alike: a fresh `vllm bench serve`
per level spends ~7 s of the 2-core machine importing vLLM, and this study measures ~35 levels (426 s for the
module with it, 610 s without, one run each on the same machine). The CPU build's own client, a fresh command per
level, is what the other real tests run (tests/test_executors_real.py, tests/test_stop_real.py,
tests/test_tune_real.py).

The same study is also the crash-safety test with real child processes (it was tests/test_crash.py's own
2-trial study, two more vLLM cold starts): the first `advisor tune` is killed with SIGKILL once the baseline
is measured and the search trial is measuring — server, router and load generator running (the tuner only: they
run in process groups of their own and outlive it, as they would after an OOM-kill or a lost SSH session). The
next `advisor tune` on the study must mark that trial interrupted, stop every process of it — the router too,
which renamed itself (`vllm::router`) and so carries no environment mark —, and complete the study, with every
measurement written before the kill still there, once.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import db
from advisor.job import job_from_dict
from advisor.study import open_study
from advisor.tune import EXECUTED_ATTR
from db import queries
from executors.processes import procs
from tests.trial_processes import kill, still_running, trial_processes
from search_spaces import PREFIX_REUSE_LIMIT, TrialState
from tests.shared_runs import PROBE_JOB, evaluate_probe

pytestmark = [pytest.mark.vllm]

# the probe's job (tests/shared_runs.py) as a study: the same candidate and workload, searched for its knee. No
# fixed levels: the probe measured 1 and 8 already, and measuring them again in every trial (after its search,
# tests/test_measure.py) would cost two `vllm bench serve` runs per trial for nothing asserted here.
BASE = {
    **PROBE_JOB,
    "name": "knee",
    # 7 levels: where the unprofiled model starts the search at c=1 the ramp 1, 2, 3, 5, 8 takes five, and closing
    # [5, 8] to the tolerance two more (seen 4 Dec: 1, 2, 3, 5, 8, 6 and the bracket [6, 8] left open at 6 levels)
    "workload": {**PROBE_JOB["workload"], "load_levels": [], "knee_search": True, "max_levels": 7},
    "baseline": {"enabled": True},  # the preset is a quick look without them
    "sampler": {"kind": "grid", "seed": 0},
    "budget": {"trials": 1, "repeat_top": 1},
}


def advisor(*args: str, cwd: Path, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPLOY_ADVISOR_BENCH_ZYGOTE", "1")  # probe and study alike (the module's docstring says why)
        return _study(tmp_path_factory.mktemp("knee"))


def _study(work: Path) -> dict:
    run_dir = str(work / "runs")
    run, _ = evaluate_probe(work / "probe")  # the search's candidate at c=1 and c=8, just before the study
    assert run.ok, (run.reason, run.log_tail)
    # medians, not P90s: two hiccups in a 16-request level moved a P90 (see the module's docstring for E2E)
    e2e = {m.concurrency: m.p50_e2el_ms for m in run.measurements}
    assert e2e[8] > 1.5 * e2e[1], f"median E2E latency does not grow with queueing here: {e2e}"
    bound = math.sqrt(e2e[1] * e2e[8])
    job = {**BASE, "objective": {"mode": "pareto"},
           "slos": [{"metric": "p50_e2el_ms", "op": "<=", "value": round(bound, 1)}],
           "executor": {"kind": "local", "run_dir": run_dir, "timeouts": {"health_s": 240}}}
    (work / "job.yaml").write_text(json.dumps(job))
    url = f"sqlite:///{work / 'knee.db'}"
    crash = _kill_mid_trial(work, url)  # the first tuner: the baseline measured, SIGKILLed in the search trial
    try:
        t0 = time.monotonic()
        tuned = advisor("tune", "job.yaml", "--storage", url, cwd=work)  # the same command again: resumes
        crash["resume_s"] = time.monotonic() - t0
        trials = _trials(url)
    finally:
        crash["alive_after_resume"] = sorted(f"{pid} {shown}" for (pid, _), shown in
                                             still_running(crash["orphans"]).items())
        kill(crash["orphans"])  # a failed cleanup must not leave them to the next module
    return {"work": work, "url": url, "tuned": tuned, "trials": trials, "bound": bound, "probe": e2e,
            "job": job_from_dict(job), "crash": crash}


def _trials(url: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, "knee", t.number) for t in queries.list_trials(database, "knee")]
    finally:
        database.close()


def _kill_mid_trial(work: Path, url: str) -> dict:
    """Run `advisor tune` on the study until one trial is complete and the next one is measuring, then SIGKILL the
    tuner alone. Returns the killed trial, its processes (``trial_processes``) and what was measured."""
    tuner = procs.start([sys.executable, "-m", "advisor", "tune", "job.yaml", "--storage", url], name="tuner",
                        log_path=work / "tuner.log", cwd=work)
    try:
        deadline = time.monotonic() + 1200  # the baseline's knee search first: ~2 min alone on 2 cores
        while True:  # wait for: one trial complete, the next one measuring
            assert tuner.poll() is None, tuner.tail(40)
            assert time.monotonic() < deadline, tuner.tail(40)
            try:
                ts = _trials(url) if Path(url[len("sqlite:///"):]).exists() else []
            except db.UnknownStudy:  # the tuner has not created the study yet
                ts = []
            # measuring: the router is recorded and a level's load generator has started
            running = [t for t in ts if t.state is TrialState.RUNNING
                       and "router" in ((t.resources or {}).get("log_paths") or {})
                       and (t.resources or {}).get("bench_pgids")]
            if any(t.state is TrialState.COMPLETE for t in ts) and running:
                res = running[0].resources
                victim = running[0].number
                break
            time.sleep(1)
        tuner.popen.send_signal(signal.SIGKILL)  # the tuner alone, mid-trial
        tuner.popen.wait(timeout=30)
    finally:
        if tuner.poll() is None:
            procs.stop(tuner)
    before = {(t.number, m.concurrency): m.model_dump() for t in _trials(url) for m in t.measurements}
    return {"victim": victim, "before": before, "router": res["pgids"][-1],
            "orphans": trial_processes(res), "alive_after_kill": any(procs.group_alive(g) for g in res["pgids"])}


def _search_trial(study):
    done = [t for t in study["trials"] if t.proposer == "grid" and t.state is TrialState.COMPLETE]
    assert len(done) == 1, [(t.number, t.proposer, t.state, t.reason) for t in study["trials"]]
    return done[0]


def test_knee_is_bracketed_within_the_tolerance(study) -> None:
    assert study["tuned"].returncode == 0, study["tuned"].stdout + study["tuned"].stderr
    t = _search_trial(study)
    slo = study["job"].slos
    ok = sorted(m.concurrency for m in t.measurements if all(s.met(m) for s in slo))
    bad = sorted(m.concurrency for m in t.measurements if not all(s.met(m) for s in slo))
    knee = [m for m in t.measurements if m.purpose == "knee"]
    assert len(knee) == 1 and ok and bad, (study["probe"], [(m.concurrency, m.p50_e2el_ms, m.purpose)
                                                             for m in t.measurements])
    k = knee[0].concurrency
    assert k == max(ok)  # the knee is a measured level: the highest meeting the SLO
    above = min(c for c in bad if c > k)  # the level just outside, within the tolerance (or one step)
    assert above <= max(k * 1.15, k + 1), (k, above)
    assert 1 <= k < 8  # between the two initial levels (the SLO was chosen to put it there)
    assert len([m for m in t.measurements if m.purpose != "fixed"]) <= 6
    assert "bracket-open" not in knee[0].flags


def test_levels_use_fresh_prompts_and_carry_intervals(study) -> None:
    for t in study["trials"]:
        if t.state is not TrialState.COMPLETE or not t.measurements:
            continue
        seeds = [m.raw.get("seed") for m in t.measurements]
        assert len(set(seeds)) == len(seeds), seeds  # every level its own prompts
        for m in t.measurements:
            # read from the servers' /metrics over the level. Fresh prompts keep repeats out (the same seed
            # for every level read 93% on a GPU), and each level's seed is one whose prompts send no first KV
            # block sent before on the deployment (executors/measuring/prompt_seeds.py: on this 2,048-id tokenizer,
            # seeds taken as they were read up to 12% of a 16-prompt level)
            assert m.prefix_cache_hit_rate is not None and m.prefix_cache_hit_rate <= 0.01, m
            assert (m.prefix_cache_hit_rate > PREFIX_REUSE_LIMIT) == ("prefix-cache-reuse" in m.flags), m
            assert "counters-unknown" not in m.flags
            assert m.error_rate == 0.0
            lo, hi = m.intervals["p90_ttft_ms"]
            assert lo <= m.p90_ttft_ms <= hi or "remeasured" in m.flags
            assert m.intervals["throughput_per_gpu"][0] <= m.intervals["throughput_per_gpu"][1]
        assert t.warmup_s and t.warmup_s > 0


def test_baseline_and_repeats_are_measured(study) -> None:
    by = {t.proposer for t in study["trials"]}
    assert "baseline" in by and "repeat" in by, [(t.number, t.proposer) for t in study["trials"]]
    base = next(t for t in study["trials"] if t.proposer == "baseline")
    assert base.state is TrialState.COMPLETE and base.config is not None
    assert base.config.decode.max_num_seqs == 128 and base.config.decode.max_num_batched_tokens == 2048
    search = _search_trial(study)
    repeats = {t.repeat_of for t in study["trials"] if t.proposer == "repeat" and t.state is TrialState.COMPLETE}
    assert repeats == {base.number, search.number}
    best = advisor("best", "knee", "--storage", study["url"], cwd=study["work"])
    assert best.returncode == 0, best.stderr
    # the defaults weighed against the search whichever wins ("vs vLLM's defaults …" or "vLLM's defaults (…) are
    # the best measured deployment: …"), and the answer's trial named by every line (tests/test_answer.py)
    assert "run to run:" in best.stdout and "vLLM's defaults (trial " in best.stdout, best.stdout


def test_pareto_values_are_one_measured_level(study) -> None:
    """Optuna's values for every measured trial are the (x, y) of one stored level, and the study's front is
    made only of stored (trial, level) points."""
    job = study["job"]
    x, y = job.objective.metric, job.objective.pareto_y
    optuna_study = open_study(job, study["url"], "knee")
    assert optuna_study.metric_names == [x, y]
    levels = {(t.number, getattr(m, x), getattr(m, y)) for t in study["trials"] for m in t.measurements}
    for ft in optuna_study.get_trials(deepcopy=False):
        if ft.user_attrs.get(EXECUTED_ATTR) and ft.values and ft.values[0] > 0:
            assert (ft.number, ft.values[0], ft.values[1]) in levels, ft.values
    database = db.connect(study["url"])
    try:
        front = queries.pareto_front(database, "knee", x=x, y=y, slos=job.slos)
    finally:
        database.close()
    assert front
    for p in front:
        assert (p.trial_number, p.metric(x), p.metric(y)) in levels


def test_sigkill_mid_trial_then_resume(study) -> None:
    """Crash safety with real child processes (see the module's docstring): the resumed tuner closes the
    killed trial, stops its orphaned servers and completes the study; nothing measured is lost or doubled."""
    crash, tuned = study["crash"], study["tuned"]
    assert crash["before"], "no measurement was written before the kill"
    assert crash["alive_after_kill"], "the killed tuner's servers should still be running"
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    assert "closed 1 trial(s) left running by an earlier tuner" in tuned.stdout
    trials = study["trials"]
    interrupted = [t for t in trials if t.number == crash["victim"]]
    assert interrupted[0].state is TrialState.INTERRUPTED
    assert "stopped process group" in interrupted[0].reason
    assert crash["router"] in {pid for pid, _ in crash["orphans"]}, "the router was not running at the kill"
    assert crash["alive_after_resume"] == [], f"processes of the killed trial still run: {crash['alive_after_resume']}"
    complete = [t for t in trials if t.state is TrialState.COMPLETE]
    assert len(complete) == 4  # the study, completed: baseline, the search's candidate, both repeated
    after = [(t.number, m.concurrency) for t in trials for m in t.measurements]
    assert len(after) == len(set(after))  # nothing duplicated
    now = {(t.number, m.concurrency): m.model_dump() for t in trials for m in t.measurements}
    for key, m in crash["before"].items():  # nothing lost or changed
        assert now[key] == m
    print(f"resume after SIGKILL: {crash['resume_s']:.1f} s including three new trials")
