#!/usr/bin/env bash
# Device side of issue 29's H200 run: hardware profiles of three model shapes, then the profiled model held to
# real levels it never saw (a real study of the ~30B model, a DeepSeek-V3-width stack at another depth).
#
#   bash research/gpu/profile_h200.sh STEP [STEP ...]
#     profile-30b | profile-dsv3 | profile-qwen3   advisor profile JOB --out /tmp/da-gpu/profile-NAME.json
#     predict-30b    profile_check.py predict: knees and fixed levels from the profile, before any measurement
#     study-30b      advisor tune on the generated study job (continues where the last call stopped)
#     compare-30b    profile_check.py compare: the study's levels against the predictions
#     study          advisor tune h200-study-30b.yaml (issue 30's study; profiles first when none is stored; continues
#                    where the last call stopped), then advisor best
#     heldout        profile_check.py heldout: every level of that study against the profile, and each trial's phases
#     stack-dsv3     profile_check.py stack: the DeepSeek-V3 shape at 3 layers, predicted then measured
#     pack           /tmp/da-gpu (with deploy_phases.{md,json}) and every bench JSON and log -> $OUT/raw.tar.xz.NN
#                    (parts: cat them)
#   Issue 30's study across device calls (a detached session lives on between calls of one warm machine, so no
#   trial is cut at a call's limit):
#     carried-db     start from .gpu/db/results.db (an earlier session's database: its stored profile) when
#                    /tmp/da-gpu holds none
#     study-bg       advisor tune $G/h200-study-30b.yaml as study $STUDY (default h200-study-30b-r2), detached
#                    (setsid: its own session and process group), --wall-time $WALL_S (default 1300: the run
#                    ends by then, within one level; give the seconds until the last call's pack), then
#                    advisor best; output in /tmp/da-gpu/study.log
#     wait           follow study.log until the study ends or HARD_S; a copy of the database, the log and every
#                    deployment's phases -> $OUT
#     stop           SIGTERM to the study's process group (the tuner keeps the measured levels and tears down),
#                    KILL after 90 s
#     heldout-bg     profile_check.py heldout of $STUDY
#     profiles-bg    issue 29's wide shapes, detached like study-bg (follow with wait, end with stop): the
#                    DeepSeek-V3-width profile, its stack check at depth 3 (c = 64 first: its warm-up meets the
#                    larger batch shapes' just-in-time kernels), then the Qwen3-235B-width profile
#     check-qwen3-bg the DeepSeek-V3-width stack check at depth 3 (c = 64, 32, 16, 8; predicted as sent, with the
#                    as-sent refit of the stored profile's clean probes as a further column), then the
#                    Qwen3-235B-width profile; detached like study-bg
#     issue29-bg     the Qwen3-235B-width profile, the DeepSeek-V3-width stack check at depth 3 (c = 32, 16, 8; H200
#                    only), then the Qwen3-235B-width stack at a depth the profile did not measure, predicted as sent
#                    from the profile just stored; detached like study-bg (DSV3_FIRST=1: the DeepSeek-V3-width check
#                    first)
#     qwen3-bg       the Qwen3-235B-width profile alone, detached like study-bg (follow with wait, end with stop)
#     importtime-bg  python -X importtime of what vllm serve imports before its first line, in the background
#                    (/tmp/da-gpu/importtime.log; it runs beside the study's first deploy, so its seconds are
#                    an upper bound: what the server standby hides)
#
# A step still running at HARD_S (default 560) seconds after $DA_T0 (the call's start; default: this script's)
# gets SIGTERM, so the device call's 600 s limit never kills vLLM with the GPU still held.
set -uo pipefail
source research/gpu/device_env.sh
t0=${DA_T0:-$(date +%s)}; hard=${HARD_S:-560}
G=research/gpu
run() {  # run "$@" until HARD_S, its output to stdout and /tmp/da-gpu/steps.log
  local stop=$(( hard - ($(date +%s) - t0) ))
  if [ "$stop" -lt 30 ]; then echo "=== skipped (less than 30 s left): $*"; return 1; fi
  echo "=== $(date -u +%H:%M:%S) ($stop s left): $*" | tee -a /tmp/da-gpu/steps.log
  timeout -k 20 "$stop" "$@" 2>&1 | grep -v -E "━━━━━━━━━━━━" | tee -a /tmp/da-gpu/steps.log
}
STUDY=${STUDY:-h200-study-30b-r2}
snapshot() {  # what has been measured so far, brought back even if the machine is taken back before the next call
  python3 -c "import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d)" \
    /tmp/da-gpu/results.db "$OUT/results.db"
  cp /tmp/da-gpu/study.log "$OUT/" 2>/dev/null
  python3 benchmarks/deploy_phases.py /tmp/da-runs --out "$OUT/deploy_phases.json" > "$OUT/deploy_phases.md" 2>&1
  ls -la "$OUT"
}
detach() {  # run the commands in a session of their own (they live on between calls of one warm machine); the
  # session leader writes its own id (its process group's: `stop` signals it); output straight to the log (no pipe
  # that a signal could break while they tear down)
  rm -f /tmp/da-gpu/study.pgid
  setsid bash -c "echo \$\$ > /tmp/da-gpu/study.pgid; $1; echo '=== study done'" >> /tmp/da-gpu/study.log 2>&1 < /dev/null &
  for _ in $(seq 50); do [ -s /tmp/da-gpu/study.pgid ] && break; sleep 0.1; done
  echo "detached: process group $(cat /tmp/da-gpu/study.pgid)"
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
          # xz, in parts of 15 MiB: a study's per-request bench JSONs pass the 16 MiB a returned file may hold
          (cd /tmp && tar cf - da-gpu $(find da-runs -name '*.json' -o -name '*.log' 2>/dev/null \
             | grep -v -E '/kv/|profile-models/[^m]|check-models|triton-cache|vllm-cache') | xz -T0 -6 \
             | split -b 15M -d - "$OUT/raw.tar.xz.")
          ls -la "$OUT" ;;
    carried-db) [ -e /tmp/da-gpu/results.db ] || cp .gpu/db/results.db /tmp/da-gpu/results.db
                python3 -m advisor studies --storage sqlite:////tmp/da-gpu/results.db ;;
    study-bg) detach "python3 -m advisor tune $G/h200-study-30b.yaml --study $STUDY --wall-time ${WALL_S:-1300}; \
                      python3 -m advisor best $STUDY --storage sqlite:////tmp/da-gpu/results.db" ;;
    profiles-bg) detach "python3 -m advisor profile $G/h200-profile-dsv3.yaml --out /tmp/da-gpu/profile-dsv3.json; \
                         python3 $G/profile_check.py stack $G/h200-profile-dsv3.yaml --depth 3 --loads 64,8 \
                           --out /tmp/da-gpu/check-dsv3-L3.json; \
                         python3 -m advisor profile $G/h200-profile-qwen3-235b.yaml --out /tmp/da-gpu/profile-qwen3-235b.json" ;;
    wait) pg=$(cat /tmp/da-gpu/study.pgid); seen=0
          show() { local n; n=$(wc -l < /tmp/da-gpu/study.log)
                   [ "$n" -gt "$seen" ] && sed -n "$((seen + 1)),${n}p" /tmp/da-gpu/study.log | grep -v -E "━━━━━━━━━━━━"
                   seen=$n; }
          while kill -0 -- "-$pg" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt $(( hard - 15 )) ]; do show; sleep 5; done
          show
          kill -0 -- "-$pg" 2>/dev/null && echo "=== study still running" || echo "=== study process group ended"
          snapshot ;;
    stop) pg=$(cat /tmp/da-gpu/study.pgid)
          kill -TERM -- "-$pg" 2>/dev/null; for _ in $(seq 90); do kill -0 -- "-$pg" 2>/dev/null || break; sleep 1; done
          kill -0 -- "-$pg" 2>/dev/null && { echo "=== KILL after 90 s"; kill -KILL -- "-$pg"; }
          tail -20 /tmp/da-gpu/study.log | grep -v -E "━━━━━━━━━━━━"
          nvidia-smi --query-gpu=memory.used --format=csv
          run python3 -m advisor best $STUDY --storage sqlite:////tmp/da-gpu/results.db
          snapshot ;;
    check-qwen3-bg) # issue 29's two open GPU items, detached like study-bg: the DeepSeek-V3-width stack at depth 3
                    # predicted (as sent: the stored profile, the defaults and the as-sent refits of its clean probes,
                    # without and with the API server's per-prompt-token term)
                    # before it is deployed, then measured at four loads (c = 64 first, as in profiles-bg); then the
                    # Qwen3-235B-width profile
                    detach "python3 $G/profile_check.py stack $G/h200-profile-dsv3.yaml --depth 3 --loads 64,32,16,8 --as-sent \
                              --params asfit=research/results/h200-profile-dsv3/call6-8-4dec/refit-as-sent-no-pauses.json \
                              --params asfront=research/results/h200-profile-dsv3/call6-8-4dec/refit-as-sent-no-pauses-front.json \
                              --out /tmp/da-gpu/check-dsv3-L3-r2.json; \
                            python3 -m advisor profile $G/h200-profile-qwen3-235b.yaml --out /tmp/da-gpu/profile-qwen3-235b.json" ;;
    issue29-bg) # 6 Dec, issue 29's GPU items in one detached session: the Qwen3-235B-width profile (its plan's
                # step-filling prefill levels, fitted as sent); the DeepSeek-V3-width stack at depth 3 on an H200
                # (c = 32, 16, 8: c = 64 paused on JIT compiles both times it ran), predicted as sent before it is
                # deployed by the stored profile, the defaults and the as-sent refit of its clean probes with the API
                # server's term (5 Dec; refitted at today's code on 6 Dec: the same numbers); then the
                # Qwen3-235B-width stack at a depth the profile did not measure (H200 6, H100 3), predicted as sent by
                # the profile just stored, then measured
                q=$G/h200-profile-qwen3-235b.yaml; r=research/results/h200-profile-dsv3/call6-8-4dec
                qd=6; dsv3="python3 $G/profile_check.py stack $G/h200-profile-dsv3.yaml --depth 3 --loads 32,16,8 --as-sent \
                            --params asfront=$r/refit-as-sent-no-pauses-front.json \
                            --out /tmp/da-gpu/check-dsv3-L3-r3.json;"
                [ "${DA_GPU_KIND:-H200}" = H200 ] || { qd=3; dsv3="echo '=== DeepSeek-V3-width check skipped: not an H200';"; }
                # (6 Dec it ran in this order on an H100: the DeepSeek-V3-width check was skipped. Where an H200
                # comes, DSV3_FIRST=1 runs that check first: it is the one issue 29 still lacks on an H200.)
                if [ "${DSV3_FIRST:-0}" = 1 ]; then first="$dsv3"; dsv3=""; else first=""; fi
                detach "$first python3 -m advisor profile $q --out /tmp/da-gpu/profile-qwen3-235b.json; $dsv3 \
                        python3 $G/profile_check.py stack $q --depth $qd --loads 32,12,4 --as-sent \
                          --out /tmp/da-gpu/check-qwen3-L$qd.json" ;;
    qwen3-bg) detach "python3 -m advisor profile $G/h200-profile-qwen3-235b.yaml --out /tmp/da-gpu/profile-qwen3-235b.json" ;;
    importtime-bg) (t=$(date +%s.%N); python3 -X importtime -c "import vllm.entrypoints.cli.main, vllm.entrypoints.openai.api_server" \
                     2> /tmp/da-gpu/importtime.log; echo "# wall $(python3 -c "import time,sys; print(round(time.time()-float(sys.argv[1]),1))" $t) s" \
                     >> /tmp/da-gpu/importtime.log) < /dev/null > /dev/null 2>&1 & ;;
    heldout-bg) run python3 $G/profile_check.py heldout $G/h200-study-30b.yaml --study $STUDY --out /tmp/da-gpu/heldout-$STUDY.json ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
