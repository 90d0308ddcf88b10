#!/usr/bin/env bash
# Device side of issue 29's H200 run: hardware profiles of three model shapes, then the profiled model held to
# real levels it never saw (a real study of the ~30B model, a DeepSeek-V3-width stack at another depth).
#
#   bash benchmarks/gpu/profile_h200.sh STEP [STEP ...]
#     profile-30b | profile-dsv3 | profile-qwen3   advisor profile JOB --out /tmp/da-gpu/profile-NAME.json
#     predict-30b    profile_check.py predict: knees and fixed levels from the profile, before any measurement
#     study-30b      advisor tune on the generated study job (continues where the last call stopped)
#     compare-30b    profile_check.py compare: the study's levels against the predictions
#     study          advisor tune h200-study-30b.yaml (issue 30's study; profiles first when none is stored; continues
#                    where the last call stopped), then advisor best
#     heldout        profile_check.py heldout: every level of that study against the profile, and each trial's phases
#     stack-dsv3     profile_check.py stack: the DeepSeek-V3 shape at 3 layers, predicted then measured
#     pack           /tmp/da-gpu (with deploy_phases.{md,json}) and every bench JSON and log -> $OUT/h200-profile.tgz
#
# A step still running at HARD_S (default 560) seconds after $DA_T0 (the call's start; default: this script's)
# gets SIGTERM, so the device call's 600 s limit never kills vLLM with the GPU still held.
set -uo pipefail
source benchmarks/gpu/device_env.sh
t0=${DA_T0:-$(date +%s)}; hard=${HARD_S:-560}
G=benchmarks/gpu
run() {  # run "$@" until HARD_S, its output to stdout and /tmp/da-gpu/steps.log
  local stop=$(( hard - ($(date +%s) - t0) ))
  if [ "$stop" -lt 30 ]; then echo "=== skipped (less than 30 s left): $*"; return 1; fi
  echo "=== $(date -u +%H:%M:%S) ($stop s left): $*" | tee -a /tmp/da-gpu/steps.log
  timeout -k 20 "$stop" "$@" 2>&1 | grep -v -E "━━━━━━━━━━━━" | tee -a /tmp/da-gpu/steps.log
}
for step in "$@"; do
  case "$step" in
    profile-30b) run python3 -m advisor profile $G/h200-profile-30b.yaml --out /tmp/da-gpu/profile-30b.json ;;
    profile-dsv3) run python3 -m advisor profile $G/h200-profile-dsv3.yaml --out /tmp/da-gpu/profile-dsv3.json ;;
    profile-qwen3) run python3 -m advisor profile $G/h200-profile-qwen3-235b.yaml --out /tmp/da-gpu/profile-qwen3-235b.json ;;
    predict-30b) run python3 $G/profile_check.py predict $G/h200-profile-30b-study.yaml --configs 1024x8192,128x4096 \
                   --out /tmp/da-gpu/predicted-30b.json --write-job $G/h200-profile-30b-study.gen.yaml ;;
    study-30b) run python3 -m advisor tune $G/h200-profile-30b-study.gen.yaml --wall-time $(( hard - 300 - ($(date +%s) - t0) )) ;;
    compare-30b) run python3 $G/profile_check.py compare $G/h200-profile-30b-study.gen.yaml /tmp/da-gpu/predicted-30b.json \
                   --out /tmp/da-gpu/check-30b.json ;;
    study) run python3 -m advisor tune $G/h200-study-30b.yaml --wall-time $(( hard - 240 - ($(date +%s) - t0) ))
           run python3 -m advisor best h200-study-30b --storage sqlite:////tmp/da-gpu/results.db ;;
    heldout) run python3 $G/profile_check.py heldout $G/h200-study-30b.yaml --out /tmp/da-gpu/heldout-30b.json ;;
    stack-dsv3) run python3 $G/profile_check.py stack $G/h200-profile-dsv3.yaml --depth 3 --loads 8,64 \
                  --out /tmp/da-gpu/check-dsv3-L3.json ;;
    pack) cp $G/h200-profile-30b-study.gen.yaml /tmp/da-gpu/ 2>/dev/null
          python3 benchmarks/deploy_phases.py /tmp/da-runs --out /tmp/da-gpu/deploy_phases.json > /tmp/da-gpu/deploy_phases.md
          (cd /tmp && tar czf "$OUT/h200-profile.tgz" da-gpu $(find da-runs -name '*.json' -o -name '*.log' 2>/dev/null | grep -v -E '/kv/|profile-models|check-models|triton-cache|vllm-cache'))
          ls -la "$OUT" ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
