#!/usr/bin/env bash
# The tests, in two passes (the README's test command; .ci/run calls it once PostgreSQL is up):
#
#   bash scripts/test.sh [pytest arguments ...]
#
# 1. Tests that start nothing heavy (no marker of REAL below), two at a time with pytest-xdist, a test file per
#    worker (--dist loadfile: a module's fixture is computed once). They are CPU-bound Python: two workers on the
#    2-core CI machine take 489 s where one takes 838 s.
# 2. Tests that start real vLLM servers, Ray clusters, network-namespace hosts, PostgreSQL or Chromium, one at a
#    time: their SLOs are taken from the machine's own speed minutes earlier (tests/test_knee_real.py), which a
#    second worker beside them would change.
#
# Only tests/ (pyproject's testpaths): research/tests re-derive past GPU runs and run apart
# (.venv/bin/python -m pytest research/tests; research/README.md).
#
# Each test runs in exactly one pass (the second pass selects REAL, the first its complement). Arguments go to
# both passes (test files, -k, -x; not -m). Exits with the first pass's non-zero status, else the second's.
# pytest's 5 (no tests collected) is a failure: without arguments in either pass, with them only if both
# passes collected nothing (a file of one kind selects nothing in the other pass).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Every marker in pyproject.toml's [tool.pytest.ini_options] markers (tests/test_test_passes.py holds them equal).
REAL="vllm or ray or multinode or postgres or browser or gpu"
WORKERS="${DEPLOY_ADVISOR_TEST_WORKERS:-2}"

# Ctrl-C or SIGTERM (.ci/run's teardown signals our process group): pytest tears its fixtures down and exits
# with its own status, which bash would take as a pass ending; the trap keeps the second pass from starting.
stopped=0
trap 'stopped=130' INT
trap 'stopped=143' TERM

rc1=0 rc2=0
echo "== pass 1 of 2: tests that start no server, $WORKERS at a time"
.venv/bin/python -m pytest -q --durations=30 -n "$WORKERS" --dist loadfile -m "not ($REAL)" "$@" || rc1=$?
if ((stopped)); then echo "scripts/test.sh: stopped by a signal during pass 1"; exit "$stopped"; fi
echo "== pass 2 of 2: tests that start real servers, one at a time"
.venv/bin/python -m pytest -q --durations=30 -m "$REAL" "$@" || rc2=$?
if ((stopped)); then echo "scripts/test.sh: stopped by a signal during pass 2"; exit "$stopped"; fi
if [[ $rc1 == 5 && $rc2 == 5 ]]; then
    echo "scripts/test.sh: no tests collected (exit 5)"; exit 5
elif (($# > 0)); then   # a selection: one pass may rightly hold none of it
    [[ $rc1 == 5 ]] && rc1=0
    [[ $rc2 == 5 ]] && rc2=0
fi
[[ $rc1 == 5 ]] && echo "scripts/test.sh: pass 1 collected no tests (exit 5)"
[[ $rc2 == 5 ]] && echo "scripts/test.sh: pass 2 collected no tests (exit 5)"
if [[ $rc1 != 0 ]]; then exit "$rc1"; fi
exit "$rc2"
