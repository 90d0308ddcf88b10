#!/usr/bin/env bash
# Device side of the real-GPU study: the project's own tuner (Ray executor, real vLLM, vllm bench serve) on the
# lent H200 machine, after ../shared/gpu's bundle is staged and installed (`bash .gpu/s/run.sh stage K install`).
#
#   bash benchmarks/gpu/run_h200.sh WALL_S JOB.yaml [JOB.yaml ...]     tune each job in turn, starting no trial after WALL_S
#                                                                       (counted from the start of this call)
#   bash benchmarks/gpu/run_h200.sh pack                                results DB + bench JSONs + logs → $OUT
#
# Re-running continues each study (same database on the warm machine), so one study may span several device
# calls of at most 10 minutes. The project's own Python dependencies that the device image lacks travel as
# wheels in .whl/ (optuna, SQLAlchemy, Alembic, Mako, colorlog, greenlet, Typer, Click).
set -uo pipefail
source .gpu/s/run.sh env
export PYTHONPATH="$PWD:$PYTHONPATH"  # Ray's workers import executors.* from the checkout
# FlashInfer's sampler JIT-compiles for ~100 s on a fresh machine (../shared/gpu/README.md); the PyTorch
# sampler serves these small models as well and keeps every trial's start-up comparable.
export VLLM_USE_FLASHINFER_SAMPLER=0
if [ ! -e /tmp/site/optuna ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | grep -v WARN | tail -3
fi
# scipy (advisor.calibrate's least_squares, which the guided sampler's refits call) is in the device image per
# KINDS.md; .whl2/ (scipy 1.16.3, carried on the install call when wanted) is only a fallback for an image without it.
if ls .whl2/*.whl >/dev/null 2>&1 && ! python3 -c 'import scipy.optimize' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl \
    2>&1 | grep -v WARN | tail -3
fi
mkdir -p /tmp/da-gpu
if [ "${1:-}" = pack ]; then
  cd /tmp && tar czf "$OUT/h200-results.tgz" da-gpu $(cd /tmp && find da-runs -name '*.json' -o -name '*.log' | grep -v '/kv/')
  ls -la "$OUT"; exit 0
fi
wall=$1; shift
# WALL counts from this script's start (or from $DA_T0) over all the jobs given (one job: the same as before). HARD_S (default
# 570) is where a job still running gets SIGTERM — the tuner tears its deployment down and records the trial —
# so the device call's 600 s limit never kills vLLM halfway with the GPUs still held.
t0=${DA_T0:-$(date +%s)}; hard=${HARD_S:-570}  # DA_T0: the device call's start (epoch s), when the call did more first
for job in "$@"; do
  left=$(( wall - ($(date +%s) - t0) )); stop=$(( hard - ($(date +%s) - t0) ))
  if [ "$left" -lt 1 ] || [ "$stop" -lt 30 ]; then echo "=== $job: skipped (wall time of $wall s reached)"; continue; fi
  echo "=== $job ($(date -u +%H:%M:%S), $left s left to start a trial)"
  timeout -k 30 "$stop" python3 -m advisor tune "$job" --wall-time "$left" 2>&1 | grep -v -E "^\s*$|━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ [0-9]+/[0-9]+ [0-9:]+ *$"
done
for s in $(python3 -m advisor studies --storage sqlite:////tmp/da-gpu/results.db --format csv 2>/dev/null | tail -n +2 | cut -d, -f1); do python3 -m advisor trials "$s" --storage sqlite:////tmp/da-gpu/results.db --format csv; done
