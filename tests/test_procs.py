"""Process groups we own are stopped together, by id: TERM first, KILL for a group that ignores it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from executors.processes import procs
from executors.vllm.platform import cpu_platform, gpu_platform
from executors.vllm.serving import compile_cache_env, engine_start_env, vllm_cache_root

_IGNORE_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
_CHILD = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
         "print('up', flush=True); time.sleep(60)"


@pytest.fixture(autouse=True)
def _cache_beside_the_studies(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests read the default layout; the test run's shared cache folder (conftest) is set aside."""
    monkeypatch.delenv("DEPLOY_ADVISOR_CACHE_DIR", raising=False)


def _wait_up(p: procs.ManagedProcess) -> None:
    import time

    for _ in range(200):
        if "up" in p.tail(5).splitlines()[1:]:  # line 0 is the log's header, which quotes the command
            return
        time.sleep(0.05)
    raise AssertionError(f"{p.name} did not start")


def test_stop_all_stops_every_group_and_kills_what_ignores_term(tmp_path: Path) -> None:
    polite = procs.start([sys.executable, "-c", _CHILD], name="polite", log_path=tmp_path / "a.log")
    stubborn = procs.start([sys.executable, "-c", _IGNORE_TERM], name="stubborn", log_path=tmp_path / "b.log")
    for p in (polite, stubborn):
        _wait_up(p)
    members = procs.group_pids(polite.pgid)
    assert len(members) == 2  # the leader and its child: the whole group must go
    gone = procs.stop_all([polite, stubborn], term_timeout=1.0)
    assert gone == {"polite": True, "stubborn": True}
    assert stubborn.popen.returncode == -9  # it ignored TERM: KILLed after the timeout
    assert polite.popen.returncode == -15
    for pgid in (polite.pgid, stubborn.pgid):
        assert not procs.group_alive(pgid)


def test_vllm_cache_root_is_kept_per_slot_and_seeded_with_the_model_inspection(tmp_path: Path) -> None:
    first = vllm_cache_root(tmp_path, "mixed-0")
    (first / "modelinfos").mkdir()
    (first / "modelinfos" / "x.json").write_text("{}")
    assert vllm_cache_root(tmp_path, "mixed-0") == first  # the next trial's server reuses it
    second = vllm_cache_root(tmp_path, "decode-0")
    assert second != first and second.name == "decode-0"  # not per process: the next tuner run starts warm
    assert (second / "modelinfos" / "x.json").read_text() == "{}"
    keyed = vllm_cache_root(tmp_path, "mixed-0", "abc123")
    assert keyed.name == "abc123-mixed-0"


def test_a_new_studys_first_server_starts_with_the_inspection_its_profile_did(tmp_path: Path) -> None:
    """Another model folder (another cache key) in another study beside it: vLLM's model inspection is per model
    class and checked against the class's source hash, so the profile's servers' files serve the study's first
    server (on the H200 it spent 24 s inspecting again without them)."""
    profile = vllm_cache_root(tmp_path / "job-profile", "mixed-0", "L3key")
    (profile / "modelinfos").mkdir()
    (profile / "modelinfos" / "qwen3_moe.json").write_text('{"hash": "h"}')
    study = vllm_cache_root(tmp_path / "job", "mixed-0", "fullkey")
    assert study.name == "fullkey-mixed-0"
    assert (study / "modelinfos" / "qwen3_moe.json").read_text() == '{"hash": "h"}'


def test_every_deployment_of_every_study_shares_one_triton_cache(tmp_path: Path) -> None:
    """Issue 30: a trial that changes only its batch sizes gets a new vLLM compile hash (a new
    ``TORCHINDUCTOR_CACHE_DIR``), but the Triton kernels it compiles are found where the profile and earlier
    trials left them: torch's own lookup (``triton_cache_dir``) prefers ``TRITON_CACHE_DIR`` to the per-hash
    inductor folder vLLM sets."""
    import subprocess
    import sys

    profile = compile_cache_env(tmp_path / "job-profile", "mixed-0", "k")
    study = compile_cache_env(tmp_path / "job", "mixed-0", "k")
    assert profile["VLLM_CACHE_ROOT"] != study["VLLM_CACHE_ROOT"]  # compiled graphs stay per study and slot
    assert profile["TRITON_CACHE_DIR"] == study["TRITON_CACHE_DIR"] == str((tmp_path / "triton-cache").resolve())
    code = ("import os; from torch._inductor.runtime.cache_dir_utils import triton_cache_dir; "
            "print(triton_cache_dir(0))")
    per_hash = str(tmp_path / "job" / "hash-of-this-config" / "inductor_cache")
    seen = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, **study, "TORCHINDUCTOR_CACHE_DIR": per_hash}).stdout.strip()
    assert seen == study["TRITON_CACHE_DIR"]


def test_a_gpu_server_starts_its_engine_core_by_fork_unless_the_job_says(tmp_path: Path) -> None:
    """Issue 30: ``vllm serve`` picks ``spawn`` when the environment names no method, and the engine core then
    imports vLLM again (22 s of an H200 deploy). The local executor's servers on a GPU host name ``fork``; vLLM's
    own code (its CLI set-up, then the context it starts the engine core with) must read it so. A job's
    ``executor.env`` still wins; the CPU build keeps vLLM's choice."""
    import subprocess

    code = ("from vllm.entrypoints.serve.utils.api_utils import cli_env_setup; cli_env_setup(); "
            "from vllm.utils.system_utils import get_mp_context; print(get_mp_context().get_start_method())")

    def method(env: dict[str, str]) -> str:
        base = {k: v for k, v in os.environ.items() if k != "VLLM_WORKER_MULTIPROC_METHOD"}
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**base, **env, "VLLM_TARGET_DEVICE": "cpu"}, cwd=tmp_path).stdout.split()[-1]

    gpu = gpu_platform()
    assert method({}) == "spawn"  # what a plain `vllm serve` does
    assert method(engine_start_env(gpu)) == "fork"
    told = gpu.model_copy(update={"env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}})
    assert engine_start_env(told) == {}  # the job's own choice is left as it is
    assert engine_start_env(cpu_platform()) == {}


def test_vllm_cache_slot_held_by_another_process_is_not_shared(tmp_path: Path) -> None:
    """Two tuner workers at once never write one compile cache: the second takes the next free slot."""
    import subprocess
    import sys

    code = ("import sys, time; from pathlib import Path; from executors.vllm.serving import vllm_cache_root; "
            "print(vllm_cache_root(Path(sys.argv[1]), 'mixed-0', 'k'), flush=True); time.sleep(30)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).resolve().parents[1])
    try:
        held = Path(holder.stdout.readline().strip())
        assert held.name == "k-mixed-0"
        mine = vllm_cache_root(tmp_path, "mixed-0", "k")
        assert mine.name == "k-mixed-0-2"
    finally:
        holder.kill()
        holder.wait()


def test_group_whose_leader_died_is_found_by_its_mark_and_stopped(tmp_path: Path) -> None:
    """The engine processes of a server whose leader was KILLed live on in its group: only the mark finds them."""
    import signal

    log = tmp_path / "run" / "decode-0.log"
    p = procs.start(["bash", "-c", "sleep 300 & echo up; wait"], name="decode-0", log_path=log)
    _wait_up(p)
    stranger = procs.start(["bash", "-c", "sleep 300 & echo up; wait"], name="other", log_path=tmp_path / "x.log")
    try:
        _wait_up(stranger)
        (child,) = [q for q in procs.group_pids(p.pgid) if q != p.pid]
        os.kill(p.pid, signal.SIGKILL)
        p.popen.wait()
        assert procs.live_group_pids(p.pgid) == [child]  # the sleep lives on, its leader is gone

        by_log = procs.marked_processes([str(log.resolve())])
        by_dir = procs.marked_processes([], tmp_path / "run")
        assert [(m.pid, m.pgid) for m in by_log] == [(child, p.pgid)] == [(m.pid, m.pgid) for m in by_dir]
        assert not procs.marked_processes([], tmp_path / "ru")  # a prefix is a folder, not a string start

        assert procs.stop_strays(groups=[p.pgid], term_timeout=2.0) == set()
        assert procs.live_group_pids(p.pgid) == [] and not procs.pid_alive(child)
        assert procs.live_group_pids(stranger.pgid)  # an unmarked group is never touched
    finally:
        procs.stop_all([p, stranger], term_timeout=1.0)


def test_a_shared_cache_folder_serves_every_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``$DEPLOY_ADVISOR_CACHE_DIR``: studies in unrelated run folders share one slot per model and instance, its
    model inspection and its Triton kernels; without it each run folder keeps its own."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("DEPLOY_ADVISOR_CACHE_DIR", str(shared))
    one = compile_cache_env(tmp_path / "a" / "runs" / "study-1", "mixed-0", "k")
    (Path(one["VLLM_CACHE_ROOT"]) / "modelinfos").mkdir()
    (Path(one["VLLM_CACHE_ROOT"]) / "modelinfos" / "x.json").write_text("{}")
    other = compile_cache_env(tmp_path / "b" / "elsewhere" / "study-2", "mixed-0", "k")
    assert other == one and Path(one["VLLM_CACHE_ROOT"]).parent == shared / "vllm-cache"
    assert one["TRITON_CACHE_DIR"] == str((shared / "triton-cache").resolve())
    decode = vllm_cache_root(tmp_path / "c" / "study-3", "decode-0", "k")
    assert decode.parent == shared / "vllm-cache" and (decode / "modelinfos" / "x.json").exists()
    monkeypatch.delenv("DEPLOY_ADVISOR_CACHE_DIR")
    alone = compile_cache_env(tmp_path / "d" / "study-4", "mixed-0", "k")
    assert Path(alone["VLLM_CACHE_ROOT"]).parent == tmp_path / "d" / "study-4" / "vllm-cache"
    assert alone["TRITON_CACHE_DIR"] == str((tmp_path / "d" / "triton-cache").resolve())
