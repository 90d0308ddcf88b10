"""A profile or a study measured on this machine is stored under the job's ``cluster.gpu``: the local executor on the
GPU platform checks that kind against the cards ``nvidia-smi`` names, and a mismatch is one line and exit 2 before
anything is deployed or written (``executors.vllm.gpu_kind``). On 5 Dec a session whose jobs said H200 was lent an H100.

``nvidia-smi`` cannot run here (no GPU): a stand-in script on ``PATH`` answers as the real one does on an H100 and on
an H200 — the only fake in these tests, labelled as such."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import db
from advisor.errors import BadInput
from advisor.executor_factory import make_executor
from advisor.job import job_from_dict
from executors.vllm.gpu_kind import kind_of, local_gpu_names


@pytest.mark.parametrize(("name", "kind"), [
    ("NVIDIA H100 80GB HBM3", "H100"), ("NVIDIA H200", "H200"), ("NVIDIA B200", "B200"), ("NVIDIA GB200", "GB200"),
    ("NVIDIA GB300", "GB300"), ("NVIDIA A100-SXM4-80GB", None), ("NVIDIA H100 NVL", "H100"),
])
def test_a_cards_name_says_its_kind(name, kind):
    assert kind_of(name) == kind


def fake_smi(folder: Path, *names: str) -> dict[str, str]:
    """A stand-in ``nvidia-smi`` (labelled fake: no GPU here) printing ``names`` as ``--query-gpu=name`` does."""
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(f"echo '{n}'\n" for n in names))
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def gpu_job(tmp_path: Path, gpu: str) -> dict:
    return {"name": "kind", "model": {"preset": "qwen3-moe-235b"},
            "cluster": {"gpu": gpu, "nodes": 1, "gpus_per_node": 1},
            "slos": [{"metric": "p90_ttft_ms", "op": "<=", "value": 2000}],
            "executor": {"kind": "local", "platform": "gpu", "run_dir": str(tmp_path / "runs")},
            "storage": f"sqlite:///{tmp_path / 'results.db'}"}


def test_the_local_gpu_executor_refuses_a_job_of_another_kind(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_smi(tmp_path, "NVIDIA H100 80GB HBM3")["PATH"])
    assert local_gpu_names() == ["NVIDIA H100 80GB HBM3"]
    with pytest.raises(BadInput) as e:
        make_executor(job_from_dict(gpu_job(tmp_path, "H200")))
    msg = str(e.value)
    assert "\n" not in msg and "H200" in msg and "NVIDIA H100 80GB HBM3" in msg and "set cluster.gpu to H100" in msg
    with pytest.raises(BadInput, match="model.preset"):  # the kind it holds passes; the preset has no weights here
        make_executor(job_from_dict(gpu_job(tmp_path, "H100")))


def test_a_mixed_or_unknown_machine_is_refused_too(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_smi(tmp_path, "NVIDIA H200", "NVIDIA H100 80GB HBM3")["PATH"])
    with pytest.raises(BadInput, match="run it where the GPUs are H200s"):
        make_executor(job_from_dict(gpu_job(tmp_path, "H200")))


def test_advisor_profile_on_the_wrong_kind_is_one_line_exit_2_and_writes_nothing(tmp_path):
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(gpu_job(tmp_path, "H200")))
    env = {**os.environ, **fake_smi(tmp_path, "NVIDIA H100 80GB HBM3")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).resolve().parents[1]), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "advisor", "profile", "job.yaml"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "cluster.gpu" in lines[0] and "H100" in lines[0], r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    if (tmp_path / "results.db").exists():  # nothing stored
        database = db.connect(f"sqlite:///{tmp_path / 'results.db'}")
        try:
            assert database.profiles() == []
        finally:
            database.close()
