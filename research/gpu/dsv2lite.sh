#!/usr/bin/env bash
# Device side of the never-profiled-shape check (research/gpu/h100-dsv2lite.yaml) on one lent H100 or H200:
#   bash research/gpu/dsv2lite.sh profile-bg   advisor profile, detached (setsid), log /tmp/da-gpu/profile.log
#   bash research/gpu/dsv2lite.sh wait-predict-measure
#        follow the profile to its end; then the knee of vLLM's defaults at the full depth predicted from the stored
#        profile (and from the GPU kind's defaults) -> /tmp/da-gpu/predicted.json, printed; only then the real knee
#        search of the defaults, detached (advisor tune, log /tmp/da-gpu/tune.log)
#   bash research/gpu/dsv2lite.sh predict-measure   the same without a profile (DSV2_JOB=research/gpu/h200-dsv2lite.yaml)
#   bash research/gpu/dsv2lite.sh wait-pack    follow the tune to its end, then /tmp/da-gpu and the logs -> $OUT
# Each step stops following at HARD_S (default 540) seconds after its start, so a device call never hits its limit.
set -uo pipefail
source research/gpu/device_env.sh
G=research/gpu; J=${DSV2_JOB:-$G/h100-dsv2lite.yaml}; t0=$(date +%s); hard=${HARD_S:-540}
[ -n "${DA_GPU_KIND:-}" ] && sed -i "s/gpu: H[0-9]*$/gpu: $DA_GPU_KIND/; s/gpu: H[0-9]*,/gpu: $DA_GPU_KIND,/" "$J"
follow() {  # follow() PIDFILE LOG: until the process ends or HARD_S
  while kill -0 "$(cat "$1")" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "$hard" ]; do sleep 10; done
  tail -n 40 "$2"
  if kill -0 "$(cat "$1")" 2>/dev/null; then echo "=== still running after $hard s"; return 1; fi
}
pack() {
  cp /tmp/da-gpu/*.log /tmp/da-gpu/*.json "$OUT/" 2>/dev/null
  tar -C /tmp -cJf "$OUT/raw.tar.xz" da-gpu da-runs 2>/dev/null
  ls -la "$OUT"
}
case "$1" in
  profile-bg)
    echo "=== $(date -u +%H:%M:%S) profile start" | tee -a /tmp/da-gpu/steps.log
    setsid python3 -m advisor profile "$J" --out /tmp/da-gpu/profile-dsv2lite.json > /tmp/da-gpu/profile.log 2>&1 &
    echo $! > /tmp/da-gpu/profile.pid
    follow /tmp/da-gpu/profile.pid /tmp/da-gpu/profile.log; pack ;;
  wait-predict-measure|predict-measure)
    [ "$1" = predict-measure ] || follow /tmp/da-gpu/profile.pid /tmp/da-gpu/profile.log || { pack; exit 1; }
    echo "=== $(date -u +%H:%M:%S) predict" | tee -a /tmp/da-gpu/steps.log
    python3 $G/dsv2lite_predict.py "$J" /tmp/da-gpu/predicted.json || { pack; exit 1; }
    echo "=== $(date -u +%H:%M:%S) tune start" | tee -a /tmp/da-gpu/steps.log
    setsid python3 -m advisor tune "$J" > /tmp/da-gpu/tune.log 2>&1 &
    echo $! > /tmp/da-gpu/tune.pid
    follow /tmp/da-gpu/tune.pid /tmp/da-gpu/tune.log; pack ;;
  wait-pack)
    follow /tmp/da-gpu/tune.pid /tmp/da-gpu/tune.log; python3 -m advisor best "$J" > /tmp/da-gpu/best.log 2>&1; pack ;;
esac
