"""Two hosts for real: `advisor tune` on a two-node Ray cluster made of two network namespaces (tests/hosts.py),
the CPU build of vLLM on both, nothing mocked.

Two module-scoped studies on hosts A (Ray head, tuner) and B (Ray worker), each with one CPU "GPU" slot:
1. a first `advisor tune` is SIGKILLed while a data-parallel instance spans both hosts (head on one, a
   ``--headless`` rank on the other); the next `advisor tune` of the same study must stop what it left on both
   hosts (a Ray task on each recorded node), then finish the budget: the DP instance across the hosts;
2. with fixed ports (``executor.port_base``), a port held on host B fails a P/D trial for the environment
   (not the configuration); the tuner retries on a fresh placement, and the retry measures: prefill and
   decode on different hosts behind vllm-router, KV moving between them (its launch script is exported and
   run on both hosts too). One P/D deployment serves both checks: each costs a vLLM cold start per server;
3. a job whose cluster is bigger than the Ray cluster exits 2 with one line.

The tiny model's layers are all dense for this study (``make_tiny_moe(dense=True)``): MoE with data
parallelism dies on the CPU build (REFERENCE.md). KV moves through ExampleConnector's shared folder (the
hosts share a file system, as a cluster with a shared volume would): NixlConnector is GPU-only.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import db
from db import queries
from executors.processes import procs
from executors.vllm.tiny_model import make_tiny_moe
from search_spaces import Mode, TrialState
from tests import hosts as two_hosts

pytestmark = [pytest.mark.vllm, pytest.mark.ray, pytest.mark.multinode]
ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
SERVER_MARKS = ("vllm", "vllm_router", "executors.vllm.cli")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    why = two_hosts.available()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"two-host tests must run in CI: {why}")
        pytest.skip(why)
    root = tmp_path_factory.mktemp("hosts")
    h = two_hosts.TwoHosts(root).start(python=PY)
    try:
        yield h
        left = {host.name: _servers(host) for host in (h.a, h.b)}  # the tests' servers are gone: only Ray's remain
    finally:
        h.close()
    assert left == {h_: [] for h_ in left}, left


def _job(work: Path, model: Path, hosts: two_hosts.TwoHosts, **over: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": "twohost",
        "model": {"path": str(model)},
        "cluster": {"gpu": "CPU", "nodes": 2, "gpus_per_node": 1},
        "workload": {"dataset": "random", "isl": {"mean": 256, "range_ratio": 0.2},
                     "osl": {"mean": 32, "range_ratio": 0.5}, "load_levels": [2], "knee_search": False,
                     "prompts_per_concurrency": 4, "min_prompts": 8, "warmups_per_concurrency": 1},
        "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 60000}],
        "space": {"modes": ["aggregated", "disaggregated"],
                  "mixed": {"instances": [1], "dp_sizes": [2], "max_num_seqs": [8], "max_num_batched_tokens": [2048]},
                  "prefill": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [16],
                              "max_num_batched_tokens": [2048]},
                  "decode": {"instances": [1], "dp_sizes": [1], "max_num_seqs": [8],
                             "max_num_batched_tokens": [2048]}},
        "sampler": {"kind": "grid", "seed": 0},
        "baseline": {"enabled": False},
        "budget": {"trials": 2, "repeat_top": 0},
        # gloo must use the hosts' shared network, not whatever the hostname resolves to
        "executor": {"kind": "ray", "ray_address": hosts.ray_address, "run_dir": str(work / "runs"),
                     "env": {"GLOO_SOCKET_IFNAME": "eth0"}, "timeouts": {"health_s": 400},
                     "profile": "off"},  # these tests are about hosts; tests/test_profile_real.py profiles
    }
    for k, v in over.items():
        job[k] = {**job[k], **v} if isinstance(v, dict) and isinstance(job.get(k), dict) else v
    return job


def _tune(cluster: two_hosts.TwoHosts, job_file: Path, url: str, **kw: Any) -> subprocess.Popen[str]:
    """`advisor tune` on host A (a Ray driver must run on a node of its cluster), in a group of its own."""
    return subprocess.Popen(cluster.a.cmd(PY, "-u", "-m", "advisor", "tune", str(job_file), "--storage", url),
                            cwd=ROOT, env={**os.environ, "RAY_AUTH_MODE": "disabled"}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, **kw)


def _trials(url: str, study: str = "twohost") -> list[db.Trial]:
    database = db.connect(url)
    try:
        return [queries.get_trial(database, study, t.number) for t in queries.list_trials(database, study)]
    finally:
        database.close()


def _optuna_running(url: str, study: str) -> list[int]:
    import optuna

    s = optuna.load_study(study_name=study, storage=url)
    return [t.number for t in s.get_trials(states=(optuna.trial.TrialState.RUNNING,))]


def _servers(host: two_hosts.Host) -> list[str]:
    return [p for p in host.processes() if any(m in p for m in SERVER_MARKS) and "ray" not in p.split()[1]]


def _finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        raise AssertionError(f"advisor tune did not finish in {timeout:.0f} s:\n{out[-4000:]}") from None
    return out


@pytest.fixture(scope="module")
def study(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("twohost")
    model = make_tiny_moe(work / "tiny-dense", dense=True)
    url = f"sqlite:///{work / 'twohost.db'}"
    job_file = work / "job.yaml"
    # DP only: the cross-host P/D trial is the ports study's (one P/D cold start for both checks)
    job_file.write_text(json.dumps(_job(work, model, cluster, space={"modes": ["aggregated"]})))
    # 1. the first tuner dies (SIGKILL) while its DP instance runs on both hosts
    first = _tune(cluster, job_file, url)
    deadline = time.monotonic() + 600
    killed_with: dict[str, Any] = {}
    while time.monotonic() < deadline and first.poll() is None:
        try:  # the database file exists a moment before the tuner has created the study in it
            running = [t for t in _trials(url) if t.state is TrialState.RUNNING] if (work / "twohost.db").exists() else []
        except db.UnknownStudy:
            running = []
        procs_ = [p for t in running for p in (t.resources or {}).get("processes") or []]
        if len({p["node"] for p in procs_}) == 2 and _servers(cluster.a) and _servers(cluster.b):
            time.sleep(5)  # let the servers get going
            env_b = Path(f"/proc/{_servers(cluster.b)[0].split()[0]}/environ").read_bytes().split(b"\0")
            killed_with = {"trial": running[0].number, "processes": procs_, "env_b": env_b}
            os.kill(first.pid, signal.SIGKILL)
            break
        time.sleep(2)
    first_out = _finish(first, 60)
    assert killed_with, f"the first tuner never ran servers on both hosts:\n{first_out[-4000:]}"
    left_a, left_b = _servers(cluster.a), _servers(cluster.b)
    # 2. the same command again: cleans up on both hosts, then runs the budget
    t0 = time.monotonic()
    second = _tune(cluster, job_file, url)
    second_out = _finish(second, 1500)
    return {"work": work, "url": url, "killed": killed_with, "left": (left_a, left_b), "second": second,
            "second_out": second_out, "second_s": time.monotonic() - t0, "model": model}


def test_resume_after_sigkill_stops_every_group_on_both_hosts(study, cluster) -> None:
    assert study["left"][0] and study["left"][1], "SIGKILL of the tuner left servers on both hosts to clean up"
    assert study["second"].returncode == 0, study["second_out"][-4000:]
    trials = {t.number: t for t in _trials(study["url"])}
    killed = trials[study["killed"]["trial"]]
    assert killed.state is TrialState.INTERRUPTED, killed.state
    for p in study["killed"]["processes"]:  # one recorded as it started has no group id yet
        assert not (p.get("pgid") and procs.group_alive(p["pgid"])), f"{p['name']} on {p['node']} outlived the cleanup"
    nodes = {p["node"] for p in study["killed"]["processes"]}
    for ip in nodes:  # the cleanup reports, per node, what it stopped there
        assert f"node {ip}: stopped" in (killed.reason or ""), killed.reason
    assert _optuna_running(study["url"], "twohost") == []


def test_executor_env_reaches_the_servers_on_host_b(study) -> None:
    assert b"GLOO_SOCKET_IFNAME=eth0" in study["killed"]["env_b"]  # executor.env, on the worker node too
    assert b"VLLM_HOST_IP=10.77.77.2" in study["killed"]["env_b"]  # its own node's address


def test_data_parallel_instance_across_two_hosts(study) -> None:
    done = [t for t in _trials(study["url"]) if t.state is TrialState.COMPLETE]
    dp = [t for t in done if t.config.mode is Mode.AGGREGATED]
    assert dp, [(t.number, t.state, t.reason) for t in _trials(study["url"])]
    t = dp[0]
    assert t.config.decode.data_parallel_size == 2
    ips = {p["node"] for p in t.resources["processes"] if p["name"].startswith("mixed-0")}
    assert ips == {"10.77.77.1", "10.77.77.2"}, t.resources["processes"]
    m = t.measurements[0]
    assert m.source == "measured" and m.completed > 0 and m.throughput_per_gpu > 0 and m.error_rate == 0
    headless = Path(t.resources["log_paths"]["mixed-0-node1"]).read_text(errors="replace")
    assert "headless mode" in headless  # the rank on the other host ran as vLLM's headless DP rank


def test_prefill_and_decode_on_different_hosts_move_kv(ports_study) -> None:
    url, name = ports_study["url"], ports_study["name"]
    done = [t for t in _trials(url, name) if t.state is TrialState.COMPLETE]
    pd = [t for t in done if t.config.mode is Mode.DISAGGREGATED]
    assert pd, [(t.number, t.state, t.reason) for t in _trials(url, name)]
    t = pd[0]
    where = {p["name"]: p["node"] for p in t.resources["processes"]}
    assert where["prefill-0-node0"] != where["decode-0-node0"], where
    m = t.measurements[0]
    assert m.completed > 0 and (m.kv_transfer_tokens or 0) > 0, m  # decode's tokens received by KV transfer


def test_nothing_left_on_either_host(study, cluster) -> None:
    assert _servers(cluster.a) == [] and _servers(cluster.b) == []
    assert _optuna_running(study["url"], "twohost") == []


def test_cluster_bigger_than_ray_exits_2_with_one_line(cluster, tmp_path) -> None:
    work = tmp_path
    job = _job(work, make_tiny_moe(work / "tiny-dense", dense=True), cluster, name="toobig", cluster={"nodes": 3})
    (work / "toobig.yaml").write_text(json.dumps(job))
    url = f"sqlite:///{work / 'toobig.db'}"
    p = _tune(cluster, work / "toobig.yaml", url)
    out = _finish(p, 300)
    assert p.returncode == 2, out
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "cluster" in lines[0] and "3 node" in lines[0], out
    assert "10.77.77.1" in lines[0] and "10.77.77.2" in lines[0]
    assert "Traceback" not in out


def _hold(host: two_hosts.Host, ports: list[int]) -> subprocess.Popen[str]:
    code = ("import socket, sys, time\n"
            "s = [socket.socket() for _ in sys.argv[2:]]\n"
            "[x.bind((sys.argv[1], int(p))) or x.listen() for x, p in zip(s, sys.argv[2:])]\n"
            "print('holding', flush=True)\ntime.sleep(3600)\n")
    p = subprocess.Popen(host.cmd(PY, "-c", code, host.ip, *map(str, ports)), stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "holding"
    return p


@pytest.fixture(scope="module")
def ports_study(study, cluster) -> dict[str, Any]:
    """A P/D study with fixed ports, run once the main study is done (nothing of it holds a port): its one trial
    finds a port taken on host B, is retried, and measures — the module's cross-host P/D trial."""
    work = study["work"]
    job = _job(work, study["model"], cluster, name="ports", space={"modes": ["disaggregated"]},
               budget={"trials": 1})
    job["executor"] = {**job["executor"], "port_base": 8100}
    (work / "ports.yaml").write_text(json.dumps(job))
    url = f"sqlite:///{work / 'ports.db'}"
    holder = _hold(cluster.b, [8100, 8101])  # whichever instance lands on host B finds its port taken
    released = False
    try:
        p = _tune(cluster, work / "ports.yaml", url)
        assert p.stdout is not None
        seen: list[str] = []
        for line in p.stdout:
            seen.append(line)
            if "environment" in line and not released:  # the tuner says so as it happens; then free the port
                os.killpg(holder.pid, signal.SIGKILL)
                holder.wait()
                released = True
        p.wait(timeout=60)
        out = "".join(seen)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
            holder.wait()
    return {"url": url, "name": "ports", "out": out, "released": released, "proc": p}


def test_port_taken_on_host_b_is_an_environment_failure_and_the_retry_measures(ports_study) -> None:
    url, out, released, p = ports_study["url"], ports_study["out"], ports_study["released"], ports_study["proc"]
    assert released, out[-4000:]
    assert p.returncode == 0, out[-4000:]
    assert "10.77.77.2" in out and "taken" in out, out[-4000:]
    (t,) = _trials(url, "ports")
    assert t.state is TrialState.COMPLETE, (t.state, t.reason)
    assert t.measurements and t.measurements[0].completed > 0
    assert _optuna_running(url, "ports") == []


def test_port_helper_sees_a_held_port(cluster) -> None:
    """The check the executor runs on a node: a port held there is not bindable there."""
    holder = _hold(cluster.b, [8199])
    try:
        with socket.socket() as s:  # from the root namespace the address is not even local: bind fails
            with pytest.raises(OSError):
                s.bind((cluster.b.ip, 8199))
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()


def _in(host: two_hosts.Host, code: str, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(host.cmd(PY, "-c", code, *args), capture_output=True, text=True, timeout=timeout)


_GET = ("import sys, urllib.request\n"
        "try:\n    r = urllib.request.urlopen(sys.argv[1], timeout=10); print(r.status); print(r.read().decode())\n"
        "except Exception as e:\n    print(0); print(e)\n")


def test_exported_launch_script_runs_pd_across_the_two_hosts(study, ports_study, cluster, tmp_path) -> None:
    """The exported launch.sh of the cross-host P/D trial, run as an operator would: `bash launch.sh 1` on host
    B, `bash launch.sh 0` on host A (which starts the router once both servers answer). A request through the
    router is served, and decode's prompt tokens received by KV transfer grow."""
    url, name = ports_study["url"], ports_study["name"]
    pd = [t for t in _trials(url, name) if t.state is TrialState.COMPLETE and t.config.mode is Mode.DISAGGREGATED]
    assert pd
    out = tmp_path / "export"
    r = subprocess.run([PY, "-m", "advisor", "export", name, "--trial", str(pd[0].number), "--out", str(out),
                        "--model", str(study["model"]), "--storage", url], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    script = out / "launch.sh"
    env = {**os.environ, "NODE0_IP": cluster.a.ip, "NODE1_IP": cluster.b.ip}
    groups = []
    try:
        for host, node in ((cluster.b, "1"), (cluster.a, "0")):
            p = subprocess.Popen(host.cmd("bash", str(script), node), cwd=out, env=env, start_new_session=True,
                                 stdout=open(out / f"node{node}.out", "w"), stderr=subprocess.STDOUT)
            groups.append(p)
        deadline = time.monotonic() + 400
        while True:
            g = _in(cluster.a, _GET, "http://127.0.0.1:8000/v1/models")
            if g.stdout.startswith("200"):
                break
            dead = [p for p in groups if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, (
                (out / "node0.out").read_text()[-2000:] + "\n".join(
                    f.read_text(errors="replace")[-3000:] for f in out.glob("*.log")))
            time.sleep(3)
        router = (out / "node0.out").read_text() + "".join(f.read_text(errors="replace") for f in out.glob("*.log"))
        assert f"http://{cluster.b.ip}:8101" in router and "${NODE1_IP}" not in router  # the address was expanded
        prompt = json.dumps([100 + (i * 37) % 1800 for i in range(300)])  # 300 token ids: 2 whole KV blocks of 128
        post = ("import json, sys, urllib.request\n"
                "req = urllib.request.Request('http://127.0.0.1:8000/v1/completions', method='POST',"
                " headers={'Content-Type': 'application/json'}, data=json.dumps({'model': sys.argv[1],"
                " 'prompt': json.loads(sys.argv[2]), 'max_tokens': 8}).encode())\n"
                "print(json.loads(urllib.request.urlopen(req, timeout=120).read())['usage']['completion_tokens'])\n")
        model_id = json.loads(g.stdout.split("\n", 1)[1])["data"][0]["id"]  # the export serves the model's name
        served = _in(cluster.a, post, model_id, prompt, timeout=200)
        assert served.returncode == 0 and int(served.stdout.split()[-1]) > 0, served.stderr[-2000:]
        metrics = _in(cluster.a, _GET, f"http://{cluster.b.ip}:8101/metrics").stdout
        kv = [ln for ln in metrics.splitlines()
              if ln.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in ln]
        assert kv and float(kv[0].split()[-1]) > 0, kv
    finally:  # each script's whole process group: its servers, their engines, the router
        for p in groups:
            procs.stop_group(p.pid, 30)
            p.wait()
    assert _servers(cluster.a) == [] and _servers(cluster.b) == []
