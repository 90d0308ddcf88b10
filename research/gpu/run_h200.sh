#!/usr/bin/env bash
# Device side of the real-GPU study: the project's own tuner (Ray executor, real vLLM, vllm bench serve) on the
# lent H200 machine, after ../shared/gpu's bundle is staged and installed (`bash .gpu/s/run.sh stage K install`).
#
#   bash research/gpu/run_h200.sh WALL_S JOB.yaml [JOB.yaml ...]     tune each job in turn, starting no trial after WALL_S
#                                                                       (counted from the start of this call)
#   bash research/gpu/run_h200.sh pack                                results DB + bench JSONs + logs → $OUT
#
# Re-running continues each study (same database on the warm machine), so one study may span several device
# calls of at most 10 minutes. The project's own Python dependencies that the device image lacks travel as
# wheels in .whl/ (optuna, SQLAlchemy, Alembic, Mako, colorlog, greenlet, Typer, Click).
set -uo pipefail
source research/gpu/device_env.sh
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
