#!/usr/bin/env bash
# Device side of the real-GPU study: the project's own tuner (Ray executor, real vLLM, vllm bench serve) on the
# lent H200 machine, after ../shared/gpu's bundle is staged and installed (`bash .gpu/s/run.sh stage K install`).
#
#   bash benchmarks/gpu/run_h200.sh WALL_S JOB.yaml [JOB.yaml ...]     tune each job, starting no trial after WALL_S
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
mkdir -p /tmp/da-gpu
if [ "${1:-}" = pack ]; then
  cd /tmp && tar czf "$OUT/h200-results.tgz" da-gpu $(cd /tmp && find da-runs -name '*.json' -o -name '*.log' | grep -v '/kv/')
  ls -la "$OUT"; exit 0
fi
wall=$1; shift
for job in "$@"; do
  echo "=== $job ($(date -u +%H:%M:%S))"
  python3 -m advisor tune "$job" --wall-time "$wall" 2>&1 | grep -v -E "^\s*$|━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━━ [0-9]+/[0-9]+ [0-9:]+ *$"
done
for s in $(python3 -m advisor studies --storage sqlite:////tmp/da-gpu/results.db --format csv 2>/dev/null | tail -n +2 | cut -d, -f1); do python3 -m advisor trials "$s" --storage sqlite:////tmp/da-gpu/results.db --format csv; done
