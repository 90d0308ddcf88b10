"""`advisor tune` end to end on real deployments: the Ray executor on a local Ray cluster, the CPU build of
vLLM serving the tiny dummy-weight MoE, vllm-router, `vllm bench serve`. Nothing mocked.

One module-scoped study (about 5 minutes on 2 cores): a first run whose servers get a broken flag (the trial
must FAIL with vLLM's own error line), then the same study continued with the grid of the cpu-tiny-moe preset
— aggregated and 1 prefill + 1 decode, max-num-seqs 4 and 16 — each measured at 2 load levels.

The study's workload routes tokens with a Zipf skew (``expert_routing: zipf``, issue #18): every server runs
vLLM's routing simulator with the ``zipf_1.1`` strategy our vLLM plugin registers, and every level stores it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import db
from db import queries
from executors.processes import procs
from executors.ray.cluster import NO_DRAIN
from search_spaces import Mode, TrialState

pytestmark = [pytest.mark.vllm, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[1]


def advisor(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "advisor", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def _ray_port() -> int:
    """A free port outside Ray's worker port range (10002–19999)."""
    import socket

    for port in range(26379, 26479):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise RuntimeError("no free port for the Ray head")


@pytest.fixture(scope="module")
def ray_head(tmp_path_factory):
    """A Ray head we own (its own process group), with 2 logical GPUs for the 2 CPU slots."""
    port = _ray_port()
    tmp = tmp_path_factory.mktemp("ray")
    env = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **NO_DRAIN}  # stops in seconds, not 30
    # the levels' client forks from one imported vLLM on the node's agent, as on the GPU hosts (the CPU build's
    # fresh command per level is test_executors_real's and test_stop_real's): ~8 s of import saved per level
    env["DEPLOY_ADVISOR_BENCH_ZYGOTE"] = "1"
    ray_bin = str(Path(sys.executable).with_name("ray"))
    proc = procs.start([ray_bin, "start", "--head", "--block", f"--port={port}", "--num-cpus=2", "--num-gpus=2",
                        "--include-dashboard=false", f"--temp-dir={tmp / 't'}", "--node-ip-address=127.0.0.1"],
                       name="ray-head", log_path=tmp / "ray.log", env=env)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while "Ray runtime started" not in proc.tail(200):
        if proc.poll() is not None or time.monotonic() > deadline:
            procs.stop(proc)
            pytest.fail(f"ray head did not start:\n{proc.tail(40)}")
        time.sleep(1)
    os.environ["RAY_AUTH_MODE"] = "disabled"
    yield address
    procs.stop(proc, term_timeout=30)


@pytest.fixture(scope="module")
def study(tmp_path_factory, ray_head):
    work = tmp_path_factory.mktemp("study")
    url = f"sqlite:///{work / 'real.db'}"
    # the fixed levels only, no baseline, no repeats: this study is about the Ray path (tests/test_knee_real.py
    # covers the measurement protocol)
    base = {"name": "real", "preset": "cpu-tiny-moe", "sampler": {"kind": "grid", "seed": 0},
            "workload": {"knee_search": False, "expert_routing": "zipf"}, "baseline": {"enabled": False},
            "budget": {"repeat_top": 0},
            "executor": {"kind": "ray", "run_dir": str(work / "runs"), "timeouts": {"health_s": 240}}}
    broken = json.loads(json.dumps(base))
    broken["executor"]["extra_serve_args"] = ["--max-num-seqs", "notanumber"]
    (work / "broken.yaml").write_text(json.dumps(broken))
    (work / "job.yaml").write_text(json.dumps(base))
    t0 = time.monotonic()
    first = advisor("tune", "broken.yaml", "--trials", "1", "--storage", url, "--ray-address", ray_head, cwd=work)
    broken_s = time.monotonic() - t0
    t1 = time.monotonic()
    second = advisor("tune", "job.yaml", "--trials", "4", "--storage", url, "--ray-address", ray_head, cwd=work,
                     timeout=1800)  # a hang guard: 4 trials take ~4 min alone on 2 cores, far longer beside other work
    print(f"broken run {broken_s:.0f} s, 4 trials {time.monotonic() - t1:.0f} s")
    return {"work": work, "url": url, "first": first, "second": second, "broken_s": broken_s, "ray": ray_head}


def _trials(url: str) -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, "real", t.number) for t in queries.list_trials(database, "real")]
    finally:
        database.close()


def test_broken_flag_fails_with_vllms_own_error_then_the_study_goes_on(study) -> None:
    assert study["first"].returncode == 0, study["first"].stderr
    trials = _trials(study["url"])
    failed = [t for t in trials if t.state is TrialState.FAILED]
    assert len(failed) == 1, [(t.number, t.state, t.reason) for t in trials]
    assert "invalid int value: 'notanumber'" in failed[0].reason
    assert failed[0].failure_kind == "start"
    assert failed[0].log_tail
    assert study["broken_s"] < 240  # well within the health timeout
    assert any(t.state is TrialState.COMPLETE and t.number > failed[0].number for t in trials)


def test_real_trials_cover_aggregated_and_pd_at_two_levels(study) -> None:
    assert study["second"].returncode == 0, study["second"].stdout + study["second"].stderr
    done = [t for t in _trials(study["url"]) if t.state is TrialState.COMPLETE]
    assert len(done) >= 3
    modes = {t.config.mode for t in done}
    assert modes == {Mode.AGGREGATED, Mode.DISAGGREGATED}
    assert {t.config.decode.max_num_seqs for t in done} == {4, 16}
    for t in done:
        assert [m.concurrency for m in t.measurements] == [1, 4]
        assert all(m.source == "measured" and m.completed > 0 and m.throughput_per_gpu for m in t.measurements)
        assert t.deploy_s and t.measure_s and t.teardown_s is not None
        if t.config.mode is Mode.DISAGGREGATED:  # KV really went from prefill to decode through the router
            assert all((m.kv_transfer_tokens or 0) > 0 for m in t.measurements), t.measurements


def test_nothing_is_left_running(study) -> None:
    import ray

    pgids = {g for t in _trials(study["url"]) for g in ((t.resources or {}).get("pgids") or [])}
    pgids |= {p["pgid"] for t in _trials(study["url"]) for p in ((t.resources or {}).get("processes") or [])
              if p.get("pgid")}
    assert pgids
    for g in pgids:
        assert not procs.group_alive(g), f"process group {g} outlived its trial"
    ray.init(address=study["ray"], log_to_driver=False)
    try:
        table = ray.util.placement_group_table()
        assert table, "the study created no placement group"
        assert all(pg["state"] == "REMOVED" for pg in table.values()), table
    finally:
        ray.shutdown()


def test_best_and_export_on_the_real_study_and_the_launch_script_runs(study) -> None:
    work, url = study["work"], study["url"]
    best = advisor("best", "real", "--storage", url, cwd=work)
    assert best.returncode == 0 and "best:" in best.stdout, best.stdout + best.stderr
    assert "simulated routing: zipf 1.1" in best.stdout, best.stdout  # the numbers say what traffic they saw
    out = work / "export"
    exp = advisor("export", "real", "--format", "all", "--out", str(out), "--storage", url, cwd=work)
    assert exp.returncode == 0, exp.stderr
    doc = json.loads((out / "deployment.json").read_text())
    assert doc["evidence"]["source"] == "measured"
    script = (out / "launch.sh").read_text()
    # run the exported script by hand: the same deployment comes up behind the router
    router_port = int(shlex.split(script.strip().splitlines()[-1])[shlex.split(script.strip().splitlines()[-1])
                                                                      .index("--port") + 1])
    # from the export folder (the script's server logs land beside it), with the checkout importable: the CPU
    # platform's engine command is `python -m executors.vllm.cli`
    proc = procs.start(["bash", str(out / "launch.sh")], name="launch", log_path=work / "launch.log", cwd=out,
                       env={"PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 300
        body = json.dumps({"model": doc["commands"][0]["argv"][doc["commands"][0]["argv"].index("serve") + 1],
                           "prompt": "hello " * 20, "max_tokens": 4}).encode()
        while True:
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{router_port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=30) as r:
                    answer = json.loads(r.read())
                break
            except urllib.error.HTTPError as e:  # the server answered: a refusal is a failure, not a wait
                if e.code != 503:
                    pytest.fail(f"{e.code}: {e.read()[:500]!r}")
                time.sleep(2)
            except OSError:
                assert proc.poll() is None, proc.tail(60)
                assert time.monotonic() < deadline, proc.tail(60)
                time.sleep(2)
        assert answer["choices"][0]["text"] is not None
    finally:
        assert procs.stop(proc, term_timeout=30)


def test_calibrate_fits_the_model_to_the_real_measurements(study) -> None:
    """`advisor calibrate` on real CPU-vLLM levels: fitted parameters that `advisor tune` can load, and an
    in-sample error no worse than the defaults' in what the fit minimises, the RMS of log(predicted / measured)
    (held-out error is reported, not asserted: 4 trials). Not the pooled median over metrics: on 2 Dec every
    metric's median fell and the pooled one rose 0.71 → 0.95 (``calibrate.Errors``)."""
    work, url = study["work"], study["url"]
    r = advisor("calibrate", "real", "--storage", url, "--out", str(work / "cpu.json"), cwd=work)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "held out" in r.stdout and "calibrated" in r.stdout
    report = json.loads((work / "cpu.report.json").read_text())
    assert report["gpu"] == "CPU" and len(report["trials"]) >= 3 and report["fitted"]
    before, after = report["error_before"]["in_sample"], report["error_after"]["in_sample"]
    assert after["rms_log"] < before["rms_log"], (before, after)
    assert report["error_after"]["held_out"]["levels"] == report["error_before"]["in_sample"]["levels"]
    from executors.perf import PerfParams

    PerfParams.load(work / "cpu.json")  # what a job's executor.perf_params loads


def _server_logs(t: db.Trial) -> dict[str, str]:
    """The trial's vLLM server logs (not the router's), by process name."""
    paths = (t.resources or {}).get("log_paths") or {}
    return {n: Path(p).read_text(errors="replace") for n, p in paths.items() if n != "router"}


def test_every_server_routes_with_the_zipf_plugin(study) -> None:
    """Issue #18: the zipf strategy reached every server of every trial (mixed, prefill and decode): our plugin
    registered it in vLLM's engine processes and vLLM's routing simulator ran it on the CPU MoE layers."""
    done = [t for t in _trials(study["url"]) if t.state is TrialState.COMPLETE]
    assert done
    roles = set()
    for t in done:
        logs = _server_logs(t)
        assert logs, t.resources
        for name, text in logs.items():
            roles.add(name.split("-")[0])
            assert "deploy-advisor routing plugin: registered MoE routing strategy zipf_1.1" in text, (name, text[-3000:])
            assert "Simulating MoE routing using a zipf_1.1 strategy" in text, (name, text[-3000:])
    assert roles == {"mixed", "prefill", "decode"}, roles  # the aggregated servers and the P/D pair


def test_every_level_stores_the_routing_it_ran_with(study) -> None:
    done = [t for t in _trials(study["url"]) if t.state is TrialState.COMPLETE]
    levels = [m for t in done for m in t.measurements]
    assert levels and {m.expert_routing for m in levels} == {"zipf 1.1"}
    assert all((t.resources or {}).get("expert_routing") == "zipf 1.1" for t in done)
    every = sum(len(t.measurements) for t in _trials(study["url"]))  # failed trials' levels too
    r = advisor("trials", "real", "--storage", study["url"], cwd=study["work"])
    assert r.returncode == 0 and f"simulated routing: zipf 1.1 ({every} of {every} levels)" in r.stdout, (
        r.stdout + r.stderr)


def test_every_server_asks_for_amx_where_the_cpu_has_it(study) -> None:
    """executors/vllm/cpu_amx.py: on a CPU with AMX every vLLM process asks Linux for the permission before any
    kernel can use it (without it a P/D decode server died with SIGILL); on one without, nothing is asked."""
    from executors.vllm.cpu_amx import cpu_has_amx

    done = [t for t in _trials(study["url"]) if t.state is TrialState.COMPLETE]
    assert done
    for t in done:
        for name, text in _server_logs(t).items():
            asked = "deploy-advisor cpu plugin: AMX tile permission granted" in text
            assert asked == cpu_has_amx(), (name, cpu_has_amx(), text[-3000:])
